-- Revert pgjobs:fair_groups from pg
BEGIN;
DROP TABLE pgjobs.fair_groups;
COMMIT;
