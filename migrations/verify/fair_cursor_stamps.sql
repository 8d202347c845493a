-- Verify pgjobs:fair_cursor_stamps on pg
-- The two indexes are there, and no unique index of group_cursors covers stamped cursors.
BEGIN;
SELECT 1 / (count(*) = 2)::int FROM pg_indexes
 WHERE schemaname = 'pgjobs' AND indexname IN ('group_cursors_new_key', 'group_cursors_key_idx');
SELECT 1 / (count(*) = 0)::int FROM pg_index AS x
 WHERE x.indrelid = 'pgjobs.group_cursors'::regclass AND x.indisunique AND x.indpred IS NULL;
ROLLBACK;
