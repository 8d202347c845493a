-- Verify pgjobs:fair_ring on pg
BEGIN;
SELECT slot, seq, queue, snap, own, vt, served, sched, lease, g, g_vt, g_served, g_at, g_p, g_t, g_i
  FROM pgjobs.fair_rings WHERE false;
SELECT queue, group_key, weight FROM pgjobs.fair_weights WHERE false;
SELECT queue, xid, n, group_key FROM pgjobs.cap_ledger WHERE false;
SELECT groups FROM pgjobs.cap_checkpoints WHERE false;
ROLLBACK;
