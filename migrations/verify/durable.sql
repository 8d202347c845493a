-- Verify pgjobs:durable on pg
BEGIN;
SELECT job_id, name, result, bytes, attempt, done_at FROM pgjobs.job_steps WHERE false;
SELECT job_id, name, key, since, until, resolved_at, outcome, payload FROM pgjobs.job_waits WHERE false;
SELECT id, key, payload, sent_at, expires_at FROM pgjobs.signals WHERE false;
ROLLBACK;
