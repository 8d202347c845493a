-- Doing work: what a worker calls on a job it has claimed. The lease token makes every call a
-- compare-and-set: a call whose token no longer holds the job (reclaimed after its lease
-- expired, cancelled, already finished) changes nothing and returns false/NULL. That is a
-- benign outcome the caller expects, never an error.
--
-- A requested cancellation (cancel() on a running job sets cancel_requested) decides how the attempt
-- ends, whichever call ends it: complete, complete_many, fail, dead_letter and release all end such a
-- job `cancelled` (complete keeps the result it was given; the job's success continuations are
-- cancelled like any cancelled parent's), and ack_cancel ends a job `cancelled` only when its
-- cancellation was requested: without a request it returns false and changes nothing (a forged
-- pgjobs_cancel notification then cannot end a job). The call still returns true / the new state: the
-- token held the job and the attempt ended.
--
-- Plans: every compare-and-set below finds its row by primary key and tests `state::text =
-- 'active'`. Written as `state = 'active'`, the test would let the planner read the partial
-- index of active jobs (jobs_active_idx) from end to end, filtering on id, whenever the
-- statistics say few jobs are active (right after an ANALYZE of an idle queue): a cost that
-- grows with every running job. Through text the partial index does not apply, so the plan
-- stays on jobs_pkey.
--
-- Partitions (sql/history.sql): each of those statements also says `state = ANY
-- ('{waiting,scheduled,pending,active}')`, a constant that prunes it to jobs_live at plan time (a
-- generic plan, so not from a parameter), and that no partial index's predicate is implied by. A call that
-- waited on a row which the lock holder then moved to history (completed it, or settled its expired
-- lease) gets SQLSTATE 40001 "tuple to be locked was already moved to another partition": the job left
-- jobs_live, so the token no longer holds it, and the call answers so (false/NULL, or the statement again
-- for the calls on many jobs). _moved() tells that error from other serialization failures.
--
-- Plans: the hot functions here run with plan_cache_mode = force_generic_plan (their statements'
-- shapes are fixed by index order and keys, and planning each call cost more than running it)
-- and jit = off (a generic plan cannot see that LIMIT max_jobs is small, so on a big table its
-- cost passes jit_above_cost, and JIT compiled every claim: 25 ms per claim at 1M pending jobs).
-- That setting would carry into the functions they call in other files (graph, fair), so a call
-- into those first restores the planner's default choice for the rest of the function
-- (set_config(..., true) inside a function with a SET clause ends with the function).

-- Retry delay after `attempt` failed: exponential (1 s, 2 s, 4 s ...) with +/-25 % jitter so a
-- burst of failures does not come back as a burst, capped at one hour.
-- (PL/pgSQL: a SQL function with SET clauses is planned again on every call.)
CREATE OR REPLACE FUNCTION pgjobs.retry_backoff(attempt int)
RETURNS interval
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN make_interval(secs => least(3600.0,
                                       power(2, least(greatest(attempt, 1) - 1, 30)) * (0.75 + random() * 0.5)));
END;
$$;

CREATE OR REPLACE FUNCTION pgjobs._check_lease(lease interval)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    IF lease IS NULL OR lease <= interval '0' OR lease > interval '100 years' THEN  -- (limits: checks.sql)
        PERFORM _check_interval('lease', lease, positive => true);
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION pgjobs.renew_lease(id bigint, lease_token uuid, lease interval DEFAULT '30 seconds')
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    PERFORM _check_lease(lease);
    -- SKIP LOCKED (see renew_leases): a row someone holds is not waited for, it is reported held when
    -- its last committed version still is.
    BEGIN
        UPDATE jobs AS j SET lease_expires_at = now() + renew_lease.lease
         WHERE j.id = (SELECT l.id FROM jobs AS l
                        WHERE l.id = renew_lease.id AND l.lease_token = renew_lease.lease_token
                          AND l.state::text = 'active' AND l.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
                          FOR NO KEY UPDATE SKIP LOCKED)
           AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[]);
        IF FOUND THEN
            RETURN true;
        END IF;
    EXCEPTION WHEN serialization_failure THEN
        -- moved to history after our snapshot (ended): not held any more
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE;
        END IF;
        RETURN false;
    END;
    RETURN EXISTS (SELECT 1 FROM jobs AS j
                    WHERE j.id = renew_lease.id AND j.lease_token = renew_lease.lease_token
                      AND j.state::text = 'active' AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[]));
END;
$$;

-- Batched renewal for a worker's running jobs (one round trip). Returns the jobs still held,
-- with their cancel_requested flag (the poll fallback for a missed pgjobs_cancel) and whether
-- this call renewed them (renewed = false: busy, see below).
--
-- It never waits for a row lock (SKIP LOCKED). The worker renews every job it holds, in claim
-- order, while its completer ends some of the same jobs in finishing order: two multi-row
-- statements waiting for each other's rows in opposite orders were a deadlock (40P01, seen in the
-- soak runs). A job whose row another transaction holds is not renewed this time and comes back
-- with renewed = false ("busy": its end may be on its way, or a cancel, a checkpoint; the lease
-- still runs, ask again) and its last committed cancel_requested (never NULL: typed clients read it
-- as a boolean), never left out: left out means the token no longer holds the job
-- (ended, or reclaimed elsewhere), and a caller that took a busy job for lost would drop the
-- outcome of an attempt that is ending normally. The busy rows are read in a statement of their
-- own, after the renewal: a job whose end committed meanwhile is then left out, as it should be.
-- Not waiting also matters once jobs is partitioned by state: a completion moves the row, and a
-- statement that waited for it fails with 40001 instead of re-checking it. (A move that committed
-- after this statement's snapshot still raises 40001 here, SKIP LOCKED or not: callers retry; the
-- worker treats 40001 and 40P01 from every call as transient.)
CREATE OR REPLACE FUNCTION pgjobs.renew_leases(ids bigint[], lease_tokens uuid[], lease interval DEFAULT '30 seconds')
RETURNS TABLE (id bigint, cancel_requested boolean, renewed boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_ids    bigint[];
    v_cancel boolean[];
BEGIN
    PERFORM _check_lease(lease);
    PERFORM _check_pairs(ids, lease_tokens);
    -- Locked in id order (under SKIP LOCKED no order can deadlock; it keeps the rule simple: every
    -- multi-row lock in pgjobs is taken in id order). A row moved to history after this statement's
    -- snapshot is not locked but still raises 40001 when locked (sql/history.sql): the statement again
    -- (its rows go to arrays first, so a failed turn returned nothing), where that job is left out.
    FOR i IN 1..20 LOOP
        BEGIN
            WITH mine AS (
                SELECT j.id FROM unnest(ids, lease_tokens) AS t(id, tok) JOIN jobs AS j ON j.id = t.id
                 WHERE j.lease_token = t.tok AND j.state::text = 'active'
                   AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
                 ORDER BY j.id
                   FOR NO KEY UPDATE OF j SKIP LOCKED
            ), upd AS (
                UPDATE jobs AS j SET lease_expires_at = now() + renew_leases.lease
                 WHERE j.id = ANY (ARRAY(SELECT mine.id FROM mine))
                   AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
                RETURNING j.id, j.cancel_requested
            )
            SELECT array_agg(u.id), array_agg(u.cancel_requested) INTO v_ids, v_cancel FROM upd AS u;
            EXIT;
        EXCEPTION WHEN serialization_failure THEN
            PERFORM _lost_race(i, SQLERRM);  -- (sql/history.sql, ROW MOVEMENT)
        END;
    END LOOP;
    RETURN QUERY SELECT r.id, r.c, true FROM unnest(v_ids, v_cancel) AS r(id, c);
    -- The busy ones (see above), read only when something was not renewed: usually all was.
    IF coalesce(cardinality(v_ids), 0) < cardinality(ids) THEN
        RETURN QUERY
        SELECT DISTINCT j.id, j.cancel_requested, false
          FROM unnest(ids, lease_tokens) AS t(id, tok) JOIN jobs AS j ON j.id = t.id
         WHERE j.lease_token = t.tok AND j.state::text = 'active'
           AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
           AND j.id <> ALL (coalesce(v_ids, '{}'));
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION pgjobs._check_pairs(ids bigint[], lease_tokens uuid[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    PERFORM _check_array('ids', ids);
    PERFORM _check_array('lease_tokens', lease_tokens);
    IF ids IS NULL OR lease_tokens IS NULL
       OR coalesce(cardinality(ids), 0) <> coalesce(cardinality(lease_tokens), 0) THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('ids and lease_tokens must be arrays of the same length, got %s ids and %s tokens',
                             coalesce(cardinality(ids)::text, 'NULL'), coalesce(cardinality(lease_tokens)::text, 'NULL'));
    END IF;
END;
$$;

-- Saved state for the next attempt (kept across reclaims and retries).
CREATE OR REPLACE FUNCTION pgjobs.checkpoint(id bigint, lease_token uuid, checkpoint jsonb)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_done boolean;
BEGIN
    FOR i IN 1..20 LOOP
        BEGIN
            UPDATE jobs SET checkpoint = checkpoint.checkpoint
             WHERE id = checkpoint.id AND lease_token = checkpoint.lease_token AND state::text = 'active' AND state = ANY ('{waiting,scheduled,pending,active}'::job_state[]);
            v_done := FOUND;
            EXIT;
        EXCEPTION WHEN serialization_failure THEN
            -- A lost race (sql/history.sql, ROW MOVEMENT): again while the token still holds the job.
            IF NOT _lost_race_on_token(i, SQLERRM, checkpoint.id, checkpoint.lease_token) THEN
                RETURN false;
            END IF;
        END;
    END LOOP;
    RETURN v_done;  -- (not FOUND: the loop sets that)
END;
$$;

-- Progress is stored and logged as a status event (state 'active') carrying the progress value.
CREATE OR REPLACE FUNCTION pgjobs.progress(id bigint, lease_token uuid, progress jsonb)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_job record;
BEGIN
    FOR i IN 1..20 LOOP
        BEGIN
            UPDATE jobs AS j SET progress = progress.progress
             WHERE j.id = progress.id AND j.lease_token = progress.lease_token AND j.state::text = 'active' AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
            RETURNING j.id, j.state, j.queue, j.kind, j.attempt, j.batch_id INTO v_job;
            EXIT;
        EXCEPTION WHEN serialization_failure THEN
            -- A lost race (sql/history.sql, ROW MOVEMENT): again while the token still holds the job.
            IF NOT _lost_race_on_token(i, SQLERRM, progress.id, progress.lease_token) THEN
                RETURN false;
            END IF;
        END;
    END LOOP;
    IF v_job.id IS NULL THEN  -- (not FOUND: the loop sets that)
        RETURN false;
    END IF;
    PERFORM _log_event(v_job.id, v_job.state, v_job.queue, v_job.kind, v_job.attempt, v_job.batch_id,
                       progress.progress);
    RETURN true;
END;
$$;

CREATE OR REPLACE FUNCTION pgjobs.complete(id bigint, lease_token uuid, result jsonb DEFAULT NULL,
                                           continuations jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_job record;
BEGIN
    FOR i IN 1..20 LOOP
        BEGIN
            UPDATE jobs AS j
               SET state = CASE WHEN j.cancel_requested THEN 'cancelled'::job_state ELSE 'succeeded' END,
                   completed_at = now(), result = complete.result,
                   lease_token = NULL, lease_expires_at = NULL
             WHERE j.id = complete.id AND j.lease_token = complete.lease_token AND j.state::text = 'active' AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
            RETURNING j.id, j.state, j.queue, j.kind, j.attempt, j.batch_id, j.has_dependents INTO v_job;
            EXIT;
        EXCEPTION WHEN serialization_failure THEN
            -- A lost race (sql/history.sql, ROW MOVEMENT): again while the token still holds the job.
            IF NOT _lost_race_on_token(i, SQLERRM, complete.id, complete.lease_token) THEN
                RETURN false;
            END IF;
        END;
    END LOOP;
    IF v_job.id IS NULL THEN  -- (not FOUND: the loop sets that)
        RETURN false;
    END IF;
    PERFORM _log_event(v_job.id, v_job.state, v_job.queue, v_job.kind, v_job.attempt, v_job.batch_id);
    PERFORM _wake_capped(ARRAY[v_job.queue]);  -- room under a cap (sql/wakeups.sql)
    -- (a cancelled job adds no continuations: what it would have started was cancelled with it)
    IF continuations IS NOT NULL AND v_job.state = 'succeeded' THEN
        PERFORM set_config('plan_cache_mode', 'auto', true);  -- see the note at the top of this file
        PERFORM _add_continuations(v_job.id, continuations);
        v_job.has_dependents := true;
    END IF;
    IF v_job.batch_id IS NOT NULL OR v_job.has_dependents THEN
        PERFORM set_config('plan_cache_mode', 'auto', true);  -- see the note at the top of this file
        PERFORM _propagate(ARRAY[v_job.id]);
    END IF;
    RETURN true;
END;
$$;

-- The hot path: completes many jobs in one statement; returns how many it completed
-- (pairs whose token no longer holds the job are skipped). `results` optionally parallels ids.
CREATE OR REPLACE FUNCTION pgjobs.complete_many(ids bigint[], lease_tokens uuid[], results jsonb[] DEFAULT NULL)
RETURNS int
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
-- No sequential scan of jobs_live: on a small or new table (no statistics) the generic plan otherwise read it
-- from end to end as the join's outer side, locking rows in their physical order, not in id order (below).
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_ids      bigint[];
    v_states   job_state[];
    v_queues   text[];
    v_kinds    text[];
    v_attempts int[];
    v_batches  bigint[];
    v_follow   bigint[];
BEGIN
    IF ids IS NULL OR lease_tokens IS NULL OR cardinality(ids) <> cardinality(lease_tokens)
       OR array_ndims(ids) > 1 OR array_ndims(lease_tokens) > 1 OR array_ndims(results) > 1 THEN
        PERFORM _check_pairs(ids, lease_tokens);
        PERFORM _check_array('results', results);
    END IF;
    IF results IS NOT NULL AND cardinality(results) <> cardinality(ids) THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('results must parallel ids: got %s results for %s ids', cardinality(results), cardinality(ids));
    END IF;
    -- A row that moved to history while we waited on it (see the header) fails the statement: again, and
    -- that row is not active any more (at most a few turns: each is another job ended under our feet).
    FOR i IN 1..20 LOOP
        BEGIN
            WITH upd AS (
                UPDATE jobs AS j
                   SET state = CASE WHEN j.cancel_requested THEN 'cancelled'::job_state ELSE 'succeeded' END,
                       completed_at = now(), result = t.res,
                       lease_token = NULL, lease_expires_at = NULL
                  -- In id order: the plan is a nested loop driven by this list (one jobs_pkey probe per
                  -- pair, tests/sql/test_claim_plan.py), so it locks the rows in the list's order. The
                  -- worker's batch is in finishing order; another statement locking some of the same jobs
                  -- in another order (cancel_batch, a client's own complete_many) waited for our rows
                  -- while we waited for theirs: a deadlock. In id order, one waits for the other. (A
                  -- separate locking SELECT ... ORDER BY id FOR UPDATE would guarantee the order whatever
                  -- the plan, for a lock WAL record and ~5 buffer hits more per job: +40 % buffers.)
                  FROM (SELECT * FROM unnest(ids, lease_tokens, results) AS u(id, tok, res) ORDER BY u.id) AS t
                 WHERE j.id = t.id AND j.lease_token = t.tok AND j.state::text = 'active' AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
                RETURNING j.id, j.state, j.queue, j.kind, j.attempt, j.batch_id, j.has_dependents
            )
            SELECT array_agg(u.id), array_agg(u.state), array_agg(u.queue), array_agg(u.kind), array_agg(u.attempt),
                   array_agg(u.batch_id), array_agg(u.id) FILTER (WHERE u.batch_id IS NOT NULL OR u.has_dependents)
              INTO v_ids, v_states, v_queues, v_kinds, v_attempts, v_batches, v_follow
              FROM upd AS u;
            EXIT;
        EXCEPTION WHEN serialization_failure THEN
            PERFORM _lost_race(i, SQLERRM);  -- (sql/history.sql, ROW MOVEMENT)
        END;
    END LOOP;
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    -- The status events: one append to the event log (stream.sql; status_events filtered there).
    PERFORM _log_events(v_ids, v_states, v_queues, v_kinds, v_attempts, v_batches);
    PERFORM _wake_capped(v_queues);  -- room under a cap (sql/wakeups.sql): one wake per capped queue
    IF v_follow IS NOT NULL THEN
        PERFORM set_config('plan_cache_mode', 'auto', true);  -- see the note at the top of this file
        PERFORM _propagate(v_follow);
    END IF;
    RETURN cardinality(v_ids);
END;
$$;

-- Ends an attempt with an error. With attempts left the job comes back at retry_at, or after
-- retry_backoff(attempt): 'pending' when that is now or past, else 'scheduled'. Out of
-- attempts it is 'failed'. A job whose cancellation was requested ends 'cancelled'.
-- Returns the new state, or NULL when the token no longer holds the job.
CREATE OR REPLACE FUNCTION pgjobs.fail(id bigint, lease_token uuid, error text, retry_at timestamptz DEFAULT NULL)
RETURNS pgjobs.job_state
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    IF fail.retry_at IS NOT NULL THEN
        PERFORM _check_time('retry_at', fail.retry_at);
    END IF;
    RETURN _end_attempt(fail.id, fail.lease_token, fail.error, fail.retry_at, false);
END;
$$;

-- Terminal failure now, whatever attempts are left.
CREATE OR REPLACE FUNCTION pgjobs.dead_letter(id bigint, lease_token uuid, error text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN _end_attempt(dead_letter.id, dead_letter.lease_token, dead_letter.error, NULL, true) IS NOT NULL;
END;
$$;

CREATE OR REPLACE FUNCTION pgjobs._end_attempt(id bigint, lease_token uuid, error text, retry_at timestamptz,
                                               final boolean)
RETURNS pgjobs.job_state
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_job record;
BEGIN
    -- The next run time is drawn once (the backoff is random) in a subquery on the same row.
    FOR i IN 1..20 LOOP
        BEGIN
            UPDATE jobs AS j
               SET state = CASE WHEN j.cancel_requested THEN 'cancelled'::job_state
                                WHEN final OR j.attempt >= j.max_attempts THEN 'failed'
                                WHEN n.next_at <= now() THEN 'pending'
                                ELSE 'scheduled' END,
                   run_at = CASE WHEN j.cancel_requested OR final OR j.attempt >= j.max_attempts THEN j.run_at
                                 ELSE greatest(n.next_at, now()) END,
                   completed_at = CASE WHEN j.cancel_requested OR final OR j.attempt >= j.max_attempts THEN now() END,
                   last_error = coalesce(_end_attempt.error, 'unknown error'),
                   errors = j.errors || jsonb_build_array(jsonb_build_object(
                                'attempt', j.attempt, 'at', now(), 'worker', j.leased_by,
                                'error', coalesce(_end_attempt.error, 'unknown error'))),
                   lease_token = NULL, lease_expires_at = NULL
              FROM (SELECT coalesce(_end_attempt.retry_at, now() + retry_backoff(c.attempt)) AS next_at
                      FROM jobs AS c WHERE c.id = _end_attempt.id AND c.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])) AS n
             WHERE j.id = _end_attempt.id AND j.lease_token = _end_attempt.lease_token AND j.state::text = 'active' AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
            RETURNING j.id, j.state, j.queue, j.kind, j.attempt, j.batch_id, j.has_dependents INTO v_job;
            EXIT;
        EXCEPTION WHEN serialization_failure THEN
            -- A lost race (sql/history.sql, ROW MOVEMENT): again while the token still holds the job.
            IF NOT _lost_race_on_token(i, SQLERRM, _end_attempt.id, _end_attempt.lease_token) THEN
                RETURN NULL;
            END IF;
        END;
    END LOOP;
    IF v_job.id IS NULL THEN  -- (not FOUND: the loop sets that)
        RETURN NULL;
    END IF;
    IF v_job.state = 'pending' THEN
        PERFORM pg_notify('pgjobs_wake', v_job.queue);
    ELSE
        PERFORM _wake_capped(ARRAY[v_job.queue]);  -- room under a cap (sql/wakeups.sql)
    END IF;
    PERFORM _log_event(v_job.id, v_job.state, v_job.queue, v_job.kind, v_job.attempt, v_job.batch_id);
    IF v_job.state IN ('failed', 'cancelled') AND (v_job.batch_id IS NOT NULL OR v_job.has_dependents) THEN
        PERFORM set_config('plan_cache_mode', 'auto', true);  -- see the note at the top of this file
        PERFORM _propagate(ARRAY[v_job.id]);
    END IF;
    RETURN v_job.state;
END;
$$;

-- Gives the job back unfinished, claimable at once or at run_at, and refunds the attempt.
CREATE OR REPLACE FUNCTION pgjobs.release(id bigint, lease_token uuid, run_at timestamptz DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_job record;
BEGIN
    IF release.run_at IS NOT NULL THEN
        PERFORM _check_time('run_at', release.run_at);
    END IF;
    FOR i IN 1..20 LOOP
        BEGIN
            UPDATE jobs AS j
               SET state = CASE WHEN j.cancel_requested THEN 'cancelled'::job_state
                                WHEN release.run_at > now() THEN 'scheduled'
                                ELSE 'pending' END,
                   run_at = CASE WHEN j.cancel_requested THEN j.run_at ELSE greatest(coalesce(release.run_at, now()), now()) END,
                   completed_at = CASE WHEN j.cancel_requested THEN now() END,
                   attempt = greatest(j.attempt - 1, 0),
                   lease_token = NULL, lease_expires_at = NULL
             WHERE j.id = release.id AND j.lease_token = release.lease_token AND j.state::text = 'active' AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
            RETURNING j.id, j.state, j.queue, j.kind, j.attempt, j.batch_id, j.has_dependents INTO v_job;
            EXIT;
        EXCEPTION WHEN serialization_failure THEN
            -- A lost race (sql/history.sql, ROW MOVEMENT): again while the token still holds the job.
            IF NOT _lost_race_on_token(i, SQLERRM, release.id, release.lease_token) THEN
                RETURN false;
            END IF;
        END;
    END LOOP;
    IF v_job.id IS NULL THEN  -- (not FOUND: the loop sets that)
        RETURN false;
    END IF;
    IF v_job.state = 'pending' THEN
        PERFORM pg_notify('pgjobs_wake', v_job.queue);
    ELSE
        PERFORM _wake_capped(ARRAY[v_job.queue]);  -- room under a cap (sql/wakeups.sql)
    END IF;
    PERFORM _log_event(v_job.id, v_job.state, v_job.queue, v_job.kind, v_job.attempt, v_job.batch_id);
    IF v_job.state = 'cancelled' AND (v_job.batch_id IS NOT NULL OR v_job.has_dependents) THEN
        PERFORM set_config('plan_cache_mode', 'auto', true);  -- see the note at the top of this file
        PERFORM _propagate(ARRAY[v_job.id]);
    END IF;
    RETURN true;
END;
$$;

-- A worker acknowledges a requested cancellation: the running job ends 'cancelled'. Without a request
-- (cancel_requested false) it returns false and the job runs on under its lease.
CREATE OR REPLACE FUNCTION pgjobs.ack_cancel(id bigint, lease_token uuid)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_job record;
BEGIN
    FOR i IN 1..20 LOOP
        BEGIN
            UPDATE jobs AS j
               SET state = 'cancelled', completed_at = now(), lease_token = NULL, lease_expires_at = NULL,
                   cancel_requested = true
             WHERE j.id = ack_cancel.id AND j.lease_token = ack_cancel.lease_token AND j.state::text = 'active' AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
               AND j.cancel_requested  -- only a requested cancellation: a forged pgjobs_cancel must end nothing
            RETURNING j.id, j.queue, j.kind, j.attempt, j.batch_id, j.has_dependents INTO v_job;
            EXIT;
        EXCEPTION WHEN serialization_failure THEN
            -- A lost race (sql/history.sql, ROW MOVEMENT): again while the token still holds the job.
            IF NOT _lost_race_on_token(i, SQLERRM, ack_cancel.id, ack_cancel.lease_token) THEN
                RETURN false;
            END IF;
        END;
    END LOOP;
    IF v_job.id IS NULL THEN  -- (not FOUND: the loop sets that)
        RETURN false;
    END IF;
    PERFORM _log_event(v_job.id, 'cancelled'::job_state, v_job.queue, v_job.kind, v_job.attempt, v_job.batch_id);
    PERFORM _wake_capped(ARRAY[v_job.queue]);  -- room under a cap (sql/wakeups.sql)
    IF v_job.batch_id IS NOT NULL OR v_job.has_dependents THEN
        PERFORM set_config('plan_cache_mode', 'auto', true);  -- see the note at the top of this file
        PERFORM _propagate(ARRAY[v_job.id]);
    END IF;
    RETURN true;
END;
$$;
