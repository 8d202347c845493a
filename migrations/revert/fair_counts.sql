-- Revert pgjobs:fair_counts from pg
BEGIN;
DROP TABLE pgjobs.fair_counts;
COMMIT;
