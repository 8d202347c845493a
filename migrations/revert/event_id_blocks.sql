-- Revert pgjobs:event_id_blocks from pg
BEGIN;
DROP TABLE pgjobs.event_id_block_live, pgjobs.event_id_block;
COMMIT;
