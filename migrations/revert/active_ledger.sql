-- Revert pgjobs:active_ledger from pg
BEGIN;
DROP TRIGGER jobs_cap_deleted ON pgjobs.jobs;
DROP TRIGGER jobs_cap_moved ON pgjobs.jobs;
DROP FUNCTION pgjobs._cap_moved();
DROP SEQUENCE pgjobs.cap_checkpoints_seq;
-- (CASCADE: the functions of sql/caps.sql that read its row type go with it; the installed revision of sql/
-- is marked stale, so the next migrate installs every function again.)
DROP TABLE pgjobs.cap_checkpoints CASCADE;
DROP TABLE pgjobs.cap_ledger;
UPDATE pgjobs.sql_revision SET digest = 'stale: pgjobs:active_ledger reverted';
COMMIT;
