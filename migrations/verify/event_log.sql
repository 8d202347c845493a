-- Verify pgjobs:event_log on pg
BEGIN;
SELECT slot, seq, xid, at, ids, states, queues, kinds, attempts, batch_ids, progress FROM pgjobs.event_inbox WHERE false;
SELECT slot, first_id, last_id, at, ids, states, queues, kinds, attempts, batch_ids, progress FROM pgjobs.event_log WHERE false;
SELECT slot, tick_id, at, snap, last_id FROM pgjobs.event_ticks WHERE false;
SELECT rotation_id, slot, started_at FROM pgjobs.event_rotations WHERE false;
SELECT until, armed FROM pgjobs.stream_followers WHERE false;
SELECT run_id, at FROM pgjobs.stream_maintenance WHERE false;
SELECT 1 / count(*) FROM pgjobs.stream_settings;
SELECT 1 / (count(*) = 16)::int FROM pg_inherits WHERE inhparent = 'pgjobs.event_log'::regclass;
SELECT 1 / (count(*) = 4)::int FROM pg_inherits WHERE inhparent = 'pgjobs.event_inbox'::regclass;
SELECT nextval('pgjobs.event_id_seq') WHERE false;
ROLLBACK;
