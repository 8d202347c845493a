-- Revert pgjobs:fair_cursor_epoch from pg
BEGIN;
DROP SEQUENCE pgjobs.fair_cursor_epoch;
COMMIT;
