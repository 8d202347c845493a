-- Why a job is not running: explain(id) -> jsonb, {"reason": ..., ...details}.
--
-- The job's own state decides first: terminal, running (a lease that still holds), waiting_dependencies,
-- scheduled (run_at in the future). A job a claim could take by its state (pending, scheduled and due, or
-- active with a lapsed lease) then meets the gates a claim applies, in this order: paused, queue_cap,
-- group_cap, rate_limited, no_worker; the first that blocks is the reason. Past every gate it is
-- behind_others (claimable jobs ahead of it in claim order) or claimable (nothing holds it back). Each
-- family of reasons is one small function below, so a new gate is one function and one line in
-- _explain_gates. The gates that block besides the reason are listed under "also" (a scheduled job in a
-- paused queue: reason scheduled, also ["paused"]).
--
-- What it reads is what the claim reads (the queue's settings, its active jobs, the pending index in claim
-- order) plus the workers' heartbeats, in one snapshot; the answer is true of that snapshot. Every read is
-- bounded: jobs ahead are counted up to 1,000 ("at_least" beyond), parents listed up to 100.
-- Reads only: STABLE, callable by any role that may read a job's status (roles.sql).

CREATE OR REPLACE FUNCTION pgjobs.explain(id bigint)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    j      jobs;
    q      queues;
    v_out  jsonb;
    v_gate jsonb[];
BEGIN
    -- The live states first: by id alone the lookup probes every history partition's id index.
    SELECT * INTO j FROM jobs AS x
     WHERE x.id = explain.id AND x.state = ANY ('{waiting,scheduled,pending,active}'::job_state[]);
    IF NOT FOUND THEN
        SELECT * INTO j FROM jobs AS x WHERE x.id = explain.id;
        IF NOT FOUND THEN
            RETURN NULL;   -- reads of an unknown id return NULL, as job_status returns no row
        END IF;
    END IF;
    IF j.state IN ('succeeded', 'failed', 'cancelled') THEN
        RETURN _explain_terminal(j);
    ELSIF j.state = 'active' AND j.lease_expires_at > now() THEN
        RETURN _explain_running(j);
    END IF;
    SELECT * INTO q FROM queues AS c WHERE c.queue = j.queue;   -- no row: an unconfigured queue, no limits
    v_gate := _explain_gates(j, q);
    IF j.state = 'waiting' THEN
        v_out := _explain_dependencies(j) || _explain_parked(j);
    ELSIF j.state = 'scheduled' AND j.run_at > now() AND j.run_at IS DISTINCT FROM j.rate_held_until THEN
        -- (a job a rate limit held back is scheduled too, until its key's next token: rate_limited, a gate)
        v_out := _explain_scheduled(j) || _explain_parked(j);
    ELSIF cardinality(v_gate) > 0 THEN
        v_out := v_gate[1];
        v_gate := v_gate[2:];
    ELSE
        v_out := _explain_order(j, q);
    END IF;
    IF j.state = 'active' THEN
        -- A lapsed lease: the next claim takes the job over, or ends it (settles_as) when its cancellation
        -- was requested or it has no attempt left (_settle_expired, claim.sql).
        v_out := v_out || jsonb_build_object('lease_lapsed_at', j.lease_expires_at, 'last_worker', j.leased_by)
                 || CASE WHEN j.cancel_requested THEN '{"settles_as": "cancelled"}'::jsonb
                         WHEN j.attempt >= j.max_attempts THEN '{"settles_as": "failed"}'::jsonb
                         ELSE '{}' END;
    END IF;
    IF cardinality(v_gate) > 0 THEN
        v_out := v_out || jsonb_build_object('also', (SELECT jsonb_agg(g ->> 'reason') FROM unnest(v_gate) AS g));
    END IF;
    RETURN v_out;
END;
$$;

-- The gates that hold back a job whose state lets a claim take it, in the order the reason is chosen.
CREATE OR REPLACE FUNCTION pgjobs._explain_gates(j pgjobs.jobs, q pgjobs.queues)
RETURNS jsonb[]
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT array_remove(ARRAY[
        CASE WHEN q.paused THEN jsonb_build_object('reason', 'paused', 'queue', j.queue) END,
        _explain_queue_cap(j, q),
        _explain_group_cap(j, q),
        _explain_rate(j),   -- (rate_limits.sql)
        _explain_no_worker(j)
    ], NULL);
$$;

-- The error's own line: the last unindented line of a Python traceback (the exception), else the first
-- line; cut to 200 characters (the whole text is in job_status).
CREATE OR REPLACE FUNCTION pgjobs._explain_error(error text)
RETURNS text
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT CASE WHEN length(l.line) > 200 THEN left(l.line, 199) || '…' ELSE l.line END
      FROM (SELECT CASE WHEN strpos(error, 'Traceback (most recent call last):') > 0
                        THEN (SELECT t.line
                                FROM regexp_split_to_table(rtrim(error), E'\n') WITH ORDINALITY AS t(line, n)
                               WHERE t.line ~ '^\S' ORDER BY t.n DESC LIMIT 1)
                        ELSE split_part(error, E'\n', 1) END AS line) AS l;
$$;

CREATE OR REPLACE FUNCTION pgjobs._explain_terminal(j pgjobs.jobs)
RETURNS jsonb
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT jsonb_build_object('reason', 'terminal', 'state', j.state, 'completed_at', j.completed_at,
                              'attempt', j.attempt, 'max_attempts', j.max_attempts,
                              'last_error', _explain_error(j.last_error));
$$;

-- The lease holder and its end; never the lease token (it is the job's write capability). worker_live: the
-- holder heartbeats (NULL: it is not registered, as a worker that never sends a heartbeat).
CREATE OR REPLACE FUNCTION pgjobs._explain_running(j pgjobs.jobs)
RETURNS jsonb
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT jsonb_build_object('reason', 'running', 'worker', j.leased_by, 'lease_expires_at', j.lease_expires_at,
                              'attempt', j.attempt, 'max_attempts', j.max_attempts,
                              'cancel_requested', j.cancel_requested,
                              'worker_live', (SELECT _explain_live(w.last_seen, w.meta) FROM workers AS w
                                               WHERE w.id = j.leased_by));
$$;

-- The parents not settled yet (edges whose outcome is still open), with their states and triggers; up to
-- 100, "more" counting the rest. A sibling added by add_to_batch(..., before_continuations) is such an edge.
CREATE OR REPLACE FUNCTION pgjobs._explain_dependencies(j pgjobs.jobs)
RETURNS jsonb
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    WITH open AS (
        SELECT e.parent_job_id, e.parent_batch_id, e.trigger
          FROM edges AS e
         WHERE e.child_id = j.id AND e.satisfied IS NULL
         ORDER BY e.parent_job_id NULLS LAST, e.parent_batch_id
         LIMIT 101
    ), shown AS (
        SELECT o.*, row_number() OVER (ORDER BY o.parent_job_id NULLS LAST, o.parent_batch_id) AS n FROM open AS o
    )
    SELECT jsonb_build_object(
               'reason', 'waiting_dependencies', 'remaining', j.remaining_deps,
               'waiting_on', coalesce(jsonb_agg(
                   CASE WHEN s.parent_job_id IS NOT NULL
                        THEN jsonb_build_object('job', s.parent_job_id, 'on', s.trigger,
                                                'state', _explain_parent_state(s.parent_job_id))
                        ELSE (SELECT jsonb_build_object('batch', b.id, 'on', s.trigger, 'state', b.state,
                                                        'pending', b.pending, 'total', b.total)
                                FROM batches AS b WHERE b.id = s.parent_batch_id) END
                   ORDER BY s.n) FILTER (WHERE s.n <= 100), '[]'))
           || CASE WHEN count(*) > 100
                   THEN jsonb_build_object('more', (SELECT count(*) FROM edges AS e
                                                     WHERE e.child_id = j.id AND e.satisfied IS NULL) - 100)
                   ELSE '{}' END
      FROM shown AS s;
$$;

-- An open edge's parent is live (but for a race with its end): looked up there first, not in every history
-- partition.
CREATE OR REPLACE FUNCTION pgjobs._explain_parent_state(id bigint)
RETURNS pgjobs.job_state
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT coalesce((SELECT p.state FROM jobs AS p
                      WHERE p.id = _explain_parent_state.id
                        AND p.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])),
                    (SELECT p.state FROM jobs AS p WHERE p.id = _explain_parent_state.id));
$$;

-- A job parked by durable execution (sql/durable.sql) waits or is scheduled for a reason of its own: a
-- sleep (until its end) or a wait for a signal (until the signal or the timeout). {"parked": {...}} then,
-- else nothing, so the reason stays the state's (waiting_dependencies, scheduled) with its usual details.
CREATE OR REPLACE FUNCTION pgjobs._explain_parked(j pgjobs.jobs)
RETURNS jsonb
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT coalesce((SELECT jsonb_build_object('parked', jsonb_build_object(
                                'name', w.name, 'kind', CASE WHEN w.key IS NULL THEN 'sleep' ELSE 'signal' END,
                                'key', w.key, 'since', w.since, 'until', w.until))
                       FROM job_waits AS w
                      WHERE w.job_id = j.id AND w.resolved_at IS NULL
                      ORDER BY w.since DESC
                      LIMIT 1), '{}');
$$;

-- run_at in the future: the first run's time, or a retry's backoff (attempt > 0, with the error that
-- caused it).
CREATE OR REPLACE FUNCTION pgjobs._explain_scheduled(j pgjobs.jobs)
RETURNS jsonb
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT jsonb_build_object('reason', 'scheduled', 'run_at', j.run_at, 'retry', j.attempt > 0,
                              'attempt', j.attempt, 'max_attempts', j.max_attempts)
           || CASE WHEN j.attempt > 0 AND j.last_error IS NOT NULL
                   THEN jsonb_build_object('last_error', _explain_error(j.last_error)) ELSE '{}' END;
$$;

-- max_active: the claim counts the queue's active jobs whose lease holds (a lapsed one is made pending, or
-- settled on its last attempt, before the count: _requeue_expired, _settle_expired), so this does.
CREATE OR REPLACE FUNCTION pgjobs._explain_queue_cap(j pgjobs.jobs, q pgjobs.queues)
RETURNS jsonb
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT jsonb_build_object('reason', 'queue_cap', 'queue', j.queue, 'active', a.n, 'max_active', q.max_active)
      FROM (SELECT count(*) AS n FROM jobs AS x
             WHERE x.state = 'active' AND x.queue = j.queue AND x.lease_expires_at >= now()) AS a
     WHERE q.max_active IS NOT NULL AND a.n >= q.max_active;
$$;

CREATE OR REPLACE FUNCTION pgjobs._explain_group_cap(j pgjobs.jobs, q pgjobs.queues)
RETURNS jsonb
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT jsonb_build_object('reason', 'group_cap', 'queue', j.queue, 'group_key', j.group_key, 'active', a.n,
                              'max_active_per_group', q.max_active_per_group)
      FROM (SELECT count(*) AS n FROM jobs AS x
             WHERE x.state = 'active' AND x.queue = j.queue AND x.group_key = j.group_key
               AND x.lease_expires_at >= now()) AS a
     WHERE q.max_active_per_group IS NOT NULL AND j.group_key IS NOT NULL AND a.n >= q.max_active_per_group;
$$;

-- A worker is live while it heartbeats: seen within three of its own heartbeat intervals (from its meta,
-- else 10 s), the rule list_workers calls 'live'.
CREATE OR REPLACE FUNCTION pgjobs._explain_live(last_seen timestamptz, meta jsonb)
RETURNS boolean
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT last_seen >= now() - make_interval(secs => 3 * coalesce(_heartbeat_seconds(meta), 10));
$$;

-- Whether a worker's meta lists a name (its "queues": an object keyed by queue, as the Python worker sends,
-- or an array; its "kinds": an array). A worker whose meta does not say serves any: only a list that leaves
-- the name out is an answer.
CREATE OR REPLACE FUNCTION pgjobs._explain_lists(list jsonb, name text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT CASE WHEN jsonb_typeof(list) IN ('object', 'array') THEN list ? name ELSE true END;
$$;

-- No live worker claims from the job's queue, or none of those handles its kind (judged from heartbeats: a
-- worker that never heartbeats is not seen). last_seen: the newest heartbeat of a registered worker that
-- would take the job, now stale (a crashed one), if any.
CREATE OR REPLACE FUNCTION pgjobs._explain_no_worker(j pgjobs.jobs)
RETURNS jsonb
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT jsonb_build_object('reason', 'no_worker', 'queue', j.queue, 'kind', j.kind,
                              'live_workers', count(*) FILTER (WHERE s.live),
                              'queue_workers', count(*) FILTER (WHERE s.live AND s.queue_ok),
                              'last_seen', max(s.last_seen) FILTER (WHERE s.queue_ok AND s.kind_ok))
      FROM (SELECT w.last_seen, _explain_live(w.last_seen, w.meta) AS live,
                   _explain_lists(w.meta -> 'queues', j.queue) AS queue_ok,
                   _explain_lists(w.meta -> 'kinds', j.kind) AS kind_ok
              FROM workers AS w) AS s
    HAVING count(*) FILTER (WHERE s.live AND s.queue_ok AND s.kind_ok) = 0;
$$;

-- Past every gate: how many claimable jobs a claim of the queue takes before this one, counted up to
-- 1,000. Claim order (priority, run_at, id) over what the claim takes: the queue's pending jobs, its due
-- scheduled ones and its lapsed leases with attempts left, less the jobs of groups at their cap (the claim
-- passes them over); on a fair queue groups take turns, so what is ahead is the job's own group's work (the
-- ungrouped jobs are one group). A grouped job's pending work on a fair queue is a range of jobs_group_idx,
-- the others' a range of jobs_pending_idx; the jobs passed over on the way (of groups at their cap; of other
-- groups, for an ungrouped job on a fair queue) are read as the capped claim reads them.
CREATE OR REPLACE FUNCTION pgjobs._explain_order(j pgjobs.jobs, q pgjobs.queues)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_fair    boolean := coalesce(q.fair, false);
    v_blocked text[] := '{}';
    v_ahead   bigint;
    v_due     bigint;
BEGIN
    IF q.max_active_per_group IS NOT NULL AND NOT v_fair THEN
        SELECT coalesce(array_agg(a.g), '{}') INTO v_blocked
          FROM (SELECT x.group_key AS g FROM jobs AS x
                 WHERE x.state = 'active' AND x.queue = j.queue AND x.group_key IS NOT NULL
                   AND x.lease_expires_at >= now()
                 GROUP BY x.group_key HAVING count(*) >= q.max_active_per_group) AS a;
    END IF;
    IF v_fair AND j.group_key IS NOT NULL THEN
        SELECT count(*) INTO v_ahead
          FROM (SELECT 1 FROM jobs AS x
                 WHERE x.state = 'pending' AND x.queue = j.queue AND x.group_key = j.group_key
                   AND (x.priority, x.run_at, x.id) < (j.priority, j.run_at, j.id)
                 LIMIT 1001) AS a;
    ELSE
        SELECT count(*) INTO v_ahead
          FROM (SELECT 1 FROM jobs AS x
                 WHERE x.state = 'pending' AND x.queue = j.queue
                   AND (x.priority, x.run_at, x.id) < (j.priority, j.run_at, j.id)
                   AND CASE WHEN v_fair THEN x.group_key IS NULL
                            ELSE x.group_key IS NULL OR x.group_key <> ALL (v_blocked) END
                 LIMIT 1001) AS a;
    END IF;
    -- Due scheduled jobs and lapsed leases: few, and made pending (or taken over) by the next claim.
    SELECT count(*) INTO v_due
      FROM (SELECT 1 FROM jobs AS x
             WHERE ((x.state = 'scheduled' AND x.queue = j.queue AND x.run_at <= now())
                    OR (x.state = 'active' AND x.queue = j.queue AND x.lease_expires_at < now()
                        AND x.attempt < x.max_attempts AND NOT x.cancel_requested))
               AND (x.priority, x.run_at, x.id) < (j.priority, j.run_at, j.id)
               AND CASE WHEN v_fair THEN x.group_key IS NOT DISTINCT FROM j.group_key
                        ELSE x.group_key IS NULL OR x.group_key <> ALL (v_blocked) END
             LIMIT 1001) AS a;
    v_ahead := v_ahead + v_due;
    IF v_ahead = 0 THEN
        RETURN jsonb_build_object('reason', 'claimable', 'queue', j.queue);
    END IF;
    RETURN jsonb_build_object('reason', 'behind_others', 'queue', j.queue, 'ahead', least(v_ahead, 1000),
                              'at_least', v_ahead > 1000, 'fair', v_fair)
           || CASE WHEN v_fair THEN jsonb_build_object('group_key', j.group_key) ELSE '{}' END;
END;
$$;
