-- Verify pgjobs:fair_gates on pg
BEGIN;
SELECT 1 / (count(*) / 3)
  FROM pg_class
 WHERE oid IN ('pgjobs.fair_gate_a'::regclass, 'pgjobs.fair_gate_u'::regclass, 'pgjobs.fair_gate_s'::regclass)
   AND relkind = 'S';
ROLLBACK;
