-- Deploy pgjobs:event_id_blocks to pg
-- requires: event_log
-- Event ids in durably reserved blocks (sql/stream.sql, "IDS AND CRASHES"), so that a tick's own commit
-- need not wait for its WAL flush before readers may see the ids it handed out:
-- * event_id_block (logged, one row): hi, the end of the block reserved last. Written only by a tick
--   that reserves a block, and that tick commits with a WAL flush, so hi is on disk before any id up
--   to it can be read: after a crash every id a reader may have seen is at most this hi.
-- * event_id_block_live (UNLOGGED, one row when present): the same hi. PostgreSQL empties an unlogged
--   table in crash recovery (and it is empty on a promoted standby and in a restored base backup), so
--   its row says "no crash since this block was reserved": only then may a tick hand out ids without a
--   flush of its own; without the row, the next tick starts above event_id_block.hi and reserves anew.
-- Both rows are written once per reserved block (a million ids), never per tick.
BEGIN;
CREATE TABLE pgjobs.event_id_block (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    hi        bigint NOT NULL
);
-- An existing install: every id handed out so far is covered (the sequence's value is on disk here: this
-- migration's commit flushes it).
INSERT INTO pgjobs.event_id_block (hi)
SELECT coalesce(pg_sequence_last_value('pgjobs.event_id_seq'), 0);
CREATE UNLOGGED TABLE pgjobs.event_id_block_live (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    hi        bigint NOT NULL
);
COMMIT;
