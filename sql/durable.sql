-- Durable execution: steps that run once, sleeps and signal waits that hold no slot, and signals
-- callable from any language (docs/durable-execution.md).
--
-- A handler is replayed from its start by every attempt; what it already did is recorded here, by name:
--   job_steps  a step's JSON result, inserted in the transaction that proves the lease token holds the
--              job (record_step); the next attempt reads it (job_steps()) instead of running the step.
--   job_waits  a sleep (key NULL) or a wait for a signal on `key`: open while the job is parked, resolved
--              once ('slept', 'signal' with its payload, or 'timeout'). Calling sleep_until/await_signal
--              again with the same name after the job resumes returns that outcome: that is the resume.
--   signals    signals sent while no job waited on their key, kept until `expires_at` for the first
--              job that waits on the key (one signal per wait, oldest first), then deleted.
--
-- Parking is a release: the job gives back its lease and its attempt (release() in lifecycle.sql) and
-- takes a state of the existing enum, so that every other part (claim, cancel, retry, counts) treats it as
-- it treats any job in that state:
--   `scheduled` at run_at = the sleep's end or the wait's timeout: claim takes it then, the handler
--              replays, and the call that parked it now returns 'slept' or 'timeout';
--   `waiting`  for a wait with no timeout: only a signal (or cancel) moves it; remaining_deps stays 0.
-- A signal makes its waiters `pending` through the path of every transition that makes jobs claimable:
-- pgjobs_wake per queue, the claim floor note, and a status event per job.
--
-- Races between signal() and a wait on the same key are decided by a transaction-level advisory lock on
-- the key, taken first by both (before any job row lock, so the two never wait on each other in opposite
-- orders): a signal either sees the committed wait (and resolves it) or commits its kept signal before the
-- wait looks for one. A signal is never delivered twice: a kept one is deleted by the wait that takes it,
-- and a wait is resolved once, under its row lock.

-- Limits of what a job records (PJ002 past them): a step's result at most 1 MB as JSON text, a job's
-- steps at most 1,000 and 16 MB in all; names at most 200 bytes.
CREATE OR REPLACE FUNCTION pgjobs._durable_limits()
RETURNS TABLE (step_bytes int, job_steps int, job_bytes bigint, name_bytes int)
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT 1048576, 1000, 16777216::bigint, 200;
END;
$$;

-- The advisory lock of a signal key (two int4 keys: a space apart from the migrator's one bigint key).
CREATE OR REPLACE FUNCTION pgjobs._lock_signal_key(key text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1886611303, hashtext(key));
END;
$$;

-- The job row held by (id, lease_token), locked; no row when the token no longer holds it.
CREATE OR REPLACE FUNCTION pgjobs._hold_job(id bigint, lease_token uuid)
RETURNS TABLE (job_id bigint, queue text, kind text, attempt int, batch_id bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    FOR i IN 1..20 LOOP
        BEGIN
            RETURN QUERY
            SELECT j.id, j.queue, j.kind, j.attempt, j.batch_id FROM jobs AS j
             WHERE j.id = _hold_job.id AND j.lease_token = _hold_job.lease_token AND j.state::text = 'active'
               AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
               FOR NO KEY UPDATE;
            RETURN;
        EXCEPTION WHEN serialization_failure THEN
            -- A lost race (sql/history.sql, ROW MOVEMENT): again while the token still holds the job.
            IF NOT _lost_race_on_token(i, SQLERRM, _hold_job.id, _hold_job.lease_token) THEN
                RETURN;
            END IF;
        END;
    END LOOP;
END;
$$;

-- Records a step's result, in the caller's transaction: true when recorded, false when the token no
-- longer holds the job (nothing recorded). A name already recorded for the job with another result, a result
-- past the limits: PJ002, nothing changed.
CREATE OR REPLACE FUNCTION pgjobs.record_step(id bigint, lease_token uuid, name text, result jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_lim   record;
    v_job   record;
    v_bytes int;
    v_used  record;
BEGIN
    SELECT * INTO v_lim FROM _durable_limits();
    PERFORM _check_name('name', record_step.name, v_lim.name_bytes);
    v_bytes := coalesce(octet_length(record_step.result::text), 0);
    IF v_bytes > v_lim.step_bytes THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('the result of step %s of job %s is %s bytes as JSON; a step''s result may be at most %s',
                             _shown(record_step.name), record_step.id, v_bytes, v_lim.step_bytes);
    END IF;
    SELECT * INTO v_job FROM _hold_job(record_step.id, record_step.lease_token);
    IF v_job.job_id IS NULL THEN
        RETURN false;
    END IF;
    SELECT count(*) AS n, coalesce(sum(s.bytes), 0) AS bytes INTO v_used
      FROM job_steps AS s WHERE s.job_id = record_step.id;
    IF v_used.n + 1 > v_lim.job_steps OR v_used.bytes + v_bytes > v_lim.job_bytes THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('job %s cannot record step %s: a job keeps at most %s steps and %s bytes of results (it has %s steps, %s bytes)',
                             record_step.id, _shown(record_step.name), v_lim.job_steps, v_lim.job_bytes, v_used.n, v_used.bytes);
    END IF;
    INSERT INTO job_steps AS s (job_id, name, result, bytes, attempt)
    VALUES (record_step.id, record_step.name, record_step.result, v_bytes, v_job.attempt)
    ON CONFLICT (job_id, name) DO NOTHING;
    -- The same result under the same name is the same record (a call replayed after its reply was lost).
    IF NOT FOUND AND NOT EXISTS (SELECT 1 FROM job_steps AS s WHERE s.job_id = record_step.id
                                    AND s.name = record_step.name AND s.result IS NOT DISTINCT FROM record_step.result) THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('step %s of job %s is already recorded: a step''s name must be unique within its job',
                             _shown(record_step.name), record_step.id);
    END IF;
    RETURN true;
END;
$$;

-- The steps a job recorded (name, result), for the attempt that holds it; none when the token no longer
-- holds the job.
CREATE OR REPLACE FUNCTION pgjobs.job_steps(id bigint, lease_token uuid)
RETURNS TABLE (name text, result jsonb)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT s.name, s.result FROM job_steps AS s
     WHERE s.job_id = job_steps.id
       AND EXISTS (SELECT 1 FROM jobs AS j
                    WHERE j.id = job_steps.id AND j.lease_token = job_steps.lease_token AND j.state::text = 'active'
                      AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[]))
     ORDER BY s.done_at, s.name;
END;
$$;

-- Parks the held job on its open wait `w` (a release that keeps the attempt): `scheduled` at w.until, or
-- `waiting` with no time to resume at; `cancelled` when its cancellation was requested. Returns the state.
CREATE OR REPLACE FUNCTION pgjobs._park(id bigint, until timestamptz)
RETURNS pgjobs.job_state
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_job record;
BEGIN
    -- (the row is locked by _hold_job in this transaction: no race moves it)
    UPDATE jobs AS j
       SET state = CASE WHEN j.cancel_requested THEN 'cancelled'::job_state
                        WHEN _park.until IS NULL THEN 'waiting'
                        ELSE 'scheduled' END,
           run_at = CASE WHEN j.cancel_requested OR _park.until IS NULL THEN j.run_at ELSE _park.until END,
           completed_at = CASE WHEN j.cancel_requested THEN now() END,
           attempt = greatest(j.attempt - 1, 0),
           lease_token = NULL, lease_expires_at = NULL
     WHERE j.id = _park.id AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
    RETURNING j.id, j.state, j.queue, j.kind, j.attempt, j.batch_id, j.has_dependents INTO v_job;
    PERFORM _log_event(v_job.id, v_job.state, v_job.queue, v_job.kind, v_job.attempt, v_job.batch_id);
    IF v_job.state = 'cancelled' AND (v_job.batch_id IS NOT NULL OR v_job.has_dependents) THEN
        PERFORM _propagate(ARRAY[v_job.id]);
    END IF;
    RETURN v_job.state;
END;
$$;

-- A sleep or a wait named `name` of the job held by the token. Outcomes:
--   'slept' / 'timeout' / 'signal' (with its payload): resolved, now or by an earlier attempt; go on.
--   'parked': the job was given back (lease and attempt) until `until` or a signal; stop the handler.
--   'cancelled': its cancellation was requested; the job ended cancelled; stop the handler.
--   no row: the token no longer holds the job.
-- `until` counts only at the first call of a name: later calls keep the recorded one.
CREATE OR REPLACE FUNCTION pgjobs._wait(id bigint, lease_token uuid, name text, key text, until timestamptz)
RETURNS TABLE (outcome text, payload jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_job     record;
    v_wait    record;
    v_payload jsonb;
    v_state   job_state;
BEGIN
    PERFORM _check_name('name', _wait.name, (SELECT l.name_bytes FROM _durable_limits() AS l));
    PERFORM _check_time('until', _wait.until);
    IF _wait.key IS NOT NULL THEN
        PERFORM _lock_signal_key(_wait.key);  -- first: see the header
    END IF;
    SELECT * INTO v_job FROM _hold_job(_wait.id, _wait.lease_token);
    IF v_job.job_id IS NULL THEN
        RETURN;
    END IF;
    SELECT * INTO v_wait FROM job_waits AS w WHERE w.job_id = _wait.id AND w.name = _wait.name FOR UPDATE;
    IF FOUND AND v_wait.key IS DISTINCT FROM _wait.key THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('wait %s of job %s was recorded %s, not %s: a wait''s name must be unique within its job',
                             _shown(_wait.name), _wait.id,
                             coalesce('for key ' || _shown(v_wait.key), 'as a sleep'),
                             coalesce('for key ' || _shown(_wait.key), 'as a sleep'));
    ELSIF FOUND AND v_wait.resolved_at IS NOT NULL THEN
        RETURN QUERY SELECT v_wait.outcome, v_wait.payload;
        RETURN;
    ELSIF NOT FOUND THEN
        INSERT INTO job_waits AS w (job_id, name, key, until)
        VALUES (_wait.id, _wait.name, _wait.key, _wait.until)
        RETURNING * INTO v_wait;
    END IF;
    IF _wait.key IS NOT NULL THEN
        -- A signal kept for this key (sent while nobody waited): the oldest one is this wait's.
        DELETE FROM signals AS s
         WHERE s.id = (SELECT k.id FROM signals AS k WHERE k.key = _wait.key AND k.expires_at > now()
                        ORDER BY k.id LIMIT 1)
        RETURNING s.payload INTO v_payload;
        IF FOUND THEN
            UPDATE job_waits AS w SET resolved_at = now(), outcome = 'signal', payload = v_payload
             WHERE w.job_id = _wait.id AND w.name = _wait.name;
            RETURN QUERY SELECT 'signal'::text, v_payload;
            RETURN;
        END IF;
    END IF;
    IF v_wait.until IS NOT NULL AND v_wait.until <= now() THEN
        UPDATE job_waits AS w
           SET resolved_at = now(), outcome = CASE WHEN w.key IS NULL THEN 'slept' ELSE 'timeout' END
         WHERE w.job_id = _wait.id AND w.name = _wait.name
        RETURNING w.outcome INTO v_wait.outcome;
        RETURN QUERY SELECT v_wait.outcome, NULL::jsonb;
        RETURN;
    END IF;
    v_state := _park(_wait.id, v_wait.until);
    RETURN QUERY SELECT CASE WHEN v_state = 'cancelled' THEN 'cancelled' ELSE 'parked' END, NULL::jsonb;
END;
$$;

-- A durable sleep until `until` (see _wait): 'slept', 'parked', 'cancelled', or NULL when the token no
-- longer holds the job.
CREATE OR REPLACE FUNCTION pgjobs.sleep_until(id bigint, lease_token uuid, name text, until timestamptz)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF sleep_until.until IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = 'until must be a time, got NULL';
    END IF;
    RETURN (SELECT w.outcome FROM _wait(sleep_until.id, sleep_until.lease_token, sleep_until.name, NULL,
                                        sleep_until.until) AS w);
END;
$$;

-- Waits for a signal on `key` until `timeout_at` (NULL: no timeout); see _wait for the outcomes.
CREATE OR REPLACE FUNCTION pgjobs.await_signal(id bigint, lease_token uuid, name text, key text,
                                               timeout_at timestamptz DEFAULT NULL)
RETURNS TABLE (outcome text, payload jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    PERFORM _check_name('key', await_signal.key);
    RETURN QUERY SELECT w.outcome, w.payload
                   FROM _wait(await_signal.id, await_signal.lease_token, await_signal.name, await_signal.key,
                              await_signal.timeout_at) AS w;
END;
$$;

-- Wakes every live job waiting on `key` with `payload`; returns how many it woke. With no waiter the
-- signal is kept for `keep` (default one day) for the first job that waits on the key, and 0 is returned.
CREATE OR REPLACE FUNCTION pgjobs.signal(key text, payload jsonb DEFAULT '{}', keep interval DEFAULT '1 day')
RETURNS int
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_ids    bigint[];
    v_events jsonb;
    v_queues text[];
BEGIN
    PERFORM _check_name('key', signal.key);
    IF signal.payload IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = 'payload must be JSON, got SQL NULL';
    END IF;
    PERFORM _check_interval('keep', signal.keep, positive => true);
    PERFORM _lock_signal_key(signal.key);
    -- The waiters' rows locked in id order (every multi-row lock in pgjobs is), so a cancel racing this
    -- signal either ended the job first (not a waiter any more) or waits for us.
    FOR i IN 1..20 LOOP
        BEGIN
            SELECT array_agg(l.id ORDER BY l.id) INTO v_ids
              FROM (SELECT j.id FROM job_waits AS w JOIN jobs AS j ON j.id = w.job_id
                     WHERE w.key = signal.key AND w.resolved_at IS NULL
                       AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
                     ORDER BY j.id
                       FOR NO KEY UPDATE OF j) AS l;
            EXIT;
        EXCEPTION WHEN serialization_failure THEN
            PERFORM _lost_race(i, SQLERRM);  -- (sql/history.sql, ROW MOVEMENT)
        END;
    END LOOP;
    DELETE FROM signals AS s WHERE s.id IN (SELECT e.id FROM signals AS e WHERE e.expires_at <= now() LIMIT 100);
    IF v_ids IS NULL THEN
        INSERT INTO signals (key, payload, expires_at) VALUES (signal.key, signal.payload, now() + signal.keep);
        RETURN 0;
    END IF;
    UPDATE job_waits AS w SET resolved_at = now(), outcome = 'signal', payload = signal.payload
     WHERE w.key = signal.key AND w.resolved_at IS NULL AND w.job_id = ANY (v_ids);
    -- Parked waiters become claimable now; one already running (claimed at its timeout, not yet back at
    -- its wait) finds the signal in its wait when it gets there.
    WITH u AS (
        UPDATE jobs AS j SET state = 'pending', run_at = now()
         WHERE j.id = ANY (v_ids) AND j.state = ANY ('{waiting,scheduled}'::job_state[])
        RETURNING j.id, j.state, j.queue, j.kind, j.attempt, j.batch_id
    )
    SELECT jsonb_agg(jsonb_build_object('id', u.id, 'state', u.state, 'queue', u.queue, 'kind', u.kind,
                                        'attempt', u.attempt, 'batch_id', u.batch_id) ORDER BY u.id),
           array_agg(DISTINCT u.queue)
      INTO v_events, v_queues
      FROM u;
    IF v_queues IS NOT NULL THEN
        PERFORM _wake(v_queues);
        PERFORM _notify_status(v_events);
    END IF;
    RETURN cardinality(v_ids);
END;
$$;

-- What a job recorded, for people and dashboards: its steps (name, result size, when, by which attempt),
-- its sleeps and waits, and what it is parked on now. NULL for an unknown job.
CREATE OR REPLACE FUNCTION pgjobs.durable_status(id bigint)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_state job_state;
    v_open  record;
BEGIN
    SELECT j.state INTO v_state FROM jobs AS j WHERE j.id = durable_status.id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT w.key, w.since, w.until INTO v_open FROM job_waits AS w
     WHERE w.job_id = durable_status.id AND w.resolved_at IS NULL
     ORDER BY w.since DESC LIMIT 1;
    RETURN jsonb_build_object(
        'steps', coalesce((SELECT jsonb_agg(jsonb_build_object('name', s.name, 'bytes', s.bytes, 'attempt', s.attempt,
                                                               'done_at', s.done_at) ORDER BY s.done_at, s.name)
                             FROM job_steps AS s WHERE s.job_id = durable_status.id), '[]'),
        'waits', coalesce((SELECT jsonb_agg(jsonb_build_object('name', w.name, 'key', w.key, 'since', w.since,
                                                               'until', w.until, 'resolved_at', w.resolved_at,
                                                               'outcome', w.outcome) ORDER BY w.since, w.name)
                             FROM job_waits AS w WHERE w.job_id = durable_status.id), '[]'),
        'sleeping_until', CASE WHEN v_state IN ('waiting', 'scheduled') AND v_open.since IS NOT NULL
                                    AND v_open.key IS NULL THEN to_jsonb(v_open.until) END,
        'waiting_for', CASE WHEN v_state IN ('waiting', 'scheduled') AND v_open.key IS NOT NULL
                            THEN jsonb_build_object('key', v_open.key, 'since', v_open.since,
                                                    'timeout_at', v_open.until) END);
END;
$$;

-- Signals kept past their time, removed (signal() also removes up to 100 at each call).
CREATE OR REPLACE FUNCTION pgjobs.purge_signals()
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_n bigint;
BEGIN
    DELETE FROM signals AS s WHERE s.expires_at <= now();
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;
