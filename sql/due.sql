-- Jobs coming due without a producer: scheduled jobs whose run_at came are filed as pending, and active
-- jobs whose lease ran out are settled (out of attempts, or cancellation requested) or put back to pending
-- (a capped or fair queue, before its count). And when the next of these comes: the worker's poller sleeps
-- until then. The claims (claim.sql, fair.sql) call these from their floors; nothing here picks a job.

-- Expired leases of a capped queue, from its lease start, go back to pending before the count, so a job whose
-- lease expired counts towards the cap until this reclaim (the ledger files its -1) and a cap full of expired
-- leases frees its room. The expiry is recorded as _claim_take's reclaim records it, the next lease is a new
-- attempt; no status event (the job's next event is its lease). Returns the first of them in claim order.
CREATE OR REPLACE FUNCTION pgjobs._requeue_expired(queue text, since timestamptz,
                                                   OUT p smallint, OUT t timestamptz, OUT i bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    WITH upd AS (
        UPDATE jobs AS j
           SET state = 'pending',
               lease_token = NULL,
               lease_expires_at = NULL,
               errors = j.errors || jsonb_build_array(jsonb_build_object(
                            'attempt', j.attempt, 'at', now(), 'worker', j.leased_by, 'error', 'lease expired')),
               last_error = 'lease expired'
         WHERE j.id = ANY (ARRAY(
                   SELECT e.id FROM jobs AS e
                    WHERE e.state = 'active' AND e.queue = _requeue_expired.queue AND e.lease_expires_at >= since
                      AND e.lease_expires_at < now() AND e.attempt < e.max_attempts AND NOT e.cancel_requested
                    ORDER BY e.lease_expires_at
                    LIMIT 100
                      FOR UPDATE SKIP LOCKED))
           AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])  -- jobs_live only
        RETURNING j.priority, j.run_at, j.id
    )
    SELECT u.priority, u.run_at, u.id INTO p, t, i FROM upd AS u ORDER BY u.priority, u.run_at, u.id LIMIT 1;
END;
$$;

-- Due scheduled jobs of plain queues are filed as pending (oldest first, `how_many` per queue and call,
-- each queue's from its scheduled start `since`), so that claims read them from the pending index in claim
-- order. Read where they were, they had to be sorted by priority on every claim: a backlog of due retries,
-- or of jobs scheduled for one instant, made each claim cost O(due jobs) (80 ms per claim at 50,000 due).
-- While no more than `how_many` are due the order is exact; beyond, what was filed first goes first for a
-- few calls. This is bookkeeping, not a transition: a due scheduled job is claimable already (claim takes
-- it), so no status event and no wake is sent; a subscriber sees the job go from scheduled to active.
-- Returns, per queue, the first promoted job in claim order (its run_at may sort below the claim's floor).
CREATE OR REPLACE FUNCTION pgjobs._promote_scheduled(queues text[], how_many int,
                                                     since timestamptz[])
RETURNS TABLE (queue text, priority smallint, run_at timestamptz, id bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH due AS (
        SELECT d.id
          FROM unnest(queues, since) AS q(name, since)
         CROSS JOIN LATERAL (
               SELECT j.id FROM jobs AS j
                WHERE j.state = 'scheduled' AND j.queue = q.name AND j.run_at >= coalesce(q.since, '-infinity')
                  AND j.run_at <= now()
                ORDER BY j.run_at
                LIMIT how_many
                  FOR UPDATE SKIP LOCKED) AS d
         WHERE coalesce(q.since, '-infinity') <= now()
    ), upd AS (
        UPDATE jobs AS j SET state = 'pending'
         WHERE j.id = ANY (ARRAY(SELECT due.id FROM due)) AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
        RETURNING j.queue, j.priority, j.run_at, j.id
    )
    SELECT DISTINCT ON (u.queue) u.queue, u.priority, u.run_at, u.id FROM upd AS u
     ORDER BY u.queue, u.priority, u.run_at, u.id;
END;
$$;

-- Settles active jobs whose lease expired but that must not run again: out of attempts
-- (-> failed) or cancellation requested (-> cancelled), each queue's from its lease start `since` (NULL:
-- from the front). Bounded per call; SKIP LOCKED so two claimers never settle the same job.
CREATE OR REPLACE FUNCTION pgjobs._settle_expired(queues text[], since timestamptz[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_events jsonb;
    v_follow bigint[];
BEGIN
    -- Usually there is none, and the UPDATE's executor start alone, eight indexes to open, costs more than
    -- this probe.
    IF NOT EXISTS (SELECT 1 FROM unnest(queues, since) AS q(name, since)
                    CROSS JOIN LATERAL (
                          SELECT 1 FROM jobs AS j
                           WHERE j.state = 'active' AND j.queue = q.name AND j.lease_expires_at >= coalesce(q.since, '-infinity')
                             AND j.lease_expires_at < now() AND (j.attempt >= j.max_attempts OR j.cancel_requested)
                           LIMIT 1) AS x) THEN
        RETURN;
    END IF;
    WITH dead AS (
        SELECT d.id
          FROM unnest(queues, coalesce(since, array_fill('-infinity'::timestamptz, ARRAY[cardinality(queues)])))
               AS q(name, since)
         CROSS JOIN LATERAL (
               SELECT j.id FROM jobs AS j
                WHERE j.state = 'active' AND j.queue = q.name AND j.lease_expires_at >= q.since
                  AND j.lease_expires_at < now() AND (j.attempt >= j.max_attempts OR j.cancel_requested)
                LIMIT 100
                  FOR UPDATE SKIP LOCKED) AS d
    ), upd AS (
        UPDATE jobs AS j
           SET state = CASE WHEN j.cancel_requested THEN 'cancelled'::job_state ELSE 'failed' END,
               completed_at = now(),
               lease_token = NULL,
               lease_expires_at = NULL,
               last_error = CASE WHEN j.cancel_requested THEN j.last_error ELSE 'lease expired' END,
               errors = CASE WHEN j.cancel_requested THEN j.errors
                             ELSE j.errors || jsonb_build_array(jsonb_build_object(
                                      'attempt', j.attempt, 'at', now(), 'worker', j.leased_by,
                                      'error', 'lease expired')) END
         WHERE j.id = ANY (ARRAY(SELECT dead.id FROM dead)) AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
        RETURNING j.id, j.state, j.queue, j.kind, j.attempt, j.batch_id, j.has_dependents
    )
    SELECT jsonb_agg(jsonb_build_object('id', u.id, 'state', u.state, 'queue', u.queue, 'kind', u.kind,
                                        'attempt', u.attempt, 'batch_id', u.batch_id)),
           array_agg(u.id) FILTER (WHERE u.batch_id IS NOT NULL OR u.has_dependents)
      INTO v_events, v_follow
      FROM upd AS u;
    IF v_events IS NOT NULL THEN
        PERFORM _notify_status(v_events);
        IF v_follow IS NOT NULL THEN
            PERFORM set_config('plan_cache_mode', 'auto', true);  -- (claim.sql, "Plans": _propagate plans for itself)
            PERFORM _propagate(v_follow);
        END IF;
    END IF;
END;
$$;

-- The earliest run_at of a scheduled job or lease expiry of an active job of these queues in
-- [lo, hi] (NULL: none). One body for next_due_at and next_due_within. PL/pgSQL, not SQL: a SQL
-- function with SET clauses is planned again on every call (0.3 ms, ten times its run), a PL/pgSQL
-- one keeps its plan.
CREATE OR REPLACE FUNCTION pgjobs._next_due(queues text[], lo timestamptz, hi timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    RETURN (
        SELECT min(s.t) FROM (
            SELECT (SELECT min(j.run_at) FROM jobs AS j
                     WHERE j.state = 'scheduled' AND j.queue = q.name AND j.run_at BETWEEN lo AND hi) AS t
              FROM unnest(_next_due.queues) AS q(name)
            UNION ALL
            SELECT (SELECT min(j.lease_expires_at) FROM jobs AS j
                     WHERE j.state = 'active' AND j.queue = q.name AND j.lease_expires_at BETWEEN lo AND hi)
              FROM unnest(_next_due.queues) AS q(name)
            UNION ALL
            SELECT _rate_next_due(_next_due.queues, lo, hi)   -- a limited queue's next token (rate_limits.sql)
        ) AS s);
END;
$$;

-- When the next job of these queues becomes due (NULL if none is scheduled or leased), overdue ones
-- included.
CREATE OR REPLACE FUNCTION pgjobs.next_due_at(queues text[] DEFAULT '{default}')
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN _next_due(queues, '-infinity', 'infinity');
END;
$$;

-- What the worker's poller asks (pgjobs/runtime/listener.py): the next due time from now to `within`
-- later (NULL: none). The poller sleeps until then, or its poll interval (`within`), whichever is first.
-- next_due_at's min() reads jobs_active_idx from its front: under a held snapshot that is the old
-- 'active' entry of every job completed since (millions after minutes at thousands of jobs/s, each a
-- heap fetch), and the poller asked every few seconds: in bench/soak.py at 9,500 jobs/s, 10-17
-- million entries of jobs_active_idx visited per 10 s. Bounded to the window, a call visits only the
-- entries whose lease would run out in it (the jobs claimed a lease ago, over `within`). What is
-- overdue is not its business: a claim takes it, and the poller wakes every `within` anyway.
CREATE OR REPLACE FUNCTION pgjobs.next_due_within(queues text[], within interval)
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    -- (an upper bound too: now() + within must stay a timestamp)
    IF within IS NULL OR within <= interval '0' OR within > interval '100 years' THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('within must be a positive interval of at most 100 years, got %s',
                             coalesce(within::text, 'NULL'));
    END IF;
    RETURN _next_due(queues, v_now, v_now + within);
END;
$$;
