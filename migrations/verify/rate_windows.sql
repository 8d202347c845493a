-- Verify pgjobs:rate_windows on pg
BEGIN;
SELECT scope, key, seq, started_at FROM pgjobs.rate_starts WHERE false;
SELECT 1 / count(*) FROM pg_catalog.pg_indexes WHERE schemaname = 'pgjobs' AND indexname = 'rate_starts_pkey';
ROLLBACK;
