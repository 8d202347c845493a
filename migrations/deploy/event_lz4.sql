-- Deploy pgjobs:event_lz4 to pg
-- requires: event_log
-- The event arrays compressed with lz4 where the server has it. An inbox row holds one array per field
-- of every event of a call: a bulk enqueue of 1,000 jobs writes six arrays of 4-12 kB, past the 2 kB
-- TOAST threshold, and pglz compressing them was 7 % of the server's time of the call (perf, 1,000 plain
-- specs): 1.2 ms of 9.5. lz4 compresses them in a fraction of that; the ticker's copies into event_log
-- and every read decompress faster too. A server built without lz4 keeps pglz (the DO block below
-- returns before altering anything). SET COMPRESSION on a partitioned table does not reach its existing
-- partitions, so each is altered too; rows written before keep their pglz data (both read the same).
BEGIN;
DO $$
DECLARE
    t regclass;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        RETURN;   -- built without lz4
    END IF;
    -- Both trees at once, inbox first, as a tick takes them (inbox read, then log written): altering them
    -- one by one in catalog order could take a log partition before an inbox one and deadlock with a tick.
    -- 200 ms a try: a lock request waiting behind a transaction left open on the inbox (a user's enqueue,
    -- idle) would stall every writer queued behind it; between tries they run. After 50 tries the
    -- migration fails, naming the holders, and changes nothing.
    FOR try IN 1..50 LOOP
        BEGIN
            PERFORM set_config('lock_timeout', '200ms', true);
            LOCK TABLE pgjobs.event_inbox, pgjobs.event_log IN ACCESS EXCLUSIVE MODE;
            PERFORM set_config('lock_timeout', '0', true);
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            IF try = 50 THEN
                RAISE EXCEPTION USING ERRCODE = 'lock_not_available', MESSAGE = format(
                    'event_lz4: the event tables stayed locked by pid(s) %s; end those transactions and migrate again',
                    (SELECT string_agg(DISTINCT l.pid::text, ', ') FROM pg_locks AS l
                      WHERE l.granted AND l.pid <> pg_backend_pid()
                        AND l.relation IN (SELECT c.oid FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
                                            WHERE n.nspname = 'pgjobs' AND c.relname ~ '^event_(inbox|log)')));
            END IF;
            PERFORM pg_sleep(0.1);
        END;
    END LOOP;
    FOR t IN
        SELECT c.oid::regclass FROM pg_class AS c
         WHERE c.oid IN ('pgjobs.event_inbox'::regclass, 'pgjobs.event_log'::regclass)
            OR c.oid IN (SELECT i.inhrelid FROM pg_inherits AS i
                          WHERE i.inhparent IN ('pgjobs.event_inbox'::regclass, 'pgjobs.event_log'::regclass))
    LOOP
        EXECUTE format('ALTER TABLE %s ALTER COLUMN ids SET COMPRESSION lz4, ALTER COLUMN states SET COMPRESSION lz4,'
                       ' ALTER COLUMN queues SET COMPRESSION lz4, ALTER COLUMN kinds SET COMPRESSION lz4,'
                       ' ALTER COLUMN attempts SET COMPRESSION lz4, ALTER COLUMN batch_ids SET COMPRESSION lz4,'
                       ' ALTER COLUMN progress SET COMPRESSION lz4', t);
    END LOOP;
END;
$$;
COMMIT;
