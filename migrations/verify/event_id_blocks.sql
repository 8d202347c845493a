-- Verify pgjobs:event_id_blocks on pg
BEGIN;
SELECT 1 / count(*) FROM pgjobs.event_id_block;
SELECT hi FROM pgjobs.event_id_block_live WHERE false;
SELECT 1 / (relpersistence = 'u')::int FROM pg_class WHERE oid = 'pgjobs.event_id_block_live'::regclass;
ROLLBACK;
