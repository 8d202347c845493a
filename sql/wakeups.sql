-- Wake-ups: pgjobs_wake, the notification that tells sleeping workers a queue has claimable work. pg_notify
-- is transactional: listeners hear nothing until commit, so a job is always persisted before anyone is told
-- about it. NOTIFY is not durable either: every consumer heals a missed wake by polling durable state, so
-- these are latency hints, never truth.
--
-- Cost: a transaction that notified takes a cluster-wide lock at commit. Hence at most one wake per queue
-- per call. Status changes are not NOTIFY payloads: they are appended to the event log (stream.sql, the
-- status-event family), and `pgjobs_status` is only a hint carrying the newest event_id, sent from there
-- only while someone follows the stream.

-- pgjobs_wake: payload is the queue name; sent whenever a job becomes claimable now.
-- (PL/pgSQL: a SQL function that cannot be inlined is parsed and planned again on every call.)
CREATE OR REPLACE FUNCTION pgjobs._wake(queues text[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    IF cardinality(queues) = 1 THEN
        IF queues[1] IS NOT NULL THEN
            PERFORM pg_notify('pgjobs_wake', queues[1]);
        END IF;
    ELSIF cardinality(queues) > 1 THEN
        PERFORM pg_notify('pgjobs_wake', q) FROM (SELECT DISTINCT unnest(queues) AS q) AS s WHERE q IS NOT NULL;
    END IF;
END;
$$;

-- pgjobs_wake for the capped queues among `queues` (max_active or max_active_per_group set), sent by
-- every call that ends an active job (complete, complete_many, fail, dead_letter, release, ack_cancel):
-- the end frees room under the cap, and a worker whose claim the cap cut short sleeps until it is told
-- (else until its poll). Only the queues rows are read. There is no test for pending work: under a held
-- snapshot any such test reads past the index entries of every job claimed since, and a wake that finds
-- nothing costs an idle worker one empty claim where a missed one costs a poll interval. A queue named
-- twice is one row, one notification (and the server drops a repeated payload within a transaction).
CREATE OR REPLACE FUNCTION pgjobs._wake_capped(queues text[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    PERFORM pg_notify('pgjobs_wake', q.queue)
       FROM queues AS q
      WHERE q.queue = ANY (_wake_capped.queues)
        AND (q.max_active IS NOT NULL OR q.max_active_per_group IS NOT NULL);
END;
$$;

-- Which of `queues` have a cap (max_active or max_active_per_group set): the in-process side of
-- _wake_capped. A worker that ends a job of one of them claims again at once, without waiting for its
-- own notification (pgjobs/runtime/claimer.py); it reads this at start and with every heartbeat.
CREATE OR REPLACE FUNCTION pgjobs.capped_queues(queues text[])
RETURNS text[]
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN (SELECT coalesce(array_agg(q.queue ORDER BY q.queue), '{}')
              FROM queues AS q
             WHERE q.queue = ANY (capped_queues.queues)
               AND (q.max_active IS NOT NULL OR q.max_active_per_group IS NOT NULL));
END;
$$;
