-- Verify pgjobs:lean_jobs on pg
BEGIN;
SELECT 1 / (count(*) = 0)::int FROM pg_constraint
 WHERE conrelid = 'pgjobs.jobs'::regclass AND conname = 'jobs_batch_id_fkey';
SELECT 1 / count(*) FROM pg_constraint
 WHERE conrelid = 'pgjobs.jobs'::regclass AND conname = 'jobs_valid' AND contype = 'c';
SELECT 1 / (count(*) = 0)::int FROM pg_indexes WHERE schemaname = 'pgjobs' AND indexname = 'jobs_leased_by_idx';
SELECT 1 / count(*) FROM pg_class
 WHERE oid = 'pgjobs.jobs_pending_idx'::regclass AND 'deduplicate_items=off' = ANY (reloptions);
ROLLBACK;
