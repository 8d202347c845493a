-- Revert pgjobs:lean_jobs from pg
BEGIN;
ALTER INDEX pgjobs.jobs_group_idx RESET (deduplicate_items);
ALTER INDEX pgjobs.jobs_pending_idx RESET (deduplicate_items);
ALTER TABLE pgjobs.jobs ADD CONSTRAINT jobs_batch_id_fkey
    FOREIGN KEY (batch_id) REFERENCES pgjobs.batches (id) ON DELETE CASCADE;
COMMIT;
