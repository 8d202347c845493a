-- Verify pgjobs:rate_limits on pg
BEGIN;
SELECT rate_key, rate_held_until FROM pgjobs.jobs WHERE false;
SELECT scope, key, max_starts, per, burst, updated_at FROM pgjobs.rate_limits WHERE false;
SELECT scope, key, tat, taken, taken_at FROM pgjobs.rate_tats WHERE false;
SELECT queue FROM pgjobs.rate_queues WHERE false;
SELECT 1 / count(*) FROM pg_catalog.pg_indexes WHERE schemaname = 'pgjobs' AND indexname = 'jobs_rate_pending_idx';
ROLLBACK;
