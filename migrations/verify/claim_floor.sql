-- Verify pgjobs:claim_floor on pg
BEGIN;
SELECT 1 / count(*) FROM pg_class WHERE oid = 'pgjobs.claim_floor_epoch'::regclass AND relkind = 'S';
ROLLBACK;
