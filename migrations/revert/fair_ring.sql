-- Revert pgjobs:fair_ring from pg
BEGIN;
LOCK TABLE pgjobs.jobs IN ACCESS EXCLUSIVE MODE;  -- (as the deploy does, and for the same reason)
-- (CASCADE: the functions of sql/fair.sql that name these types go with them; the installed revision of sql/
-- is marked stale, so the next migrate installs every function again.)
DROP TABLE pgjobs.fair_rings, pgjobs.fair_weights CASCADE;
DROP SEQUENCE pgjobs.fair_rings_seq;
DROP TYPE pgjobs.fair_group CASCADE;
CREATE INDEX cap_ledger_xid ON pgjobs.cap_ledger (queue, xid) INCLUDE (n);
DROP INDEX pgjobs.cap_ledger_moves;
ALTER TABLE pgjobs.cap_ledger DROP COLUMN group_key;
ALTER TABLE pgjobs.cap_checkpoints DROP COLUMN groups;
-- The earlier fair claim's state, as the change claim created it.
-- The claim floor's signal (claim.sql, "Scan floors"): a claimer session keeps, in its own settings,
-- where its last claim found the first live row of each queue, and starts its next index scan there
-- instead of at the front of jobs_pending_idx, where a held snapshot keeps every claimed job's dead entry.
-- Any statement that makes a row claimable with a key that may sort below such a floor (an old run_at, a
-- lease moved into the past) draws a value from this sequence; a claimer that sees it moved scans from
-- the front again.
CREATE SEQUENCE pgjobs.claim_floor_epoch AS bigint;

-- A group's work that is not claimable yet (pending work is in jobs_group_idx, active work is read from
-- jobs_active_idx): "does this group still have live work?" before its cursor is dropped. Partial on
-- group_key and on these two states, so neither ungrouped jobs (every plain queue's usual case) nor the
-- claim and completion of any job ever touch it.
CREATE INDEX jobs_group_later_idx ON pgjobs.jobs_live (queue, group_key)
    WHERE group_key IS NOT NULL AND state OPERATOR(pg_catalog.=) ANY ('{waiting,scheduled}');

-- A fair queue's groups in round-robin order: one cursor a group with work, least recently served first.
-- Serving a group stamps its cursor with the next value of served_seq_seq (0 = never served), so walking
-- group_cursors_seq_idx is walking the ring. A stamp is a new version of the row with a new entry in every
-- index, so no index of the table is unique on the group alone: a unique entry would check every earlier
-- version of the cursor, none of which a held snapshot lets go. Lookups by group take group_cursors_key_idx
-- (queue, group_key, served_seq), which a stamp enters at a new place without checking anything, with
-- deduplication off: one index tuple per version lets the first lookup that passes a dead one mark it.
-- One cursor per group is kept by fair_groups' primary key, which every path that creates a cursor
-- passes first (fairness.sql, _discover_fresh); group_cursors_new_key holds the never-served cursors only
-- (served_seq = 0, which a stamp leaves), the arbiter of their inserts' ON CONFLICT.
-- The floor_* columns are a group's head floor (fairness.sql, "Head floors"): where the group's pending
-- work began when a claim last served it, and until when and under which claim epoch that place may be
-- trusted, so that every session starts its head probe where the last claim of the group left it. The
-- stamp rewrites the row on every serve anyway, so the floor costs no version of its own; the columns
-- stay NULL while no floor is in use (no held snapshot).
-- Every serve rewrites a cursor and leaves dead index entries behind: vacuumed early and often.
CREATE TABLE pgjobs.group_cursors (
    queue          text NOT NULL,
    group_key      text NOT NULL,
    last_served_at timestamptz NOT NULL DEFAULT '-infinity',
    served_seq     bigint NOT NULL DEFAULT 0,
    floor_priority smallint,
    floor_run_at   timestamptz,
    floor_id       bigint,
    floor_until    timestamptz,
    floor_epoch    bigint
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);
CREATE INDEX group_cursors_seq_idx ON pgjobs.group_cursors (queue, served_seq, group_key);
CREATE UNIQUE INDEX group_cursors_new_key ON pgjobs.group_cursors (queue, group_key) WHERE served_seq = 0;
CREATE INDEX group_cursors_key_idx ON pgjobs.group_cursors (queue, group_key, served_seq)
    WITH (deduplicate_items = off);
CREATE SEQUENCE pgjobs.served_seq_seq AS bigint;

-- Which groups of a fair queue have a cursor, in rows never updated (fairness.sql, "Under a held
-- snapshot"): one row per group, inserted with its cursor and deleted with it, so "has this group a
-- cursor?" is one index probe however long a snapshot is held.
CREATE TABLE pgjobs.fair_groups (
    queue     text NOT NULL,
    group_key text NOT NULL,
    PRIMARY KEY (queue, group_key)
);

-- Per fair queue: the ungrouped jobs' place in the ring (they take turns as one pseudo-group); where
-- the ring's live part starts (every served cursor has served_seq >= ring_from, so a claim skips the
-- index entries that updates left behind below it); where the incremental discovery of new groups
-- (a skip scan over jobs_group_idx) resumes; whether jobs were inserted since the previous claim.
CREATE TABLE pgjobs.fair_queues (
    queue               text PRIMARY KEY,
    ungrouped_seq       bigint NOT NULL DEFAULT 0,
    ungrouped_served_at timestamptz NOT NULL DEFAULT '-infinity',
    ungrouped_empty     boolean NOT NULL DEFAULT false,  -- the last look found no ungrouped work
    ring_from           bigint NOT NULL DEFAULT 1,
    discover_after      text,
    discover_found      boolean NOT NULL DEFAULT false,  -- this round of the sweep found new groups
    discover_productive boolean NOT NULL DEFAULT true,   -- the last complete round did
    seen_max_id         bigint NOT NULL DEFAULT 0,   -- the highest job id at the previous claim
    quiet_claims        int NOT NULL DEFAULT 0,      -- claims since one saw a new job
    updated_at          timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50);   -- rewritten by most fair claims: room for HOT updates

-- Shared counts of a fair queue's active jobs (fairness.sql, "Shared gates"). Under a held snapshot a
-- count passes the dead entry of every job claimed since; a session whose count proved costly writes it
-- here, and every session whose own count is older reads the newest (one index descent). Insert-only: a
-- row is never updated, so a held snapshot leaves no version chain behind the newest row (the dead rows
-- lie to the left of it in the index); the writer deletes rows older than five minutes, and VACUUM takes
-- them once no snapshot needs them.
CREATE TABLE pgjobs.fair_counts (
    queue      text NOT NULL,
    counted_at timestamptz NOT NULL,
    payload    jsonb NOT NULL   -- [active jobs, the most active jobs of one group, group keys, their counts]
);
CREATE INDEX fair_counts_newest ON pgjobs.fair_counts (queue, counted_at);

-- Shared gates for the reads a fair claim skips for a while under a held snapshot (fairness.sql, "Shared
-- gates"): the count of a queue's active jobs (a), the look for ungrouped work (u), the discovery sweep
-- (s) and the checks before a dry group's cursor is dropped (f). A session whose read proved costly
-- stores in the read's sequence until when, and for which queue, the next such read may wait; every
-- session's claims read it, so one session pays each read per period, not every session.
CREATE SEQUENCE pgjobs.fair_gate_a AS bigint;
CREATE SEQUENCE pgjobs.fair_gate_u AS bigint;
CREATE SEQUENCE pgjobs.fair_gate_s AS bigint;
CREATE SEQUENCE pgjobs.fair_gate_f AS bigint;

-- Moved by every claim that creates a never-served group cursor (fairness.sql, _fair_unserved): a fair
-- claim whose last look for never-served cursors found none skips the next look while it has not moved.
CREATE SEQUENCE pgjobs.fair_cursor_epoch AS bigint;
-- The ledger's trigger as the change active_ledger made it (one row a statement and capped queue), so that
-- writes of jobs go on until the functions are installed again.
CREATE OR REPLACE FUNCTION pgjobs._cap_moved()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        INSERT INTO cap_ledger (queue, n)
        SELECT d.queue, d.n
          FROM (SELECT m.queue, sum(m.n)::int AS n
                  FROM (SELECT o.queue, -1 AS n FROM old_jobs AS o WHERE o.state = 'active'
                        UNION ALL
                        SELECT w.queue, 1 FROM new_jobs AS w WHERE w.state = 'active') AS m
                 GROUP BY m.queue) AS d
          JOIN queues AS c ON c.queue = d.queue AND c.max_active IS NOT NULL
         WHERE d.n <> 0;
    ELSE
        INSERT INTO cap_ledger (queue, n)
        SELECT d.queue, d.n
          FROM (SELECT o.queue, -count(*)::int AS n FROM old_jobs AS o WHERE o.state = 'active'
                 GROUP BY o.queue) AS d
          JOIN queues AS c ON c.queue = d.queue AND c.max_active IS NOT NULL;
    END IF;
    RETURN NULL;
END;
$$;
UPDATE pgjobs.sql_revision SET digest = 'stale: pgjobs:fair_ring reverted';
COMMIT;
