-- The status stream's durable re-read (pgjobs/stream.py). NOTIFY is not durable, so a subscriber
-- re-reads the jobs it watches when its LISTEN connection (re)connects and periodically: a missed
-- notification then costs latency, never correctness. One round trip for any number of watched jobs.
--
-- Returns the jobs in job_ids, plus the members of batch in_batch (only the live ones when live_only:
-- the periodic re-read asks for those plus the ids it last saw live, by id, so a large batch is not
-- read whole every few seconds).
CREATE OR REPLACE FUNCTION pgjobs.status_snapshot(job_ids bigint[] DEFAULT NULL, in_batch bigint DEFAULT NULL,
                                                  live_only boolean DEFAULT false)
RETURNS TABLE (id bigint, state pgjobs.job_state, queue text, kind text, attempt int, batch_id bigint,
               progress jsonb)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT j.id, j.state, j.queue, j.kind, j.attempt, j.batch_id, j.progress
      FROM jobs AS j
     WHERE j.id = ANY (status_snapshot.job_ids)
        OR (j.batch_id = status_snapshot.in_batch
            AND (NOT status_snapshot.live_only OR j.state IN ('waiting', 'scheduled', 'pending', 'active')))
     ORDER BY j.id;
$$;
