-- Deploy pgjobs:fair_gates to pg
-- Shared gates for the reads a fair claim skips for a while under a held snapshot (sql/fairness.sql,
-- "Shared gates"): the count of a queue's active jobs (a), the look for ungrouped work (u) and the
-- discovery sweep (s). A session whose read proved dear stores in the read's sequence until when, and
-- for which queue, the next such read may wait; every session's claims read it. Sequences, not a table:
-- setval is not transactional and leaves no dead tuple under the very snapshot it works around.
BEGIN;
CREATE SEQUENCE pgjobs.fair_gate_a AS bigint;
CREATE SEQUENCE pgjobs.fair_gate_u AS bigint;
CREATE SEQUENCE pgjobs.fair_gate_s AS bigint;
COMMIT;
