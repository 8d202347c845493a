-- Revert pgjobs:fair_head_floors from pg
-- group_cursors without the floor columns, rebuilt (dropped columns would leave a gap in the column
-- numbers, and the table would differ from one never migrated past fair_cursor_epoch).
BEGIN;
CREATE TABLE pgjobs.group_cursors_v (
    queue          text NOT NULL,
    group_key      text NOT NULL,
    last_served_at timestamptz NOT NULL DEFAULT '-infinity',
    served_seq     bigint NOT NULL DEFAULT 0
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);
INSERT INTO pgjobs.group_cursors_v SELECT queue, group_key, last_served_at, served_seq FROM pgjobs.group_cursors;
DROP TABLE pgjobs.group_cursors;
ALTER TABLE pgjobs.group_cursors_v RENAME TO group_cursors;
CREATE INDEX group_cursors_seq_idx ON pgjobs.group_cursors (queue, served_seq, group_key);
CREATE UNIQUE INDEX group_cursors_new_key ON pgjobs.group_cursors (queue, group_key) WHERE served_seq = 0;
CREATE INDEX group_cursors_key_idx ON pgjobs.group_cursors (queue, group_key, served_seq)
    WITH (deduplicate_items = off);
COMMIT;
