-- Deploy pgjobs:fair_head_floors to pg
-- requires: fair_cursor_epoch
-- A group's head floor in its cursor row (sql/fairness.sql, "Head floors"): where the group's pending work
-- began when a claim last served it, and until when and under which claim epoch that place may be
-- trusted. Head floors were kept per session only, so a session that claims now and then (one job every
-- 200 ms: bench/soak.py's probe) probed each group it served from the front of jobs_group_idx, past the
-- dead entry of every job of the group claimed since a held snapshot was taken (16,000-18,000 blocks a
-- claim of one, 70-180 ms, 7 minutes into the hold). The stamp rewrites the row on every serve anyway, so
-- the floor costs no version of its own; the columns stay NULL while no floor is in use (no held snapshot).
BEGIN;
ALTER TABLE pgjobs.group_cursors
    ADD COLUMN floor_priority smallint,
    ADD COLUMN floor_run_at   timestamptz,
    ADD COLUMN floor_id       bigint,
    ADD COLUMN floor_until    timestamptz,
    ADD COLUMN floor_epoch    bigint;
COMMIT;
