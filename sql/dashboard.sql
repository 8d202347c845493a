-- What the dashboard (pgjobs web) reads beyond the core status functions, and its two bulk actions.
-- The read functions are for the pgjobs_reader role; dashboard_bulk and trigger_schedule change state
-- and are for pgjobs_admin. None of them returns a lease token: a page must never be able to hand one out.

CREATE OR REPLACE FUNCTION pgjobs._dashboard_check_page(max_rows int, skip_rows int)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF max_rows IS NULL OR max_rows < 0 OR max_rows > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('max_rows must be between 0 and 10000, got %s', coalesce(max_rows::text, 'NULL'));
    ELSIF skip_rows IS NULL OR skip_rows < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('skip_rows must be >= 0, got %s', coalesce(skip_rows::text, 'NULL'));
    END IF;
END;
$$;

-- The job list's filter: names and the search text within the limits of checks.sql (NULL: no filter).
CREATE OR REPLACE FUNCTION pgjobs._dashboard_check_filter(only_queue text, only_kind text, search text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    PERFORM _check_name('only_queue', only_queue, nullable => true);
    PERFORM _check_name('only_kind', only_kind, nullable => true);
    PERFORM _check_name('search', search, nullable => true);
END;
$$;

-- How many jobs the job list's filter matches (its "N of M"). search: a substring of kind, unique_key
-- or the payload's JSON text, case-insensitively. The same predicate is written out in dashboard_jobs:
-- a SQL helper function would not be inlined (it pins search_path) and costs a call per row.
CREATE OR REPLACE FUNCTION pgjobs.dashboard_count_jobs(
    only_state pgjobs.job_state DEFAULT NULL,
    only_queue text DEFAULT NULL,
    only_kind  text DEFAULT NULL,
    search     text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_search text := lower(dashboard_count_jobs.search);
BEGIN
    PERFORM _dashboard_check_filter(only_queue, only_kind, dashboard_count_jobs.search);
    RETURN (SELECT count(*) FROM jobs AS j
             WHERE (only_state IS NULL OR j.state = only_state)
               AND (only_queue IS NULL OR j.queue = only_queue)
               AND (only_kind IS NULL OR j.kind = only_kind)
               AND (v_search IS NULL
                    OR strpos(lower(j.kind), v_search) > 0
                    OR strpos(lower(coalesce(j.unique_key, '')), v_search) > 0
                    OR strpos(lower(j.payload::text), v_search) > 0));
END;
$$;

-- The job list's state tabs: how many jobs the filter (without a state) matches in each state, one row
-- per state that has any. One scan for every tab, where dashboard_count_jobs per state would be seven.
CREATE OR REPLACE FUNCTION pgjobs.dashboard_state_counts(
    only_queue text DEFAULT NULL,
    only_kind  text DEFAULT NULL,
    search     text DEFAULT NULL)
RETURNS TABLE (state pgjobs.job_state, jobs bigint)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_search text := lower(dashboard_state_counts.search);
BEGIN
    PERFORM _dashboard_check_filter(only_queue, only_kind, dashboard_state_counts.search);
    RETURN QUERY
    SELECT j.state, count(*)
      FROM jobs AS j
     WHERE (only_queue IS NULL OR j.queue = only_queue)
       AND (only_kind IS NULL OR j.kind = only_kind)
       AND (v_search IS NULL
            OR strpos(lower(j.kind), v_search) > 0
            OR strpos(lower(coalesce(j.unique_key, '')), v_search) > 0
            OR strpos(lower(j.payload::text), v_search) > 0)
     GROUP BY j.state
     ORDER BY j.state;
END;
$$;

-- A page of the job list, newest first; every row carries the filter's full count (total_rows; no row
-- at all when the page is past the end: dashboard_count_jobs says how many then). Counting apart and
-- then taking the page lets the page be a top-N sort (count(*) OVER () would sort every match).
CREATE OR REPLACE FUNCTION pgjobs.dashboard_jobs(
    only_state pgjobs.job_state DEFAULT NULL,
    only_queue text DEFAULT NULL,
    only_kind  text DEFAULT NULL,
    search     text DEFAULT NULL,
    max_rows   int DEFAULT 50,
    skip_rows  int DEFAULT 0)
RETURNS TABLE (id bigint, kind text, queue text, state pgjobs.job_state, priority smallint, run_at timestamptz,
               created_at timestamptz, attempt int, max_attempts int, leased_by text, first_started_at timestamptz,
               completed_at timestamptz, last_error text, unique_key text, group_key text, batch_id bigint,
               progress jsonb, cancel_requested boolean, total_rows bigint)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_search text := lower(dashboard_jobs.search);
    v_total bigint;
BEGIN
    PERFORM _dashboard_check_page(max_rows, skip_rows);
    v_total := dashboard_count_jobs(only_state, only_queue, only_kind, dashboard_jobs.search);
    IF v_total <= skip_rows THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT j.id, j.kind, j.queue, j.state, j.priority, j.run_at, j.created_at, j.attempt, j.max_attempts,
           j.leased_by, j.first_started_at, j.completed_at, j.last_error, j.unique_key, j.group_key, j.batch_id,
           j.progress, j.cancel_requested, v_total
      FROM jobs AS j
     WHERE (only_state IS NULL OR j.state = only_state)
       AND (only_queue IS NULL OR j.queue = only_queue)
       AND (only_kind IS NULL OR j.kind = only_kind)
       AND (v_search IS NULL
            OR strpos(lower(j.kind), v_search) > 0
            OR strpos(lower(coalesce(j.unique_key, '')), v_search) > 0
            OR strpos(lower(j.payload::text), v_search) > 0)
     ORDER BY j.created_at DESC, j.id DESC
     LIMIT max_rows OFFSET skip_rows;
END;
$$;

-- Every queue that has jobs or settings: its counts per state, the age of its oldest claimable job
-- (seconds since the oldest pending job became due; NULL with none pending) and its settings
-- (settings_at NULL: never configured, the defaults apply). The reader role has no table privilege,
-- so the settings come through here rather than from the queues table.
CREATE OR REPLACE FUNCTION pgjobs.dashboard_queues()
RETURNS TABLE (queue text, counts jsonb, oldest_pending_seconds double precision, paused boolean, fair boolean,
               max_length int, max_active int, max_active_per_group int, noisy_share real, noisy_min_active int,
               status_events text, settings_at timestamptz)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    WITH c AS (
        SELECT j.queue, j.state, count(*) AS n,
               min(j.run_at) FILTER (WHERE j.state = 'pending') AS oldest
          FROM jobs AS j GROUP BY j.queue, j.state
    ), per_queue AS (
        SELECT c.queue, jsonb_object_agg(c.state, c.n) AS counts, min(c.oldest) AS oldest
          FROM c GROUP BY c.queue
    )
    SELECT coalesce(p.queue, q.queue), coalesce(p.counts, '{}'::jsonb),
           CASE WHEN p.oldest IS NOT NULL THEN greatest(extract(epoch FROM now() - p.oldest)::double precision, 0) END,
           coalesce(q.paused, false), coalesce(q.fair, false), q.max_length, q.max_active, q.max_active_per_group,
           coalesce(q.noisy_share, 0.5::real), coalesce(q.noisy_min_active, 2), coalesce(q.status_events, 'all'),
           q.updated_at
      FROM per_queue AS p
      FULL JOIN queues AS q ON q.queue = p.queue
     ORDER BY 1;
$$;

-- Jobs settled per minute over the last `minutes` minutes (the current minute last), zeros included,
-- so a chart has one point per minute. Terminal jobs keep completed_at until purge.
CREATE OR REPLACE FUNCTION pgjobs.dashboard_throughput(minutes int DEFAULT 60, queue text DEFAULT NULL)
RETURNS TABLE (minute timestamptz, succeeded bigint, failed bigint, cancelled bigint)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_from timestamptz;
BEGIN
    IF minutes IS NULL OR minutes < 1 OR minutes > 1440 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('minutes must be between 1 and 1440, got %s', coalesce(minutes::text, 'NULL'));
    END IF;
    PERFORM _check_name('queue', dashboard_throughput.queue, nullable => true);
    v_from := date_trunc('minute', now()) - make_interval(mins => minutes - 1);
    RETURN QUERY
    WITH done AS (
        SELECT date_trunc('minute', j.completed_at) AS m, j.state
          FROM jobs AS j
         WHERE j.completed_at >= v_from AND j.state IN ('succeeded', 'failed', 'cancelled')
           AND (dashboard_throughput.queue IS NULL OR j.queue = dashboard_throughput.queue)
    )
    SELECT g.m, count(d.state) FILTER (WHERE d.state = 'succeeded'), count(d.state) FILTER (WHERE d.state = 'failed'),
           count(d.state) FILTER (WHERE d.state = 'cancelled')
      FROM generate_series(v_from, date_trunc('minute', now()), interval '1 minute') AS g(m)
      LEFT JOIN done AS d ON d.m = g.m
     GROUP BY g.m
     ORDER BY g.m;
END;
$$;

-- A fair queue's groups that have live work: pending/scheduled/active counts and when the
-- round-robin last served each (fair_ring_groups), busiest first.
CREATE OR REPLACE FUNCTION pgjobs.dashboard_groups(queue text, max_rows int DEFAULT 100)
RETURNS TABLE (group_key text, pending bigint, scheduled bigint, active bigint, last_served_at timestamptz)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM _check_name('queue', dashboard_groups.queue);
    PERFORM _dashboard_check_page(max_rows, 0);
    RETURN QUERY
    SELECT g.group_key, g.pending, g.scheduled, g.active, gc.last_served_at
      FROM (SELECT j.group_key,
                   count(*) FILTER (WHERE j.state = 'pending') AS pending,
                   count(*) FILTER (WHERE j.state = 'scheduled') AS scheduled,
                   count(*) FILTER (WHERE j.state = 'active') AS active
              FROM jobs AS j
             WHERE j.queue = dashboard_groups.queue AND j.group_key IS NOT NULL
               AND j.state IN ('pending', 'scheduled', 'active')
             GROUP BY j.group_key) AS g
      LEFT JOIN fair_ring_groups(dashboard_groups.queue) AS gc ON gc.group_key = g.group_key
     ORDER BY g.active DESC, g.pending DESC, g.group_key
     LIMIT max_rows;
END;
$$;

-- Workers with what each runs now; stale = not heard from within stale_after (it may be gone: the
-- next reap forgets it and frees its jobs).
CREATE OR REPLACE FUNCTION pgjobs.dashboard_workers(stale_after interval DEFAULT '30 seconds')
RETURNS TABLE (id text, last_seen timestamptz, started_at timestamptz, meta jsonb, stale boolean, running jsonb)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM _check_interval('stale_after', dashboard_workers.stale_after, non_negative => true);
    RETURN QUERY
    SELECT w.id, w.last_seen, w.started_at, w.meta, w.last_seen < now() - dashboard_workers.stale_after,
           coalesce(a.running, '[]'::jsonb)
      FROM workers AS w
      LEFT JOIN (SELECT j.leased_by,
                        jsonb_agg(jsonb_build_object('id', j.id, 'kind', j.kind, 'queue', j.queue,
                                                     'attempt', j.attempt, 'progress', j.progress)
                                  ORDER BY j.id) AS running
                   FROM jobs AS j WHERE j.state = 'active' GROUP BY j.leased_by) AS a
        ON a.leased_by = w.id
     ORDER BY w.id;
END;
$$;

-- Cancel or retry many jobs at once: the ids given, or (ids NULL) every job the list filter matches,
-- newest first, at most max_rows. Each job goes through cancel()/retry() itself (cascades, events and
-- wake-ups included); a job that refuses (wrong state, gone meanwhile) is reported with its error and
-- does not stop the others: one subtransaction per job is what makes that possible.
CREATE OR REPLACE FUNCTION pgjobs.dashboard_bulk(
    action    text,
    ids       bigint[] DEFAULT NULL,
    only_state pgjobs.job_state DEFAULT NULL,
    only_queue text DEFAULT NULL,
    only_kind  text DEFAULT NULL,
    search    text DEFAULT NULL,
    max_rows  int DEFAULT 1000)
RETURNS TABLE (id bigint, done boolean, error text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_ids bigint[];
    v_id bigint;
BEGIN
    IF action IS NULL OR action NOT IN ('cancel', 'retry') THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('action must be cancel or retry, got %s', _shown(action));
    END IF;
    PERFORM _dashboard_check_page(max_rows, 0);
    PERFORM _check_array('ids', ids);
    PERFORM _dashboard_check_filter(only_queue, only_kind, dashboard_bulk.search);
    IF ids IS NOT NULL THEN
        IF cardinality(ids) > max_rows THEN
            RAISE EXCEPTION USING ERRCODE = 'PJ002',
                MESSAGE = format('at most %s ids, got %s', max_rows, cardinality(ids));
        END IF;
        v_ids := ARRAY(SELECT DISTINCT u FROM unnest(ids) AS u WHERE u IS NOT NULL ORDER BY u);
    ELSE
        v_ids := ARRAY(SELECT p.id FROM dashboard_jobs(dashboard_bulk.only_state, dashboard_bulk.only_queue,
                                                       dashboard_bulk.only_kind, dashboard_bulk.search,
                                                       max_rows, 0) AS p);
    END IF;
    FOREACH v_id IN ARRAY v_ids LOOP
        BEGIN
            id := v_id;
            done := CASE WHEN action = 'cancel' THEN pgjobs.cancel(v_id) ELSE pgjobs.retry(v_id) END;
            error := NULL;
        EXCEPTION WHEN SQLSTATE 'PJ003' OR SQLSTATE 'PJ004' THEN
            done := false;
            error := SQLERRM;
        END;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- "Run now" for a schedule: one job of the schedule's kind, payload, queue, priority and attempts,
-- enqueued at once, without moving the schedule's next run. Returns the new job's id.
CREATE OR REPLACE FUNCTION pgjobs.trigger_schedule(name text)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_s schedules%ROWTYPE;
    v_id bigint;
BEGIN
    PERFORM _check_name('name', trigger_schedule.name, 200);
    SELECT * INTO v_s FROM schedules AS s WHERE s.name = trigger_schedule.name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ003',
            MESSAGE = format('schedule %s not found', _shown(trigger_schedule.name));
    END IF;
    SELECT e.id INTO v_id
      FROM pgjobs.enqueue(kind => v_s.kind, payload => v_s.payload, queue => v_s.queue, priority => v_s.priority,
                          max_attempts => v_s.max_attempts,
                          meta => jsonb_build_object('triggered_schedule', v_s.name)) AS e;
    UPDATE jobs AS j SET schedule_name = v_s.name WHERE j.id = v_id AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[]);
    RETURN v_id;
END;
$$;
