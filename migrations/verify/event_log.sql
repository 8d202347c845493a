-- Verify pgjobs:event_log
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
SELECT 1 / count(*) FROM pgjobs.event_id_block;
SELECT hi FROM pgjobs.event_id_block_live WHERE false;
SELECT 1 / (relpersistence = 'u')::int FROM pg_class WHERE oid = 'pgjobs.event_id_block_live'::regclass;
-- every GIN index of the log's partitions (two each) with the short pending list
SELECT 1 / (count(*) = 2 * (SELECT count(*) FROM pg_inherits WHERE inhparent = 'pgjobs.event_log'::regclass))::int
  FROM pg_index AS x
  JOIN pg_class AS c ON c.oid = x.indexrelid
  JOIN pg_am AS a ON a.oid = c.relam
 WHERE a.amname = 'gin' AND c.relkind = 'i' AND 'gin_pending_list_limit=128' = ANY (c.reloptions)
   AND x.indrelid IN (SELECT h.inhrelid FROM pg_inherits AS h WHERE h.inhparent = 'pgjobs.event_log'::regclass);
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        RETURN;   -- built without lz4: the arrays keep the server's default
    END IF;
    IF EXISTS (SELECT 1 FROM pg_attribute AS a
                WHERE a.attname IN ('ids', 'states', 'queues', 'kinds', 'attempts', 'batch_ids', 'progress')
                  AND a.attcompression IS DISTINCT FROM 'l'
                  AND (a.attrelid IN ('pgjobs.event_inbox'::regclass, 'pgjobs.event_log'::regclass)
                       OR a.attrelid IN (SELECT i.inhrelid FROM pg_inherits AS i
                                          WHERE i.inhparent IN ('pgjobs.event_inbox'::regclass,
                                                                'pgjobs.event_log'::regclass)))) THEN
        RAISE EXCEPTION 'an event array column is not lz4-compressed';
    END IF;
END;
$$;
ROLLBACK;
