-- Revert pgjobs:event_lz4 from pg
-- Back to the server's default compression (rows written meanwhile stay lz4: they read the same).
BEGIN;
DO $$
DECLARE
    t regclass;
BEGIN
    LOCK TABLE pgjobs.event_inbox, pgjobs.event_log IN ACCESS EXCLUSIVE MODE;  -- as deploy: inbox first
    FOR t IN
        SELECT c.oid::regclass FROM pg_class AS c
         WHERE c.oid IN ('pgjobs.event_inbox'::regclass, 'pgjobs.event_log'::regclass)
            OR c.oid IN (SELECT i.inhrelid FROM pg_inherits AS i
                          WHERE i.inhparent IN ('pgjobs.event_inbox'::regclass, 'pgjobs.event_log'::regclass))
    LOOP
        EXECUTE format('ALTER TABLE %s ALTER COLUMN ids SET COMPRESSION default, ALTER COLUMN states SET COMPRESSION default,'
                       ' ALTER COLUMN queues SET COMPRESSION default, ALTER COLUMN kinds SET COMPRESSION default,'
                       ' ALTER COLUMN attempts SET COMPRESSION default, ALTER COLUMN batch_ids SET COMPRESSION default,'
                       ' ALTER COLUMN progress SET COMPRESSION default', t);
    END LOOP;
END;
$$;
COMMIT;
