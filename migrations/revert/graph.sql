-- Revert pgjobs:graph from pg
BEGIN;
ALTER TABLE pgjobs.edges RESET (fillfactor);
DROP INDEX pgjobs.edges_child_idx;
DROP TABLE pgjobs.continuation_holds;
COMMIT;
