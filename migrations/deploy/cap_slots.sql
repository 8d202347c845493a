-- Deploy pgjobs:cap_slots to pg
-- requires: rate_windows
-- The active ledger and its checkpoints in two slots emptied by TRUNCATE (../../sql/caps.sql): a checkpoint
-- that finds rows in the slot the writers left copies forward what no newest checkpoint has summed, and the
-- newest checkpoint of each queue, then truncates it. Space comes back whatever snapshot is held; the
-- range deletes, which a snapshot holding back xmin stopped (the ledger grew while it was held), go.
-- A row's slot is its transaction's window of 4,096 xids, mod 2, set by the column's default: the writers'
-- INSERTs, the previous release's included, need no change.
-- In place under load: the tables are a few thousand rows, copied under the locks below; the columns keep
-- their order and `slot` comes last, so a call of the previous release that reads a checkpoint into its row
-- type, or inserts one with `cut` and `prev`, runs unchanged until the new functions are installed.
BEGIN;
-- Writers of jobs lock jobs before the ledger (its trigger inserts after their update), and claims read the
-- checkpoints before the ledger: the same order here.
LOCK TABLE pgjobs.jobs, pgjobs.cap_checkpoints, pgjobs.cap_ledger IN ACCESS EXCLUSIVE MODE;

ALTER TABLE pgjobs.cap_ledger RENAME TO cap_ledger_unslotted;
ALTER TABLE pgjobs.cap_checkpoints RENAME TO cap_checkpoints_unslotted;
ALTER INDEX pgjobs.cap_ledger_moves RENAME TO cap_ledger_unslotted_moves;

CREATE TABLE pgjobs.cap_ledger (
    queue     text NOT NULL,
    xid       xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    n         integer NOT NULL,
    group_key text,
    slot      smallint NOT NULL
              DEFAULT ((pg_catalog.pg_current_xact_id()::text::bigint OPERATOR(pg_catalog./) 4096)
                       OPERATOR(pg_catalog.%) 2)::smallint
) PARTITION BY LIST (slot);
CREATE TABLE pgjobs.cap_ledger_0 PARTITION OF pgjobs.cap_ledger FOR VALUES IN (0);
CREATE TABLE pgjobs.cap_ledger_1 PARTITION OF pgjobs.cap_ledger FOR VALUES IN (1);
CREATE INDEX cap_ledger_moves ON ONLY pgjobs.cap_ledger (queue, xid) INCLUDE (n, group_key);
CREATE INDEX cap_ledger_0_moves ON pgjobs.cap_ledger_0 (queue, xid) INCLUDE (n, group_key);
CREATE INDEX cap_ledger_1_moves ON pgjobs.cap_ledger_1 (queue, xid) INCLUDE (n, group_key);
ALTER INDEX pgjobs.cap_ledger_moves ATTACH PARTITION pgjobs.cap_ledger_0_moves;
ALTER INDEX pgjobs.cap_ledger_moves ATTACH PARTITION pgjobs.cap_ledger_1_moves;

-- cut and prev are no longer read: kept (cut with a default) for the previous release's checkpoint writes.
CREATE TABLE pgjobs.cap_checkpoints (
    queue  text NOT NULL,
    seq    bigint NOT NULL,
    snap   pg_catalog.pg_snapshot NOT NULL,
    own    xid8,
    active integer NOT NULL,
    cut    xid8 NOT NULL DEFAULT '0',
    prev   bigint,
    groups jsonb NOT NULL DEFAULT '{}',
    slot   smallint NOT NULL
           DEFAULT ((pg_catalog.pg_current_xact_id()::text::bigint OPERATOR(pg_catalog./) 4096)
                    OPERATOR(pg_catalog.%) 2)::smallint
) PARTITION BY LIST (slot);
CREATE TABLE pgjobs.cap_checkpoints_0 PARTITION OF pgjobs.cap_checkpoints FOR VALUES IN (0);
CREATE TABLE pgjobs.cap_checkpoints_1 PARTITION OF pgjobs.cap_checkpoints FOR VALUES IN (1);
CREATE INDEX cap_checkpoints_newest ON ONLY pgjobs.cap_checkpoints (queue, seq);
CREATE INDEX cap_checkpoints_0_newest ON pgjobs.cap_checkpoints_0 (queue, seq);
CREATE INDEX cap_checkpoints_1_newest ON pgjobs.cap_checkpoints_1 (queue, seq);
ALTER INDEX pgjobs.cap_checkpoints_newest ATTACH PARTITION pgjobs.cap_checkpoints_0_newest;
ALTER INDEX pgjobs.cap_checkpoints_newest ATTACH PARTITION pgjobs.cap_checkpoints_1_newest;

-- Every ledger row, in its transaction's slot; the newest checkpoint of each queue (the only one read).
INSERT INTO pgjobs.cap_ledger (queue, xid, n, group_key, slot)
SELECT l.queue, l.xid, l.n, l.group_key, ((l.xid::text::bigint / 4096) % 2)::smallint
  FROM pgjobs.cap_ledger_unslotted AS l;
INSERT INTO pgjobs.cap_checkpoints (queue, seq, snap, own, active, cut, prev, groups)
SELECT DISTINCT ON (c.queue) c.queue, c.seq, c.snap, c.own, c.active, c.cut, c.prev, c.groups
  FROM pgjobs.cap_checkpoints_unslotted AS c
 ORDER BY c.queue, c.seq DESC;
-- _cap_seed returns a checkpoint: it is bound to the old table's row type, so it is made again on the new
-- one, with the body of ../../sql/caps.sql (the install that follows replaces it in place; on a new
-- database it is made here before the install). A call already running keeps its body; a later call finds
-- the new function by name.
DROP FUNCTION IF EXISTS pgjobs._cap_seed(text);
DROP TABLE pgjobs.cap_ledger_unslotted, pgjobs.cap_checkpoints_unslotted;


CREATE OR REPLACE FUNCTION pgjobs._cap_seed(queue text)
RETURNS pgjobs.cap_checkpoints
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_c cap_checkpoints;
BEGIN
    WITH act AS (
        SELECT j.group_key, count(*)::int AS n FROM jobs AS j
         WHERE j.state = 'active' AND j.queue = _cap_seed.queue GROUP BY j.group_key
    ), mine AS (
        SELECT l.group_key, -l.n AS n FROM cap_ledger AS l
         WHERE l.queue = _cap_seed.queue AND l.xid = pg_current_xact_id_if_assigned()
    )
    SELECT queue, nextval('pgjobs.cap_checkpoints_seq'), pg_current_snapshot(), pg_current_xact_id_if_assigned(),
           (SELECT coalesce(sum(a.n), 0) FROM act AS a) + (SELECT coalesce(sum(m.n), 0) FROM mine AS m),
           '0'::xid8, NULL,
           _cap_sum_groups('{}', ARRAY(SELECT a.group_key FROM act AS a UNION ALL SELECT m.group_key FROM mine AS m),
                           ARRAY(SELECT a.n FROM act AS a UNION ALL SELECT m.n FROM mine AS m))
      INTO v_c;
    INSERT INTO cap_checkpoints (queue, seq, snap, own, active, groups)
    VALUES (v_c.queue, v_c.seq, v_c.snap, v_c.own, v_c.active, v_c.groups);
    -- What the caller reads is the count with this transaction's rows in.
    SELECT v_c.active - coalesce(sum(m.n), 0)::int,
           _cap_sum_groups(v_c.groups, array_agg(m.group_key), array_agg(-m.n))
      INTO v_c.active, v_c.groups
      FROM (SELECT l.group_key, -l.n AS n FROM cap_ledger AS l
             WHERE l.queue = _cap_seed.queue AND l.xid = pg_current_xact_id_if_assigned()) AS m;
    RETURN v_c;
END;
$$;
COMMIT;
