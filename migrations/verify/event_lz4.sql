-- Verify pgjobs:event_lz4 on pg
-- Where the server has lz4, every event array column of the inbox and log trees uses it.
BEGIN;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        RETURN;   -- built without lz4: the change altered nothing
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
