-- Verify pgjobs:graph on pg
BEGIN;
SELECT job_id, sibling_id FROM pgjobs.continuation_holds WHERE false;
SELECT 1 / count(*) FROM pg_indexes WHERE schemaname = 'pgjobs' AND indexname = 'edges_child_idx';
ROLLBACK;
