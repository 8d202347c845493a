-- Revert pgjobs:durable from pg
BEGIN;
DROP TABLE pgjobs.signals;
DROP TABLE pgjobs.job_waits;
DROP TABLE pgjobs.job_steps;
COMMIT;
