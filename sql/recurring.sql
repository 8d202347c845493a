-- Recurring jobs. The cron arithmetic (next_run_at, in the schedule's IANA time zone, DST rules
-- included) is computed by the client (Python's croniter); this file keeps the schedules and
-- turns a due run into a job exactly once, however many schedulers race.
--
-- Exactly once rests on two things, both decided by the database:
--   1. a run is materialised by the conditional UPDATE `WHERE name = $1 AND next_run_at = $expected`:
--      racing schedulers serialise on the row lock and every loser re-reads the advanced row and
--      matches nothing; the job is inserted in the same transaction, so a crash (or a kill) between
--      "advance" and "insert" rolls both back;
--   2. the job carries unique_key 'schedule:<name>@<run time in UTC>' (kind = schedule's kind), so even a
--      schedule whose next_run_at was set back to a run already enqueued never enqueues it twice.
--
-- Channel pgjobs_schedules (payload: the schedule name, '*' for a bulk change) tells sleeping
-- schedulers that the set of schedules changed, so they recompute when to wake. Materialising does
-- not notify: the schedulers already know the next run they computed, and a NOTIFY would serialise
-- the hot path's commits.

-- The idempotency key of one run of one schedule.
CREATE OR REPLACE FUNCTION pgjobs._schedule_run_key(name text, run_at timestamptz)
RETURNS text
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT 'schedule:' || name || '@' || to_char(run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"');
$$;

CREATE OR REPLACE FUNCTION pgjobs._schedule_not_found(name text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'PJ003', MESSAGE = format('schedule %s not found', _shown(name));
END;
$$;

CREATE OR REPLACE FUNCTION pgjobs._check_schedule_name(name text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    PERFORM _check_name('schedule name', name, 200);  -- limits: checks.sql (a run's unique key carries it)
END;
$$;

-- PJ002 unless `cron` has the shape of a cron expression croniter reads: 5 fields (minute hour day month
-- weekday), optionally a 6th (seconds) and a 7th (year), each made of digits, names (jan, mon), `* / , - ?`
-- and croniter's `L W # R`; or one of the @yearly/@annually/@monthly/@weekly/@daily/@midnight/@hourly
-- aliases. A shape check only (ranges like "61" are croniter's to refuse, in the client that computes
-- next_run_at): it turns away what no cron reader accepts ("every tuesday", "* * *") before it is stored
-- for schedulers to trip over, and it never refuses an expression croniter accepts.
CREATE OR REPLACE FUNCTION pgjobs._check_cron(name text, cron text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_fields text[] := regexp_split_to_array(btrim(cron, E' \t\n\r'), E'\\s+');
BEGIN
    IF cron IS NULL OR btrim(cron, E' \t\n\r') = '' OR octet_length(cron) > 200 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('schedule %s: cron must be a non-empty cron expression of at most 200 bytes, got %s',
                             _shown(name), _shown(cron));
    END IF;
    IF cardinality(v_fields) = 1
       AND lower(v_fields[1]) IN ('@yearly', '@annually', '@monthly', '@weekly', '@daily', '@midnight', '@hourly') THEN
        RETURN;
    END IF;
    IF cardinality(v_fields) NOT BETWEEN 5 AND 7
       OR EXISTS (SELECT 1 FROM unnest(v_fields) AS f WHERE f !~ '^[0-9A-Za-z*/,?#-]+$') THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('schedule %s: invalid cron expression %s (expected 5 fields "minute hour day month '
                             'weekday", optionally seconds and year, or an alias such as @hourly)', _shown(name), _shown(cron));
    END IF;
END;
$$;

-- Creates or replaces a schedule. `next_run_at` is the first run, computed by the caller from
-- `cron` in `timezone`. With keep_next_run_at, an existing schedule whose cron and time zone are
-- unchanged keeps its own next_run_at: a worker re-declaring its code-defined schedules at start-up
-- must not push back a run that came due while it was down (that is the missed-run policy's call).
-- A dynamic upsert (code_defined = false) over a code-defined schedule raises PJ004; a code-defined
-- upsert over a dynamic schedule takes it over (the application's declaration owns the name).
-- `paused`, `last_run_at` and `last_job_id` are kept on update.
CREATE OR REPLACE FUNCTION pgjobs.upsert_schedule(
    name             text,
    kind             text,
    cron             text,
    next_run_at      timestamptz,
    timezone         text DEFAULT 'UTC',
    payload          jsonb DEFAULT '{}',
    queue            text DEFAULT 'default',
    code_defined     boolean DEFAULT false,
    priority         int DEFAULT 0,
    max_attempts     int DEFAULT 20,
    missed           text DEFAULT 'once',
    keep_next_run_at boolean DEFAULT false)
RETURNS pgjobs.schedules
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_code  boolean := coalesce(upsert_schedule.code_defined, false);
    v_old   schedules;
    v_row   schedules;
BEGIN
    PERFORM _check_schedule_name(upsert_schedule.name);
    -- Everything a run of this schedule will insert is checked now: a schedule whose run could never
    -- be inserted would otherwise fail every materialize_schedules batch it is part of.
    PERFORM _check_job_args(upsert_schedule.kind, upsert_schedule.queue, upsert_schedule.payload,
                            upsert_schedule.max_attempts, format('schedule %L', upsert_schedule.name));
    PERFORM _check_cron(upsert_schedule.name, upsert_schedule.cron);
    IF upsert_schedule.next_run_at IS NULL OR NOT isfinite(upsert_schedule.next_run_at) THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('schedule %L: next_run_at must be a finite timestamp, got %s',
                             upsert_schedule.name, coalesce(upsert_schedule.next_run_at::text, 'NULL'));
    END IF;
    PERFORM _check_time(format('schedule %L: next_run_at', upsert_schedule.name), upsert_schedule.next_run_at);
    IF upsert_schedule.timezone IS NULL OR upsert_schedule.timezone = '' OR octet_length(upsert_schedule.timezone) > 100 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('schedule %L: timezone must be an IANA time zone name, got %s',
                             upsert_schedule.name, _shown(upsert_schedule.timezone));
    ELSIF upsert_schedule.missed IS NULL OR upsert_schedule.missed NOT IN ('once', 'skip') THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('schedule %L: missed must be ''once'' or ''skip'', got %s',
                             upsert_schedule.name, _shown(upsert_schedule.missed));
    ELSIF upsert_schedule.priority IS NULL OR upsert_schedule.priority NOT BETWEEN -32768 AND 32767 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('schedule %L: priority must be an integer between -32768 and 32767, got %s',
                             upsert_schedule.name, coalesce(upsert_schedule.priority::text, 'NULL'));
    END IF;

    SELECT s.* INTO v_old FROM schedules AS s WHERE s.name = upsert_schedule.name;
    -- pg_timezone_names reads the zone files (~30 ms): only look up a zone that no stored schedule
    -- carries already (every stored zone was checked when it was stored).
    -- The names are matched exactly (case included) because the scheduler resolves them with zoneinfo.
    IF upsert_schedule.timezone <> 'UTC' AND upsert_schedule.timezone IS DISTINCT FROM v_old.timezone
       AND NOT EXISTS (SELECT 1 FROM schedules AS o WHERE o.timezone = upsert_schedule.timezone)
       AND NOT EXISTS (SELECT 1 FROM pg_timezone_names AS z WHERE z.name = upsert_schedule.timezone) THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('schedule %L: unknown time zone %L (expected an IANA name such as ''Europe/Paris'')',
                             upsert_schedule.name, upsert_schedule.timezone);
    END IF;
    -- Fails early with a clear message; the conditional DO UPDATE below is what decides a race.
    IF NOT v_code AND v_old.code_defined THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ004',
            MESSAGE = format('schedule %L is code-defined: a dynamic schedule cannot replace it', upsert_schedule.name);
    END IF;

    INSERT INTO schedules AS s (name, kind, cron, timezone, payload, queue, priority, max_attempts, missed,
                                code_defined, next_run_at)
    VALUES (upsert_schedule.name, upsert_schedule.kind, upsert_schedule.cron, upsert_schedule.timezone,
            upsert_schedule.payload, upsert_schedule.queue, upsert_schedule.priority::smallint,
            upsert_schedule.max_attempts, upsert_schedule.missed, v_code, upsert_schedule.next_run_at)
    ON CONFLICT (name) DO UPDATE
       SET kind = EXCLUDED.kind, cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, payload = EXCLUDED.payload,
           queue = EXCLUDED.queue, priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts,
           missed = EXCLUDED.missed, code_defined = EXCLUDED.code_defined,
           next_run_at = CASE WHEN coalesce(upsert_schedule.keep_next_run_at, false)
                                   AND s.cron = EXCLUDED.cron AND s.timezone = EXCLUDED.timezone
                              THEN s.next_run_at ELSE EXCLUDED.next_run_at END,
           updated_at = now()
     -- Re-checked on the locked, latest row version: a code-defined schedule created by a racing
     -- transaction after our read above is not overwritten by a dynamic upsert.
     WHERE EXCLUDED.code_defined OR NOT s.code_defined
    RETURNING s.* INTO v_row;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ004',
            MESSAGE = format('schedule %L is code-defined: a dynamic schedule cannot replace it', upsert_schedule.name);
    END IF;
    PERFORM pg_notify('pgjobs_schedules', upsert_schedule.name);
    RETURN v_row;
END;
$$;

-- Returns whether this call paused it (false: it was paused already). Unknown name: PJ003.
CREATE OR REPLACE FUNCTION pgjobs.pause_schedule(name text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_was boolean;
BEGIN
    PERFORM _check_schedule_name(pause_schedule.name);
    -- Lock first: the old state read and the change must see the same row version.
    SELECT s.paused INTO v_was FROM schedules AS s WHERE s.name = pause_schedule.name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM _schedule_not_found(pause_schedule.name);
    END IF;
    IF v_was THEN
        RETURN false;
    END IF;
    UPDATE schedules AS s SET paused = true, updated_at = now() WHERE s.name = pause_schedule.name;
    PERFORM pg_notify('pgjobs_schedules', pause_schedule.name);
    RETURN true;
END;
$$;

-- Unpauses; returns whether this call resumed it (false: it was not paused, and nothing changes).
-- Without `next_run_at` the schedule keeps the next_run_at it had, so runs that came due while it
-- was paused are handled by its missed-run policy ('once': one catch-up run); with it (the Python
-- client and CLI pass the next future run by default) the schedule restarts there, and the paused
-- period is simply skipped. Unknown name: PJ003.
CREATE OR REPLACE FUNCTION pgjobs.resume_schedule(name text, next_run_at timestamptz DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_was boolean;
BEGIN
    PERFORM _check_schedule_name(resume_schedule.name);
    IF resume_schedule.next_run_at IS NOT NULL AND NOT isfinite(resume_schedule.next_run_at) THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('next_run_at must be a finite timestamp, got %s', resume_schedule.next_run_at);
    END IF;
    PERFORM _check_time('next_run_at', resume_schedule.next_run_at);
    SELECT s.paused INTO v_was FROM schedules AS s WHERE s.name = resume_schedule.name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM _schedule_not_found(resume_schedule.name);
    END IF;
    IF NOT v_was THEN
        RETURN false;
    END IF;
    UPDATE schedules AS s
       SET paused = false, next_run_at = coalesce(resume_schedule.next_run_at, s.next_run_at), updated_at = now()
     WHERE s.name = resume_schedule.name;
    PERFORM pg_notify('pgjobs_schedules', resume_schedule.name);
    RETURN true;
END;
$$;

-- Deletes a dynamic schedule (jobs it already enqueued stay). A code-defined schedule is owned by
-- the application's declarations (it would come back at the next worker start): PJ004 unless
-- `force`. Returns true; an unknown name raises PJ003.
CREATE OR REPLACE FUNCTION pgjobs.remove_schedule(name text, force boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_code boolean;
BEGIN
    PERFORM _check_schedule_name(remove_schedule.name);
    -- Lock first: the code_defined read and the delete must see the same row version.
    SELECT s.code_defined INTO v_code FROM schedules AS s WHERE s.name = remove_schedule.name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM _schedule_not_found(remove_schedule.name);
    ELSIF v_code AND NOT coalesce(remove_schedule.force, false) THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ004',
            MESSAGE = format('schedule %L is code-defined: remove it from the application (or pass force => true)',
                             remove_schedule.name);
    END IF;
    DELETE FROM schedules AS s WHERE s.name = remove_schedule.name;
    PERFORM pg_notify('pgjobs_schedules', remove_schedule.name);
    RETURN true;
END;
$$;

-- Deletes the code-defined schedules whose names are not in `keep` (the application no longer
-- declares them). Dynamic schedules are never touched. Returns how many were deleted.
CREATE OR REPLACE FUNCTION pgjobs.prune_code_schedules(keep text[])
RETURNS int
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_count int;
BEGIN
    IF keep IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = 'keep must be an array of schedule names (''{}'' prunes every code-defined schedule), got NULL';
    END IF;
    PERFORM _check_array('keep', keep);
    DELETE FROM schedules AS s
     WHERE s.code_defined AND s.name <> ALL (array_remove(prune_code_schedules.keep, NULL));
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        PERFORM pg_notify('pgjobs_schedules', '*');
    END IF;
    RETURN v_count;
END;
$$;

-- Unpaused schedules with next_run_at <= now, earliest first. `skip_locked` (used by schedulers,
-- inside the transaction that then calls materialize_schedules) locks the rows it returns and
-- skips rows another scheduler has locked, so racing schedulers split the due set instead of
-- queueing on the same rows.
CREATE OR REPLACE FUNCTION pgjobs.due_schedules(now timestamptz DEFAULT now(), max_rows int DEFAULT 100,
                                                skip_locked boolean DEFAULT false)
RETURNS SETOF pgjobs.schedules
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF due_schedules.now IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = 'now must be a timestamp, got NULL';
    END IF;
    PERFORM _check_count('max_rows', max_rows, 0, 100000);
    IF coalesce(skip_locked, false) THEN
        RETURN QUERY
        SELECT s.* FROM schedules AS s
         WHERE NOT s.paused AND s.next_run_at <= due_schedules.now
         ORDER BY s.next_run_at, s.name
         LIMIT max_rows
           FOR UPDATE SKIP LOCKED;
    ELSE
        RETURN QUERY
        SELECT s.* FROM schedules AS s
         WHERE NOT s.paused AND s.next_run_at <= due_schedules.now
         ORDER BY s.next_run_at, s.name
         LIMIT max_rows;
    END IF;
END;
$$;

-- When the earliest unpaused schedule is due (NULL: none), so a scheduler sleeps until then.
-- `except_names` leaves out schedules the caller is backing off from.
CREATE OR REPLACE FUNCTION pgjobs.next_schedule_at(except_names text[] DEFAULT NULL)
RETURNS timestamptz
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT min(s.next_run_at) FROM schedules AS s
     WHERE NOT s.paused AND (except_names IS NULL OR s.name <> ALL (except_names));
$$;

-- One schedule; no row when the name is unknown (reads do not raise).
CREATE OR REPLACE FUNCTION pgjobs.get_schedule(name text)
RETURNS SETOF pgjobs.schedules
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT s.* FROM schedules AS s WHERE s.name = get_schedule.name;
$$;

CREATE OR REPLACE FUNCTION pgjobs.list_schedules()
RETURNS SETOF pgjobs.schedules
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT s.* FROM schedules AS s ORDER BY s.name;
$$;

-- Inserts the jobs of runs whose schedules the caller has just advanced (and holds locked), in one
-- _insert_specs call (validation, bounded-queue capacity, wake and status notifications live there),
-- with the ids reserved by the caller. A run whose unique key is already held (it was enqueued
-- before) is not inserted again: its holder is returned with created = false.
CREATE OR REPLACE FUNCTION pgjobs._enqueue_runs(names text[], run_ats timestamptz[], ids bigint[])
RETURNS TABLE (name text, run_at timestamptz, job_id bigint, created boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_specs jsonb;
    v_ids   bigint[];
    v_names text[];
    v_runs  timestamptz[];
    v_ns    bigint[];
    v_out_ids bigint[];
    v_created boolean[];
BEGIN
    SELECT jsonb_agg(jsonb_build_object(
               'kind', s.kind, 'queue', s.queue, 'payload', s.payload, 'priority', s.priority,
               'max_attempts', s.max_attempts, 'run_at', r.run_at,
               'unique_key', _schedule_run_key(s.name, r.run_at),
               'meta', jsonb_build_object('schedule', s.name, 'scheduled_for', r.run_at)) ORDER BY r.n),
           array_agg(r.id ORDER BY r.n), array_agg(r.name ORDER BY r.n), array_agg(r.run_at ORDER BY r.n)
      INTO v_specs, v_ids, v_names, v_runs
      FROM unnest(names, run_ats, ids) WITH ORDINALITY AS r(name, run_at, id, n)
      JOIN schedules AS s ON s.name = r.name;
    IF v_specs IS NULL THEN
        RETURN;
    END IF;

    SELECT array_agg(i.n ORDER BY i.n), array_agg(i.id ORDER BY i.n), array_agg(i.created ORDER BY i.n)
      INTO v_ns, v_out_ids, v_created
      FROM _insert_specs(v_specs, NULL, v_ids) AS i;

    -- A separate statement: its snapshot sees the rows _insert_specs just inserted.
    UPDATE jobs AS j SET schedule_name = v_names[r.n]
      FROM unnest(v_ns, v_out_ids, v_created) AS r(n, id, created)
     WHERE r.created AND j.id = r.id AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[]);

    RETURN QUERY SELECT v_names[r.n], v_runs[r.n], r.id, r.created
                   FROM unnest(v_ns, v_out_ids, v_created) AS r(n, id, created) ORDER BY r.n;
END;
$$;

-- One run of one schedule: when the schedule is unpaused and still at `expected_run_at`, advances it
-- to `next_run_at` and inserts the run's job (run_at = expected_run_at, schedule_name set, unique key
-- per (schedule, run time)), in the caller's transaction. Returns the new job's id; NULL for a
-- loser (another scheduler advanced it first, it was paused, removed, or re-timed meanwhile, or the
-- run's job already exists).
CREATE OR REPLACE FUNCTION pgjobs.materialize_schedule(name text, expected_run_at timestamptz, next_run_at timestamptz)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_id  bigint := nextval('pgjobs.jobs_id_seq');
    v_run record;
BEGIN
    PERFORM _check_schedule_name(materialize_schedule.name);
    PERFORM _check_run_times(materialize_schedule.expected_run_at, materialize_schedule.next_run_at,
                             materialize_schedule.name);
    -- The race is decided here: racing schedulers queue on the row lock, and each re-evaluates the
    -- WHERE clause on the row the winner committed, which no longer matches expected_run_at.
    UPDATE schedules AS s
       SET next_run_at = materialize_schedule.next_run_at, last_run_at = materialize_schedule.expected_run_at,
           last_job_id = v_id, updated_at = now()
     WHERE s.name = materialize_schedule.name AND s.next_run_at = materialize_schedule.expected_run_at
       AND NOT s.paused;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT * INTO v_run FROM _enqueue_runs(ARRAY[materialize_schedule.name], ARRAY[materialize_schedule.expected_run_at],
                                           ARRAY[v_id]);
    IF NOT v_run.created THEN
        UPDATE schedules AS s SET last_job_id = v_run.job_id WHERE s.name = materialize_schedule.name;
        RETURN NULL;
    END IF;
    RETURN v_run.job_id;
END;
$$;

CREATE OR REPLACE FUNCTION pgjobs._check_run_times(expected_run_at timestamptz, next_run_at timestamptz, label text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    PERFORM _check_time(format('schedule %s: expected_run_at', _shown(label)), expected_run_at);
    PERFORM _check_time(format('schedule %s: next_run_at', _shown(label)), next_run_at);
    IF expected_run_at IS NULL OR NOT isfinite(expected_run_at) THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('schedule %s: expected_run_at must be a finite timestamp, got %s', _shown(label),
                             coalesce(expected_run_at::text, 'NULL'));
    ELSIF next_run_at IS NULL OR NOT isfinite(next_run_at) OR next_run_at <= expected_run_at THEN
        -- A schedule only moves forward: otherwise the same run could come due again.
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('schedule %s: next_run_at must be a finite timestamp after expected_run_at %s, got %s',
                             _shown(label), expected_run_at, coalesce(next_run_at::text, 'NULL'));
    END IF;
END;
$$;

-- The batch form the scheduler uses: many runs in one call. For each i, schedule names[i] still at
-- expected_run_ats[i] (and unpaused) moves to next_run_ats[i]; its run's job is inserted unless
-- skip_runs[i] (the 'skip' missed-run policy: advance without a job). Rows locked by another
-- transaction are skipped, not waited for (that transaction is advancing them, or will roll back
-- and leave them due for the next tick). Returns one row per schedule this call advanced: job_id is
-- NULL for a skipped run, created is false when the run's job already existed.
CREATE OR REPLACE FUNCTION pgjobs.materialize_schedules(names text[], expected_run_ats timestamptz[],
                                                        next_run_ats timestamptz[], skip_runs boolean[] DEFAULT NULL)
RETURNS TABLE (name text, expected_run_at timestamptz, next_run_at timestamptz, job_id bigint, created boolean,
               error text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_errors    text[];
    v_old_runs  timestamptz[];
    v_old_jobs  bigint[];
    v_err_names text[];
    v_one       record;
    v_code      text;
    v_msg       text;
    v_bad   record;
    v_names text[];
    v_runs  timestamptz[];
    v_nexts timestamptz[];
    v_ids   bigint[];
    v_skips boolean[];
    v_job_ids   bigint[];
    v_created   boolean[];
    v_run_names text[];
BEGIN
    PERFORM _check_array('names', names);
    PERFORM _check_array('expected_run_ats', expected_run_ats);
    PERFORM _check_array('next_run_ats', next_run_ats);
    PERFORM _check_array('skip_runs', skip_runs);
    IF names IS NULL OR expected_run_ats IS NULL OR next_run_ats IS NULL
       OR cardinality(names) <> cardinality(expected_run_ats) OR cardinality(names) <> cardinality(next_run_ats)
       OR (skip_runs IS NOT NULL AND cardinality(skip_runs) <> cardinality(names)) THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('names, expected_run_ats, next_run_ats (and skip_runs) must be arrays of one length, got %s, %s, %s, %s',
                             coalesce(cardinality(names)::text, 'NULL'), coalesce(cardinality(expected_run_ats)::text, 'NULL'),
                             coalesce(cardinality(next_run_ats)::text, 'NULL'), coalesce(cardinality(skip_runs)::text, 'NULL'));
    END IF;
    SELECT r.name, r.e, r.x INTO v_bad
      FROM unnest(names, expected_run_ats, next_run_ats) AS r(name, e, x)
     WHERE r.name IS NULL OR r.name = '' OR octet_length(r.name) > 200 OR r.e IS NULL OR NOT _time_ok(r.e)
        OR r.x IS NULL OR NOT _time_ok(r.x) OR r.x <= r.e
     LIMIT 1;
    IF FOUND THEN
        PERFORM _check_schedule_name(v_bad.name);
        PERFORM _check_run_times(v_bad.e, v_bad.x, v_bad.name);
    END IF;
    SELECT r.name INTO v_bad FROM unnest(names) AS r(name) GROUP BY r.name HAVING count(*) > 1 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('schedule %s appears more than once in names', _shown(v_bad.name));
    END IF;

    -- Lock the schedules still at their expected run, in a fixed order (two callers never deadlock),
    -- skipping rows someone else holds. FOR UPDATE re-checks the join on the latest row version, so
    -- a run another scheduler advanced after our snapshot no longer matches.
    SELECT array_agg(l.name) INTO v_names
      FROM (SELECT s.name
              FROM schedules AS s
              JOIN unnest(names, expected_run_ats) AS r(name, e) ON r.name = s.name AND r.e = s.next_run_at
             WHERE NOT s.paused
             ORDER BY s.name
               FOR UPDATE OF s SKIP LOCKED) AS l;
    IF v_names IS NULL THEN
        RETURN;
    END IF;

    -- A new statement (and snapshot) sees the rows as locked. The job ids are reserved here so the
    -- schedule row records its last job in the same UPDATE.
    WITH plan AS (
        SELECT r.name, r.e, r.x, r.skip, CASE WHEN NOT r.skip THEN nextval('pgjobs.jobs_id_seq') END AS id
          FROM unnest(names, expected_run_ats, next_run_ats,
                      coalesce(skip_runs, array_fill(false, ARRAY[cardinality(names)]))) AS r(name, e, x, skip)
         WHERE r.name = ANY (v_names)
    ), old AS (
        -- (the statement's snapshot: the values before upd) what a run that fails gives back
        SELECT s.name, s.last_run_at, s.last_job_id FROM schedules AS s WHERE s.name = ANY (v_names)
    ), upd AS (
        UPDATE schedules AS s
           SET next_run_at = p.x,
               last_run_at = CASE WHEN p.skip THEN s.last_run_at ELSE p.e END,
               last_job_id = coalesce(p.id, s.last_job_id),
               updated_at = now()
          FROM plan AS p JOIN old AS o ON o.name = p.name
         WHERE s.name = p.name AND s.next_run_at = p.e
        RETURNING s.name, p.e, p.x, p.id, coalesce(p.skip, false) AS skip, o.last_run_at AS old_run,
                  o.last_job_id AS old_job
    )
    SELECT array_agg(u.name ORDER BY u.name), array_agg(u.e ORDER BY u.name), array_agg(u.x ORDER BY u.name),
           array_agg(u.id ORDER BY u.name), array_agg(u.skip ORDER BY u.name),
           array_agg(u.old_run ORDER BY u.name), array_agg(u.old_job ORDER BY u.name)
      INTO v_names, v_runs, v_nexts, v_ids, v_skips, v_old_runs, v_old_jobs
      FROM upd AS u;

    BEGIN
        SELECT array_agg(e.job_id ORDER BY e.name), array_agg(e.created ORDER BY e.name), array_agg(e.name ORDER BY e.name)
          INTO v_job_ids, v_created, v_run_names
          FROM _enqueue_runs(ARRAY(SELECT v_names[i] FROM generate_subscripts(v_names, 1) AS i WHERE NOT v_skips[i]),
                             ARRAY(SELECT v_runs[i] FROM generate_subscripts(v_names, 1) AS i WHERE NOT v_skips[i]),
                             ARRAY(SELECT v_ids[i] FROM generate_subscripts(v_names, 1) AS i WHERE NOT v_skips[i])) AS e;
    EXCEPTION WHEN OTHERS THEN
        -- One run that cannot be inserted must not stop every schedule. A full queue
        -- (PJ001) and serialization failures / deadlocks (class 40) still fail the call: the runs stay
        -- due and the scheduler retries them (one at a time for a full queue). Any other error: the
        -- runs are inserted one at a time, each in a subtransaction (the one place a loop is needed:
        -- only a subtransaction contains an error); a run that fails is skipped (its schedule stays
        -- advanced, as with the 'skip' policy), reported in `error` and as a WARNING.
        GET STACKED DIAGNOSTICS v_code = RETURNED_SQLSTATE;
        IF v_code = 'PJ001' OR left(v_code, 2) = '40' THEN
            RAISE;
        END IF;
        v_job_ids := '{}'; v_created := '{}'; v_run_names := '{}'; v_errors := '{}'; v_err_names := '{}';
        FOR i IN 1 .. cardinality(v_names) LOOP
            CONTINUE WHEN v_skips[i];
            BEGIN
                SELECT e.job_id, e.created INTO v_one
                  FROM _enqueue_runs(ARRAY[v_names[i]], ARRAY[v_runs[i]], ARRAY[v_ids[i]]) AS e;
                v_job_ids := v_job_ids || v_one.job_id;
                v_created := v_created || v_one.created;
                v_run_names := v_run_names || v_names[i];
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS v_code = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT;
                IF v_code = 'PJ001' OR left(v_code, 2) = '40' THEN
                    RAISE;
                END IF;
                v_err_names := v_err_names || v_names[i];
                v_errors := v_errors || left(format('%s: %s', v_code, v_msg), 500);
                RAISE WARNING USING MESSAGE = format('schedule %s: the run at %s was skipped: %s', _shown(v_names[i]),
                                                     v_runs[i], left(v_msg, 500));
            END;
        END LOOP;
        -- The skipped runs made no job: their schedules keep the last run and job they had.
        UPDATE schedules AS s SET last_run_at = o.run, last_job_id = o.job
          FROM unnest(v_names, v_old_runs, v_old_jobs) AS o(name, run, job)
         WHERE o.name = ANY (v_err_names) AND s.name = o.name;
    END;
    IF NOT (true = ALL (v_created)) THEN
        -- Rare: a run had been enqueued before (its schedule was set back). Point at that job.
        UPDATE schedules AS s SET last_job_id = r.job_id
          FROM unnest(v_run_names, v_job_ids, v_created) AS r(name, job_id, created)
         WHERE NOT r.created AND s.name = r.name;
    END IF;

    RETURN QUERY
    SELECT a.name, a.e, a.x, r.job_id, coalesce(r.created, false), f.error
      FROM unnest(v_names, v_runs, v_nexts, v_skips) AS a(name, e, x, skip)
      LEFT JOIN unnest(v_run_names, v_job_ids, v_created) AS r(name, job_id, created) ON r.name = a.name
      LEFT JOIN unnest(v_err_names, v_errors) AS f(name, error) ON f.name = a.name
     ORDER BY a.name;
END;
$$;
