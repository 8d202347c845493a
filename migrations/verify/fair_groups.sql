-- Verify pgjobs:fair_groups on pg
BEGIN;
SELECT queue, group_key FROM pgjobs.fair_groups WHERE false;
ROLLBACK;
