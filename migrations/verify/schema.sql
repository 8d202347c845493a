-- Verify pgjobs:schema
-- Raises (division by zero) when an expected object is missing.
BEGIN;
SELECT 1 / count(*) FROM pg_namespace WHERE nspname = 'pgjobs';
SELECT id, kind, queue, payload, meta, state, priority, run_at, created_at, attempt, max_attempts,
       lease_token, leased_by, lease_expires_at, first_started_at, completed_at, last_error, errors,
       checkpoint, progress, result, unique_key, unique_live_only, group_key, batch_id, remaining_deps,
       failed_deps, schedule_name, cancel_requested, has_dependents
  FROM pgjobs.jobs WHERE false;
SELECT child_id, parent_job_id, parent_batch_id, trigger, satisfied FROM pgjobs.edges WHERE false;
SELECT id, total, pending, succeeded, failed, cancelled, state, created_at, started_at, completed_at
  FROM pgjobs.batches WHERE false;
SELECT queue, max_length, paused, fair, noisy_share, noisy_min_active, max_active_per_group, max_active,
       status_events FROM pgjobs.queues WHERE false;
SELECT queue, group_key, last_served_at FROM pgjobs.group_cursors WHERE false;
SELECT name, kind, cron, timezone, payload, queue, code_defined, paused, next_run_at, last_run_at
  FROM pgjobs.schedules WHERE false;
SELECT id, last_seen, meta FROM pgjobs.workers WHERE false;
SELECT 1 / count(*) FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
 WHERE n.nspname = 'pgjobs' AND t.typname = 'job_state';
ROLLBACK;
