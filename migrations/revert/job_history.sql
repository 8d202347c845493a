-- Revert pgjobs:job_history from pg
-- Back to one plain pgjobs.jobs: jobs_live (the original table) is detached, takes the history rows back
-- and its name; the unique index, the foreign keys and the queues table without retention come back.
BEGIN;
LOCK TABLE pgjobs.jobs IN ACCESS EXCLUSIVE MODE;
ALTER TABLE pgjobs.jobs DETACH PARTITION pgjobs.jobs_live;
INSERT INTO pgjobs.jobs_live SELECT * FROM pgjobs.jobs;
DROP TABLE pgjobs.jobs;
ALTER TABLE pgjobs.jobs_live RENAME TO jobs;
DROP FUNCTION IF EXISTS pgjobs._release_key() CASCADE;

-- Rows whose job is gone (deleted since, without the cascade) cannot be kept under the foreign keys.
DELETE FROM pgjobs.edges AS e
 WHERE NOT EXISTS (SELECT 1 FROM pgjobs.jobs AS j WHERE j.id OPERATOR(pg_catalog.=) e.child_id)
    OR (e.parent_job_id IS NOT NULL
        AND NOT EXISTS (SELECT 1 FROM pgjobs.jobs AS j WHERE j.id OPERATOR(pg_catalog.=) e.parent_job_id));
DELETE FROM pgjobs.continuation_holds AS h
 WHERE NOT EXISTS (SELECT 1 FROM pgjobs.jobs AS j WHERE j.id OPERATOR(pg_catalog.=) h.job_id)
    OR NOT EXISTS (SELECT 1 FROM pgjobs.jobs AS j WHERE j.id OPERATOR(pg_catalog.=) h.sibling_id);
ALTER TABLE pgjobs.edges
    ADD CONSTRAINT edges_child_id_fkey FOREIGN KEY (child_id) REFERENCES pgjobs.jobs (id) ON DELETE CASCADE,
    ADD CONSTRAINT edges_parent_job_id_fkey FOREIGN KEY (parent_job_id) REFERENCES pgjobs.jobs (id) ON DELETE CASCADE;
ALTER TABLE pgjobs.continuation_holds
    ADD CONSTRAINT continuation_holds_job_id_fkey FOREIGN KEY (job_id) REFERENCES pgjobs.jobs (id) ON DELETE CASCADE,
    ADD CONSTRAINT continuation_holds_sibling_id_fkey FOREIGN KEY (sibling_id) REFERENCES pgjobs.jobs (id)
        ON DELETE CASCADE;
CREATE UNIQUE INDEX jobs_unique_key_idx ON pgjobs.jobs (kind, unique_key)
    WHERE unique_key IS NOT NULL
      AND (NOT unique_live_only OR state OPERATOR(pg_catalog.=) ANY ('{waiting,scheduled,pending,active}'));
DROP TABLE pgjobs.job_keys, pgjobs.history_partitions, pgjobs.history_settings;

-- queues without retention, rebuilt (a dropped column would leave a gap in the column numbers, and the
-- schema would differ from one that never had it). configure_queue returns its row type, so it goes too:
-- the installed functions are for the newer schema anyway, and clearing the revision makes the next
-- migrate install them again.
CREATE TABLE pgjobs.queues_v (LIKE pgjobs.queues INCLUDING DEFAULTS);
ALTER TABLE pgjobs.queues_v DROP COLUMN retention;
INSERT INTO pgjobs.queues_v SELECT queue, max_length, paused, fair, noisy_share, noisy_min_active, max_active_per_group,
                                   max_active, status_events, updated_at FROM pgjobs.queues;
DROP TABLE pgjobs.queues CASCADE;
ALTER TABLE pgjobs.queues_v RENAME TO queues;
ALTER TABLE pgjobs.queues
    ADD PRIMARY KEY (queue),
    ADD CONSTRAINT queues_status_events CHECK (status_events IN ('all', 'terminal', 'none')),
    ADD CONSTRAINT queues_limits CHECK (coalesce(max_length, 1) > 0 AND coalesce(max_active, 1) > 0
                                        AND coalesce(max_active_per_group, 1) > 0 AND noisy_min_active >= 0
                                        AND noisy_share > 0 AND noisy_share <= 1);
DELETE FROM pgjobs.sql_revision;
COMMIT;
