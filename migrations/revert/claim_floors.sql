-- Revert pgjobs:claim_floors
BEGIN;
-- (CASCADE: the plain claim's locking statement takes it as its parameter. That function is sql/'s, so the
-- installed revision is forgotten: the next migrate installs sql/ again, whatever its digest.)
DROP TYPE pgjobs.claim_plan CASCADE;
DELETE FROM pgjobs.sql_revision;
DROP SEQUENCE pgjobs.claim_floors_seq;
DROP TABLE pgjobs.claim_floors;
DROP TRIGGER jobs_filed ON pgjobs.jobs;
DROP FUNCTION pgjobs._job_filed();
DROP INDEX pgjobs.jobs_filed_idx;
ALTER TABLE pgjobs.jobs DROP COLUMN filed_xid;
COMMIT;
