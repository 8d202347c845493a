-- Verify pgjobs:job_history on pg
BEGIN;
SELECT 1 / (relkind = 'p')::int FROM pg_class WHERE oid = 'pgjobs.jobs'::regclass;
SELECT 1 / (count(*) = 3)::int FROM pg_inherits WHERE inhparent = 'pgjobs.jobs'::regclass;
SELECT kind, unique_key, job_id FROM pgjobs.job_keys WHERE false;
SELECT name, tree, lower, upper, created_at, checked_at, next_check_at FROM pgjobs.history_partitions WHERE false;
SELECT 1 / count(*) FROM pgjobs.history_settings;
SELECT retention FROM pgjobs.queues WHERE false;
SELECT 1 / (count(*) = 0)::int FROM pg_constraint
 WHERE contype = 'f' AND confrelid = 'pgjobs.jobs_live'::regclass;
ROLLBACK;
