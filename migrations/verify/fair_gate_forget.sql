-- Verify pgjobs:fair_gate_forget on pg
BEGIN;
SELECT 1 / count(*) FROM pg_class WHERE oid = 'pgjobs.fair_gate_f'::regclass AND relkind = 'S';
ROLLBACK;
