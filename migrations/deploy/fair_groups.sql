-- Deploy pgjobs:fair_groups to pg
-- requires: fairness
-- Which groups of a fair queue have a cursor, in a table whose rows are never updated (sql/fairness.sql,
-- "Under a held snapshot"). group_cursors rows are rewritten every time their group is served, and each
-- version leaves an entry in group_cursors_pkey: while a foreign snapshot is held none of them can be
-- removed or marked dead, and "has this group a cursor?" walked them all, once per group met by a
-- discovery. Here a group has one row (inserted with its cursor, deleted with it), so that question is one
-- index probe however long a snapshot is held.
BEGIN;

CREATE TABLE pgjobs.fair_groups (
    queue     text NOT NULL,
    group_key text NOT NULL,
    PRIMARY KEY (queue, group_key)
);

-- the cursors of an installation being upgraded
INSERT INTO pgjobs.fair_groups (queue, group_key) SELECT c.queue, c.group_key FROM pgjobs.group_cursors AS c;

COMMIT;
