-- Revert pgjobs:cap_slots from pg
-- The ledger and its checkpoints back in one table each, rows and newest checkpoints copied; the installed
-- revision of sql/ is marked stale: the next migrate installs every function again.
BEGIN;
LOCK TABLE pgjobs.jobs, pgjobs.cap_checkpoints, pgjobs.cap_ledger IN ACCESS EXCLUSIVE MODE;
ALTER TABLE pgjobs.cap_ledger RENAME TO cap_ledger_slotted;
ALTER TABLE pgjobs.cap_checkpoints RENAME TO cap_checkpoints_slotted;
ALTER INDEX pgjobs.cap_ledger_moves RENAME TO cap_ledger_slotted_moves;
CREATE TABLE pgjobs.cap_ledger (
    queue     text NOT NULL,
    xid       xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    n         integer NOT NULL,
    group_key text
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
CREATE INDEX cap_ledger_moves ON pgjobs.cap_ledger (queue, xid) INCLUDE (n, group_key);
CREATE TABLE pgjobs.cap_checkpoints (
    queue  text NOT NULL,
    seq    bigint NOT NULL,
    snap   pg_catalog.pg_snapshot NOT NULL,
    own    xid8,
    active integer NOT NULL,
    cut    xid8 NOT NULL,
    prev   bigint,
    groups jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (queue, seq)
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 100);
INSERT INTO pgjobs.cap_ledger (queue, xid, n, group_key)
SELECT l.queue, l.xid, l.n, l.group_key FROM pgjobs.cap_ledger_slotted AS l;
INSERT INTO pgjobs.cap_checkpoints (queue, seq, snap, own, active, cut, prev, groups)
SELECT DISTINCT ON (c.queue) c.queue, c.seq, c.snap, c.own, c.active, c.cut, c.prev, c.groups
  FROM pgjobs.cap_checkpoints_slotted AS c
 ORDER BY c.queue, c.seq DESC;
-- (_cap_seed is bound to the slotted table's row type: it goes, and the next install makes it again)
DROP FUNCTION IF EXISTS pgjobs._cap_seed(text);
DROP TABLE pgjobs.cap_ledger_slotted, pgjobs.cap_checkpoints_slotted;
UPDATE pgjobs.sql_revision SET digest = 'stale: pgjobs:cap_slots reverted';
COMMIT;
