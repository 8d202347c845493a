-- Revert pgjobs:claim_floor from pg
BEGIN;
DROP SEQUENCE pgjobs.claim_floor_epoch;
COMMIT;
