-- Revert pgjobs:event_log
BEGIN;
DROP TABLE pgjobs.stream_maintenance, pgjobs.stream_followers, pgjobs.event_id_block_live, pgjobs.event_id_block,
           pgjobs.event_rotations, pgjobs.event_ticks, pgjobs.event_log, pgjobs.event_inbox, pgjobs.stream_settings;
DROP SEQUENCE pgjobs.event_tick_seq, pgjobs.event_inbox_seq, pgjobs.event_id_seq;
COMMIT;
