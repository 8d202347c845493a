-- Verify pgjobs:lean_jobs on pg
BEGIN;
SELECT 1 / (count(*) = 0)::int FROM pg_constraint
 WHERE conrelid = 'pgjobs.jobs'::regclass AND conname = 'jobs_batch_id_fkey';
ROLLBACK;
