-- Deploy pgjobs:fair_cursor_stamps to pg
-- requires: fair_groups job_history
-- Serving a group stamps its cursor (group_cursors.served_seq: rule 3 of sql/fairness.sql). served_seq is
-- indexed, so every stamp is a new version with a new entry in every index of the table, and the entry
-- in the primary key ran its uniqueness check: a visit to every earlier version of the group's cursor.
-- While a foreign snapshot is held none of those versions can be removed, so a claim of 20 groups read
-- ~200 heap pages of group_cursors per group after 20,000 jobs (4,125 of a claim's 8,592 blocks; the
-- fair soak fell from 9,800 to 680 jobs/s within 120 s of a held snapshot). Here the key is no longer
-- unique in the index a stamp writes: lookups by group take (queue, group_key, served_seq), which a stamp
-- enters at a new place without checking anything, and one cursor per group is kept by what every path
-- that creates a cursor does first: fair_groups' primary key (one row per group with a cursor, never
-- updated: sql/fairness.sql, _discover_fresh). Until this release's functions are installed (pgjobs
-- migrate installs them right after) the previous ones register groups with ON CONFLICT DO NOTHING on
-- group_cursors itself; the unique index on never-served cursors (served_seq = 0, the value a new
-- cursor has) is their arbiter, and a stamp (served_seq > 0) never enters it.
BEGIN;
CREATE UNIQUE INDEX group_cursors_new_key ON pgjobs.group_cursors (queue, group_key) WHERE served_seq = 0;
CREATE INDEX group_cursors_key_idx ON pgjobs.group_cursors (queue, group_key, served_seq)
    WITH (deduplicate_items = off);
ALTER TABLE pgjobs.group_cursors DROP CONSTRAINT group_cursors_pkey;
COMMIT;
