-- Revert pgjobs:fair_gates from pg
BEGIN;
DROP SEQUENCE pgjobs.fair_gate_a, pgjobs.fair_gate_u, pgjobs.fair_gate_s;
COMMIT;
