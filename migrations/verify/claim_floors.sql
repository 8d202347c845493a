-- Verify pgjobs:claim_floors
BEGIN;
SELECT filed_xid FROM pgjobs.jobs WHERE false;
SELECT 1 / count(*) FROM pg_indexes WHERE schemaname = 'pgjobs' AND indexname = 'jobs_filed_idx';
SELECT 1 / count(*) FROM pg_trigger WHERE tgrelid = 'pgjobs.jobs'::regclass AND tgname = 'jobs_filed';
SELECT slot, seq, queue, kinds, snap, own, p, t, i, sched, lease FROM pgjobs.claim_floors WHERE false;
SELECT 1 / (count(*) = 2)::int FROM pg_inherits WHERE inhparent = 'pgjobs.claim_floors'::regclass;
SELECT 1 / count(*) FROM pg_class WHERE relnamespace = 'pgjobs'::regnamespace AND relname = 'claim_floors_seq';
SELECT (NULL::pgjobs.claim_plan).snap;
ROLLBACK;
