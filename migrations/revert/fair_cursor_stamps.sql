-- Revert pgjobs:fair_cursor_stamps from pg
-- The unique key back; a group with two cursors (none should have) keeps the one served last.
BEGIN;
DELETE FROM pgjobs.group_cursors AS c
 USING pgjobs.group_cursors AS d
 WHERE d.queue = c.queue AND d.group_key = c.group_key AND (d.served_seq, d.ctid) > (c.served_seq, c.ctid);
ALTER TABLE pgjobs.group_cursors ADD PRIMARY KEY (queue, group_key);
ALTER INDEX pgjobs.group_cursors_pkey SET (deduplicate_items = off);
DROP INDEX pgjobs.group_cursors_key_idx;
DROP INDEX pgjobs.group_cursors_new_key;
COMMIT;
