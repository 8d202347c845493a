-- Verify pgjobs:active_ledger on pg
BEGIN;
SELECT queue, xid, n FROM pgjobs.cap_ledger WHERE false;
SELECT queue, seq, snap, own, active, cut, prev FROM pgjobs.cap_checkpoints WHERE false;
SELECT 1 / count(*) FROM pg_catalog.pg_trigger WHERE tgrelid = 'pgjobs.jobs'::regclass AND tgname = 'jobs_cap_moved';
SELECT 1 / count(*) FROM pg_catalog.pg_trigger WHERE tgrelid = 'pgjobs.jobs'::regclass AND tgname = 'jobs_cap_deleted';
ROLLBACK;
