-- Revert pgjobs:rate_limits from pg
BEGIN;
DROP INDEX pgjobs.jobs_rate_held_idx;
DROP INDEX pgjobs.jobs_rate_pending_idx;
DROP TABLE pgjobs.rate_tats;
DROP TABLE pgjobs.rate_queues;
-- The functions returning its row type (sql/rate_limits.sql) go with it, and the installed revision of sql/
-- is marked stale: the next migrate installs every function again, whichever revision it brings.
DROP TABLE pgjobs.rate_limits CASCADE;
UPDATE pgjobs.sql_revision SET digest = 'stale: pgjobs:rate_limits reverted';
ALTER TABLE pgjobs.jobs DROP COLUMN rate_held_until;
ALTER TABLE pgjobs.jobs DROP COLUMN rate_key;
COMMIT;
