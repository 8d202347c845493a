-- Deploy pgjobs:fair_gate_forget to pg
-- A fourth shared gate (sql/fairness.sql, "Shared gates"): the checks before a dry group's cursor is dropped
-- (_forget_group, f). Under a held snapshot they pass every dead entry of the group's claimed jobs and of the
-- queue's completed ones; once a session found them dear, every session keeps served groups' cursors until
-- the gate opens, as the other dear reads are shared.
BEGIN;
CREATE SEQUENCE pgjobs.fair_gate_f AS bigint;
COMMIT;
