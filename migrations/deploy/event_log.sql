-- Deploy pgjobs:event_log
-- requires: core
-- The status stream's storage (functions in ../../sql/stream.sql, whose header explains the design):
--
-- * event_inbox: what the hot paths append, ONE row per transition call (arrays of its events),
--   with the writer's top-level transaction id. A ring of 4 list partitions chosen by the clock
--   (15 s each): once the ticker has moved a partition's rows to the log, `maintain` TRUNCATEs it,
--   so its space comes back whatever snapshot is held (VACUUM could not reclaim it).
-- * event_log: the ordered log read_events reads, one row per inbox row with its final event ids
--   (first_id .. last_id), written only by the serialized ticker. A ring of 16 list partitions;
--   event_rotations (insert-only, one row per rotation) names the partition being written, and
--   rotation TRUNCATEs the oldest once the retention has passed.
-- * event_ticks: one row per tick that assigned ids (insert-only, in the log's ring): the snapshot
--   it saw, from which the next tick knows which transactions committed since.
-- * event_id_block, event_id_block_live: event ids in durably reserved blocks (../../sql/stream.sql, "IDS
--   AND CRASHES"), so that a tick's own commit need not wait for its WAL flush before readers may see the
--   ids it handed out. event_id_block (logged, one row): hi, the end of the block reserved last, written
--   only by a tick that reserves a block and commits with a WAL flush, so after a crash every id a reader
--   may have seen is at most this hi. event_id_block_live (UNLOGGED, one row when present): the same hi.
--   PostgreSQL empties an unlogged table in crash recovery (and it is empty on a promoted standby and in a
--   restored base backup), so its row says "no crash since this block was reserved": only then may a tick
--   hand out ids without a flush of its own; without the row, the next tick starts above
--   event_id_block.hi and reserves anew. Both rows are written once per block (a million ids).
-- * stream_followers: "someone follows, and is waiting for a hint" as insert-only marks with an
--   expiry time; writers probe the newest.
-- * stream_maintenance: one row per maintenance pass ("at most every few seconds").
-- * stream_settings: retention and rotation period (one row, written only by configure_stream).
BEGIN;

CREATE TABLE pgjobs.stream_settings (
    singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    retention    interval NOT NULL DEFAULT '1 hour',
    rotate_every interval NOT NULL DEFAULT '5 minutes',
    CONSTRAINT stream_settings_positive CHECK (retention > interval '0' AND rotate_every > interval '0')
);
INSERT INTO pgjobs.stream_settings DEFAULT VALUES;

-- Event ids: handed out in blocks by the ticker alone (under its advisory lock), never reused.
CREATE SEQUENCE pgjobs.event_id_seq AS bigint;
CREATE SEQUENCE pgjobs.event_inbox_seq AS bigint;
CREATE SEQUENCE pgjobs.event_tick_seq AS bigint;

CREATE TABLE pgjobs.event_inbox (
    slot      smallint NOT NULL,
    seq       bigint NOT NULL DEFAULT nextval('pgjobs.event_inbox_seq'),
    xid       xid8 NOT NULL,
    at        timestamptz NOT NULL,
    ids       bigint[] NOT NULL,
    states    pgjobs.job_state[] NOT NULL,
    queues    text[] NOT NULL,
    kinds     text[] NOT NULL,
    attempts  int[] NOT NULL,
    batch_ids bigint[] NOT NULL,
    progress  jsonb[]          -- progress reports only
) PARTITION BY LIST (slot);

CREATE TABLE pgjobs.event_log (
    slot      smallint NOT NULL,
    first_id  bigint NOT NULL,
    last_id   bigint NOT NULL,
    at        timestamptz NOT NULL,
    ids       bigint[] NOT NULL,
    states    pgjobs.job_state[] NOT NULL,
    queues    text[] NOT NULL,
    kinds     text[] NOT NULL,
    attempts  int[] NOT NULL,
    batch_ids bigint[] NOT NULL,
    progress  jsonb[]
) PARTITION BY LIST (slot);

-- The event arrays compressed with lz4 where the server has it (a server built without it keeps pglz).
-- An inbox row holds one array per field of every event of a call: a bulk enqueue of 1,000 jobs writes
-- arrays of 4-12 kB, past the 2 kB TOAST threshold, and lz4 compresses them, and the ticker's copies and
-- every read decompress them, in a fraction of pglz's time. Set on the parents before the partitions
-- exist, so that each partition takes it from its parent.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        ALTER TABLE pgjobs.event_inbox ALTER COLUMN ids SET COMPRESSION lz4, ALTER COLUMN states SET COMPRESSION lz4,
            ALTER COLUMN queues SET COMPRESSION lz4, ALTER COLUMN kinds SET COMPRESSION lz4,
            ALTER COLUMN attempts SET COMPRESSION lz4, ALTER COLUMN batch_ids SET COMPRESSION lz4,
            ALTER COLUMN progress SET COMPRESSION lz4;
        ALTER TABLE pgjobs.event_log ALTER COLUMN ids SET COMPRESSION lz4, ALTER COLUMN states SET COMPRESSION lz4,
            ALTER COLUMN queues SET COMPRESSION lz4, ALTER COLUMN kinds SET COMPRESSION lz4,
            ALTER COLUMN attempts SET COMPRESSION lz4, ALTER COLUMN batch_ids SET COMPRESSION lz4,
            ALTER COLUMN progress SET COMPRESSION lz4;
    END IF;
END;
$$;

CREATE TABLE pgjobs.event_inbox_0 PARTITION OF pgjobs.event_inbox FOR VALUES IN (0);
CREATE TABLE pgjobs.event_inbox_1 PARTITION OF pgjobs.event_inbox FOR VALUES IN (1);
CREATE TABLE pgjobs.event_inbox_2 PARTITION OF pgjobs.event_inbox FOR VALUES IN (2);
CREATE TABLE pgjobs.event_inbox_3 PARTITION OF pgjobs.event_inbox FOR VALUES IN (3);
CREATE INDEX event_inbox_xid_idx ON pgjobs.event_inbox (xid);

CREATE TABLE pgjobs.event_ticks (
    slot    smallint NOT NULL,
    tick_id bigint NOT NULL DEFAULT nextval('pgjobs.event_tick_seq'),
    at      timestamptz NOT NULL DEFAULT now(),
    snap    pg_snapshot NOT NULL,
    last_id bigint              -- the newest event id assigned so far (NULL: none yet)
) PARTITION BY LIST (slot);

DO $$
BEGIN
    FOR s IN 0..15 LOOP
        EXECUTE format('CREATE TABLE pgjobs.%I PARTITION OF pgjobs.event_log FOR VALUES IN (%s)',
                       'event_log_' || lpad(s::text, 2, '0'), s);
        EXECUTE format('CREATE TABLE pgjobs.%I PARTITION OF pgjobs.event_ticks FOR VALUES IN (%s)',
                       'event_ticks_' || lpad(s::text, 2, '0'), s);
    END LOOP;
END;
$$;
CREATE INDEX event_log_last_id_idx ON pgjobs.event_log (last_id);
CREATE INDEX event_log_ids_idx ON pgjobs.event_log USING gin (ids);
CREATE INDEX event_log_batch_ids_idx ON pgjobs.event_log USING gin (batch_ids);
CREATE INDEX event_ticks_tick_id_idx ON pgjobs.event_ticks (tick_id);

-- The log's GIN indexes (ids, batch_ids: a watched job's or batch's rows without scanning the others) keep
-- new entries in a pending list, and the insert that finds the list past gin_pending_list_limit merges the
-- whole list into the index. Here that insert is a tick, under the stream lock, and every event committed
-- meanwhile reaches its follower that much later: a 128 kB list (not the 4 MB default) keeps each merge
-- short. (Autovacuum also empties the lists; it never runs on this insert-only log, and is off on some
-- servers.) Set on each partition's index: a partitioned index takes no storage parameter.
DO $$
DECLARE
    i regclass;
BEGIN
    FOR i IN
        SELECT x.indexrelid::regclass FROM pg_index AS x
          JOIN pg_class AS c ON c.oid = x.indexrelid
          JOIN pg_am AS a ON a.oid = c.relam
         WHERE a.amname = 'gin' AND c.relkind = 'i'
           AND x.indrelid IN (SELECT h.inhrelid FROM pg_inherits AS h WHERE h.inhparent = 'pgjobs.event_log'::regclass)
    LOOP
        EXECUTE format('ALTER INDEX %s SET (gin_pending_list_limit = 128)', i);
    END LOOP;
END;
$$;

CREATE TABLE pgjobs.event_rotations (
    rotation_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    slot        smallint NOT NULL CHECK (slot BETWEEN 0 AND 15),
    started_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO pgjobs.event_rotations (slot) VALUES (0);
-- The first tick: every transaction visible now wrote no inbox row (there was no inbox).
INSERT INTO pgjobs.event_ticks (slot, snap) VALUES (0, pg_current_snapshot());

CREATE TABLE pgjobs.event_id_block (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    hi        bigint NOT NULL
);
INSERT INTO pgjobs.event_id_block (hi) VALUES (0);   -- no id handed out yet
CREATE UNLOGGED TABLE pgjobs.event_id_block_live (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    hi        bigint NOT NULL
);

CREATE TABLE pgjobs.stream_followers (
    until timestamptz NOT NULL,
    armed boolean NOT NULL    -- the follower is idle, waiting for a hint (false: it reads again by itself)
);
CREATE INDEX stream_followers_until_idx ON pgjobs.stream_followers (until);

CREATE TABLE pgjobs.stream_maintenance (
    run_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at     timestamptz NOT NULL DEFAULT now()
);

COMMIT;
