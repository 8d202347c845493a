-- Verify pgjobs:event_log_gin on pg
-- Every GIN index of an event_log partition (ids and batch_ids: two a partition) has the short pending list.
BEGIN;
SELECT 1 / (count(*) = 0)::int
  FROM pg_index AS x
  JOIN pg_class AS c ON c.oid = x.indexrelid
  JOIN pg_am AS a ON a.oid = c.relam
 WHERE a.amname = 'gin' AND c.relkind = 'i'
   AND x.indrelid IN (SELECT h.inhrelid FROM pg_inherits AS h WHERE h.inhparent = 'pgjobs.event_log'::regclass)
   AND NOT coalesce('gin_pending_list_limit=128' = ANY (c.reloptions), false);
SELECT 1 / (count(*) = 2 * (SELECT count(*) FROM pg_inherits WHERE inhparent = 'pgjobs.event_log'::regclass))::int
  FROM pg_index AS x
  JOIN pg_class AS c ON c.oid = x.indexrelid
  JOIN pg_am AS a ON a.oid = c.relam
 WHERE a.amname = 'gin' AND c.relkind = 'i'
   AND x.indrelid IN (SELECT h.inhrelid FROM pg_inherits AS h WHERE h.inhparent = 'pgjobs.event_log'::regclass);
ROLLBACK;
