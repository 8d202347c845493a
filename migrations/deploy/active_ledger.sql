-- Deploy pgjobs:active_ledger to pg
-- requires: rate_limits
-- The active ledger of capped queues (../../sql/caps.sql, ../../docs/design/claim.md "Caps as built"): every
-- statement that moves jobs of a queue with max_active into or out of 'active' inserts the net change per
-- queue (a statement trigger on jobs, so no path can forget it), and a capped claim reads its queue's active
-- count as the newest checkpoint plus the changes filed since that checkpoint's snapshot. Both tables are
-- insert-only on the claim path; new, so the change is in place under load. Until the first capped claim
-- after it seeds a checkpoint (an exact count), the ledger is not read.
BEGIN;
CREATE TABLE pgjobs.cap_ledger (
    queue text NOT NULL,
    xid   xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    n     int NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
CREATE INDEX cap_ledger_xid ON pgjobs.cap_ledger (queue, xid) INCLUDE (n);

-- A queue's count at one snapshot: `active` is the sum of the ledger rows visible in `snap` other than those of
-- `own` (the writing transaction, whose later rows are in neither its snapshot's list nor past its xmax).
-- `cut`: the ledger rows of the queue below it are gone; `prev`: the checkpoint before, deleted by the next.
CREATE TABLE pgjobs.cap_checkpoints (
    queue  text NOT NULL,
    seq    bigint NOT NULL,
    snap   pg_catalog.pg_snapshot NOT NULL,
    own    xid8,
    active int NOT NULL,
    cut    xid8 NOT NULL,
    prev   bigint,
    PRIMARY KEY (queue, seq)
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 100);
CREATE SEQUENCE pgjobs.cap_checkpoints_seq AS bigint;

CREATE OR REPLACE FUNCTION pgjobs._cap_moved()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        INSERT INTO cap_ledger (queue, n)
        SELECT d.queue, d.n
          FROM (SELECT m.queue, sum(m.n)::int AS n
                  FROM (SELECT o.queue, -1 AS n FROM old_jobs AS o WHERE o.state = 'active'
                        UNION ALL
                        SELECT w.queue, 1 FROM new_jobs AS w WHERE w.state = 'active') AS m
                 GROUP BY m.queue) AS d
          JOIN queues AS c ON c.queue = d.queue AND c.max_active IS NOT NULL
         WHERE d.n <> 0;
    ELSE
        INSERT INTO cap_ledger (queue, n)
        SELECT d.queue, d.n
          FROM (SELECT o.queue, -count(*)::int AS n FROM old_jobs AS o WHERE o.state = 'active'
                 GROUP BY o.queue) AS d
          JOIN queues AS c ON c.queue = d.queue AND c.max_active IS NOT NULL;
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER jobs_cap_moved AFTER UPDATE ON pgjobs.jobs
    REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION pgjobs._cap_moved();
CREATE TRIGGER jobs_cap_deleted AFTER DELETE ON pgjobs.jobs
    REFERENCING OLD TABLE AS old_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION pgjobs._cap_moved();
COMMIT;
