-- Revert pgjobs:event_log_gin from pg
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
        EXECUTE format('ALTER INDEX %s RESET (gin_pending_list_limit)', i);
    END LOOP;
END;
$$;
COMMIT;
