-- Revert pgjobs:core
-- Drops everything pgjobs owns, functions from ../../sql included.
BEGIN;
DROP SCHEMA pgjobs CASCADE;
COMMIT;
