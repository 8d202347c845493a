-- Deploy pgjobs:fair_ring to pg
-- requires: active_ledger
-- Fair queues and per-group caps on the plain claim's model (../../sql/fair.sql, ../../docs/design/claim.md
-- "Fair queues as built"): the active ledger counts per group as well, a fair queue's ring of groups is an
-- insert-only row per claim in two slots emptied by TRUNCATE, and groups may carry a weight. What the earlier
-- fair claim kept (cursors, groups, per-queue state, shared counts, gates, epochs) goes.
-- In place under load: the new columns have no default that rewrites a row (cap_checkpoints is a few rows),
-- the new tables start empty, and the tables dropped are read only by the previous release's fair claim,
-- whose running calls the DROPs wait for.
BEGIN;
-- Writers of jobs take their lock on jobs before the ledger's (its trigger inserts after their update): the
-- change takes jobs first too, so it waits for them instead of deadlocking with one (it drops an index of
-- jobs_live below). Readers wait for the change's few statements.
LOCK TABLE pgjobs.jobs IN ACCESS EXCLUSIVE MODE;
ALTER TABLE pgjobs.cap_ledger ADD COLUMN group_key text;
CREATE INDEX cap_ledger_moves ON pgjobs.cap_ledger (queue, xid) INCLUDE (n, group_key);
DROP INDEX pgjobs.cap_ledger_xid;
ALTER TABLE pgjobs.cap_checkpoints ADD COLUMN groups jsonb NOT NULL DEFAULT '{}';
-- A queue's checkpoints counted no groups until now: fair queues get a first one by a count.
DELETE FROM pgjobs.cap_checkpoints AS c
 USING pgjobs.queues AS q
 WHERE q.queue = c.queue AND (q.fair OR q.max_active_per_group IS NOT NULL);

-- One row per fair claim (the newest per queue by one backward descent): the snapshot it read with, its
-- transaction, the ring's virtual time and serve count, the scheduled and lease starts, and per group with
-- pending work its virtual time, last serve (count and time) and head floor (priority, run_at, id).
CREATE TABLE pgjobs.fair_rings (
    slot     smallint NOT NULL,
    seq      bigint NOT NULL,
    queue    text NOT NULL,
    snap     pg_catalog.pg_snapshot NOT NULL,
    own      xid8 NOT NULL,
    vt       float8 NOT NULL,
    served   bigint NOT NULL,
    sched    timestamptz,
    lease    timestamptz,
    g        text[] NOT NULL,
    g_vt     float8[] NOT NULL,
    g_served bigint[] NOT NULL,
    g_at     timestamptz[] NOT NULL,
    g_p      smallint[] NOT NULL,
    g_t      timestamptz[] NOT NULL,
    g_i      bigint[] NOT NULL
) PARTITION BY LIST (slot);
CREATE TABLE pgjobs.fair_rings_0 PARTITION OF pgjobs.fair_rings FOR VALUES IN (0);
CREATE TABLE pgjobs.fair_rings_1 PARTITION OF pgjobs.fair_rings FOR VALUES IN (1);
CREATE INDEX fair_rings_newest ON pgjobs.fair_rings (queue, seq);
CREATE SEQUENCE pgjobs.fair_rings_seq AS bigint;
-- A group as a fair claim holds it while it picks: the ring's fields, its weight and active jobs, and how far
-- this claim has read its pending jobs.
CREATE TYPE pgjobs.fair_group AS (
    g      text,
    vt     float8,
    served bigint,
    at     timestamptz,
    p      smallint,
    t      timestamptz,
    i      bigint,
    w      real,
    active int,
    state  text,        -- 'new' (not read by this claim), 'read', 'dry' (none of the kinds now), 'gone' (none)
    lp     smallint,    -- the last job this claim locked: the next read starts after it
    lt     timestamptz,
    li     bigint
);

-- configure_group(queue, group_key, weight): a group's share of a fair queue (weight 1 when absent).
CREATE TABLE pgjobs.fair_weights (
    queue     text NOT NULL,
    group_key text NOT NULL,
    weight    real NOT NULL CHECK (weight > 0 AND weight <= 1000),
    PRIMARY KEY (queue, group_key)
);

DROP TABLE pgjobs.group_cursors, pgjobs.fair_groups, pgjobs.fair_queues, pgjobs.fair_counts CASCADE;
DROP SEQUENCE pgjobs.claim_floor_epoch, pgjobs.served_seq_seq, pgjobs.fair_gate_a, pgjobs.fair_gate_u,
              pgjobs.fair_gate_s, pgjobs.fair_gate_f, pgjobs.fair_cursor_epoch CASCADE;
DROP INDEX pgjobs.jobs_group_later_idx;
UPDATE pgjobs.sql_revision SET digest = 'stale: pgjobs:fair_ring deployed';
COMMIT;
