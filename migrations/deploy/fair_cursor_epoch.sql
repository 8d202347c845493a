-- Deploy pgjobs:fair_cursor_epoch to pg
-- Moved by every claim that creates a never-served group cursor (sql/fairness.sql, _fair_unserved): a fair
-- claim whose last look for never-served cursors found none skips the next look while it has not moved
-- (a held snapshot keeps a dead entry per cursor ever created and served since, and each look passed them
-- all). A sequence, not a table: nextval leaves no dead tuple under that snapshot.
BEGIN;
CREATE SEQUENCE pgjobs.fair_cursor_epoch AS bigint;
COMMIT;
