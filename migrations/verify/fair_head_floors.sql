-- Verify pgjobs:fair_head_floors on pg
BEGIN;
SELECT floor_priority, floor_run_at, floor_id, floor_until, floor_epoch FROM pgjobs.group_cursors WHERE false;
ROLLBACK;
