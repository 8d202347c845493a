-- Deploy pgjobs:event_log_gin to pg
-- requires: event_log
-- The event log's GIN indexes (ids, batch_ids: a watched job's or batch's rows without scanning the
-- others) keep new entries in a pending list, and the insert that finds the list past
-- gin_pending_list_limit (4 MB by default) merges the whole list into the index itself. Here that
-- insert is a tick: a follower's read_events or the workers' maintenance pass, under the stream lock. At
-- full worker speed (bench/stream.py) that merge took 195-220 ms and 412,000 buffer hits once every
-- few seconds, and every event committed meanwhile reached the follower that much later: the whole
-- p99 of the delivery time (216-279 ms, against a p50 of 4.3). With a 128 kB list a merge is 1/32 of
-- that, and no run in ten showed a stall past 50 ms. (Autovacuum also empties the lists; it never runs
-- on this insert-only log, and is off on some servers.) The partitions of the 16-slot ring are altered
-- one by one: a storage parameter cannot be set on a partitioned index.
BEGIN;
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
COMMIT;
