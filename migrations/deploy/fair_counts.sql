-- Deploy pgjobs:fair_counts to pg
-- requires: fair_head_floors
-- Shared counts of a fair queue's active jobs (sql/fairness.sql, "Shared gates"). Under a held snapshot
-- the count passes the dead entry of every job claimed since, and a session whose count proved dear
-- keeps it for a while; a session that claims now and then (bench/soak.py's probe, one job every 200 ms)
-- still counted once its own count was 30 s old: 220-420 ms a count six to ten minutes into a hold, its
-- p99. A dear count is now also written here, and every session whose own count is older reads the newest
-- (one index descent). Insert-only: a row is never updated, so a held snapshot leaves no version chain
-- behind the newest row (the dead rows lie to the left of it in the index); rows older than five minutes
-- are deleted by the writer, and VACUUM takes them once no snapshot needs them.
BEGIN;
CREATE TABLE pgjobs.fair_counts (
    queue      text NOT NULL,
    counted_at timestamptz NOT NULL,
    payload    jsonb NOT NULL   -- [active jobs, the most active jobs of one group, group keys, their counts]
);
CREATE INDEX fair_counts_newest ON pgjobs.fair_counts (queue, counted_at);
COMMIT;
