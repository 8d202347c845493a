-- Verify pgjobs:core
-- Raises (division by zero) when an expected object is missing.
BEGIN;
SELECT 1 / count(*) FROM pg_namespace WHERE nspname = 'pgjobs';
SELECT 1 / count(*) FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
 WHERE n.nspname = 'pgjobs' AND t.typname = 'job_state';
SELECT id, kind, queue, payload, meta, state, priority, run_at, created_at, attempt, max_attempts,
       lease_token, leased_by, lease_expires_at, first_started_at, completed_at, last_error, errors,
       checkpoint, progress, result, unique_key, unique_live_only, group_key, batch_id, remaining_deps,
       failed_deps, schedule_name, cancel_requested, has_dependents
  FROM pgjobs.jobs WHERE false;
SELECT 1 / (relkind = 'p')::int FROM pg_class WHERE oid = 'pgjobs.jobs'::regclass;
SELECT 1 / (count(*) = 3)::int FROM pg_inherits WHERE inhparent = 'pgjobs.jobs'::regclass;
SELECT 1 / count(*) FROM pg_constraint
 WHERE conrelid = 'pgjobs.jobs_live'::regclass AND conname = 'jobs_pkey' AND contype = 'p';
SELECT 1 / count(*) FROM pg_constraint
 WHERE conrelid = 'pgjobs.jobs'::regclass AND conname = 'jobs_valid' AND contype = 'c';
SELECT 1 / count(*) FROM pg_class
 WHERE oid = 'pgjobs.jobs_pending_idx'::regclass AND 'deduplicate_items=off' = ANY (reloptions);
SELECT kind, unique_key, job_id FROM pgjobs.job_keys WHERE false;
SELECT name, tree, lower, upper, created_at, checked_at, next_check_at FROM pgjobs.history_partitions WHERE false;
SELECT 1 / count(*) FROM pgjobs.history_settings;
SELECT child_id, parent_job_id, parent_batch_id, trigger, satisfied FROM pgjobs.edges WHERE false;
SELECT 1 / count(*) FROM pg_indexes WHERE schemaname = 'pgjobs' AND indexname = 'edges_child_idx';
SELECT job_id, sibling_id FROM pgjobs.continuation_holds WHERE false;
SELECT id, total, pending, succeeded, failed, cancelled, state, meta, has_dependents, created_at, started_at,
       completed_at
  FROM pgjobs.batches WHERE false;
SELECT queue, max_length, paused, fair, noisy_share, noisy_min_active, max_active_per_group, max_active,
       status_events, updated_at, retention FROM pgjobs.queues WHERE false;
SELECT name, kind, cron, timezone, payload, queue, code_defined, paused, next_run_at, last_run_at
  FROM pgjobs.schedules WHERE false;
SELECT id, started_at, last_seen, meta FROM pgjobs.workers WHERE false;
SELECT singleton, digest, applied_at FROM pgjobs.sql_revision WHERE false;
ROLLBACK;
