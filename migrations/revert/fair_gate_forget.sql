-- Revert pgjobs:fair_gate_forget from pg
BEGIN;
DROP SEQUENCE pgjobs.fair_gate_f;
COMMIT;
