-- Verify pgjobs:cap_slots on pg
BEGIN;
SELECT queue, xid, n, group_key, slot FROM pgjobs.cap_ledger WHERE false;
SELECT queue, seq, snap, own, active, groups, slot FROM pgjobs.cap_checkpoints WHERE false;
SELECT 1 / (count(*) = 2)::int FROM pg_catalog.pg_partitioned_table AS p
 WHERE p.partrelid IN ('pgjobs.cap_ledger'::regclass, 'pgjobs.cap_checkpoints'::regclass);
ROLLBACK;
