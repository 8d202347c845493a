-- Revert pgjobs:lean_jobs from pg
BEGIN;
ALTER TABLE pgjobs.jobs ADD CONSTRAINT jobs_batch_id_fkey
    FOREIGN KEY (batch_id) REFERENCES pgjobs.batches (id) ON DELETE CASCADE;
COMMIT;
