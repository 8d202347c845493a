-- Revert pgjobs:rate_limits from pg
BEGIN;
DROP INDEX pgjobs.jobs_rate_held_idx;
DROP INDEX pgjobs.jobs_rate_pending_idx;
DROP TABLE pgjobs.rate_tats;
DROP TABLE pgjobs.rate_limits;
ALTER TABLE pgjobs.jobs DROP COLUMN rate_held_until;
ALTER TABLE pgjobs.jobs DROP COLUMN rate_key;
COMMIT;
