-- Deploy pgjobs:fairness to pg
-- requires: schema
-- What fair selection and the concurrency caps in claim (sql/fairness.sql) need beyond the base schema.
BEGIN;

-- A group's work that is not claimable yet (pending work is in jobs_group_idx, active work is read
-- from jobs_active_idx): "does this group still have live work?" before its cursor is dropped.
-- Partial on group_key and on these two states, so neither ungrouped jobs (every plain queue's usual
-- case) nor the claim and completion of any job ever touch it.
CREATE INDEX jobs_group_later_idx ON pgjobs.jobs (queue, group_key)
    WHERE group_key IS NOT NULL AND state OPERATOR(pg_catalog.=) ANY ('{waiting,scheduled}');

-- The round-robin order: least recently served first. A group served gets the next value of
-- served_seq_seq (0 = never served), so walking this index is walking the ring.
CREATE INDEX group_cursors_seq_idx ON pgjobs.group_cursors (queue, served_seq, group_key);
CREATE SEQUENCE pgjobs.served_seq_seq AS bigint;

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

-- Every serve rewrites a cursor and leaves dead index entries behind: vacuum it early and often.
ALTER TABLE pgjobs.group_cursors SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
                                      autovacuum_vacuum_cost_delay = 0);
-- A cursor's versions share its key: deduplicated into one posting list, they could not be marked dead
-- by the lookups that pass them while the live version is in the same list, and every lookup of a busy
-- group would visit all of them until VACUUM. One index tuple per version lets the first lookup kill them.
ALTER INDEX pgjobs.group_cursors_pkey SET (deduplicate_items = off);

COMMIT;
