-- Verify pgjobs:fair_cursor_epoch on pg
BEGIN;
SELECT 1 / count(*) FROM pg_class WHERE oid = 'pgjobs.fair_cursor_epoch'::regclass AND relkind = 'S';
ROLLBACK;
