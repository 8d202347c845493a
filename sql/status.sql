-- Reading state. Reads of an unknown id return no row (mutations raise PJ003 instead).

CREATE OR REPLACE FUNCTION pgjobs.job_status(id bigint)
RETURNS SETOF pgjobs.job_status
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- (PL/pgSQL: a SQL function with SET clauses is planned again on every call; subscribers
    -- re-read statuses often.)
    RETURN QUERY
    SELECT j.id, j.kind, j.queue, j.payload, j.meta, j.state, j.priority, j.run_at, j.created_at, j.attempt,
           j.max_attempts, j.lease_token, j.leased_by, j.lease_expires_at, j.first_started_at, j.completed_at,
           j.last_error, j.errors, j.checkpoint, j.progress, j.result, j.unique_key, j.unique_live_only,
           j.group_key, j.batch_id, j.remaining_deps, j.failed_deps, j.schedule_name, j.cancel_requested,
           j.has_dependents,
           coalesce((SELECT jsonb_agg(CASE WHEN e.parent_job_id IS NOT NULL
                                           THEN jsonb_build_object('job', e.parent_job_id, 'on', e.trigger)
                                           ELSE jsonb_build_object('batch', e.parent_batch_id, 'on', e.trigger) END
                                      ORDER BY e.parent_job_id NULLS LAST, e.parent_batch_id)
                       FROM edges AS e WHERE e.child_id = j.id), '[]'::jsonb)
      FROM jobs AS j
     WHERE j.id = job_status.id;
END;
$$;

CREATE OR REPLACE FUNCTION pgjobs.stats()
RETURNS TABLE (queue text, state pgjobs.job_state, jobs bigint)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT j.queue, j.state, count(*) FROM jobs AS j GROUP BY j.queue, j.state ORDER BY j.queue, j.state;
$$;

-- Newest first. `search` matches kind, unique_key or the payload's JSON text, case-insensitively (substring).
-- count_jobs below counts what the same filters match (the CLI's "N of M"): keep their WHERE clauses in step.
CREATE OR REPLACE FUNCTION pgjobs.list_jobs(
    state     pgjobs.job_state DEFAULT NULL,
    queue     text DEFAULT NULL,
    kind      text DEFAULT NULL,
    search    text DEFAULT NULL,
    max_rows  int DEFAULT 100,
    skip_rows int DEFAULT 0)
RETURNS SETOF pgjobs.jobs
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF max_rows IS NULL OR max_rows < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = format('max_rows must be >= 0, got %s', coalesce(max_rows::text, 'NULL'));
    ELSIF skip_rows IS NULL OR skip_rows < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = format('skip_rows must be >= 0, got %s', coalesce(skip_rows::text, 'NULL'));
    END IF;
    PERFORM _check_count('max_rows', max_rows, 0, 100000);  -- limits: checks.sql
    RETURN QUERY
    SELECT j.* FROM jobs AS j
     WHERE (list_jobs.state IS NULL OR j.state = list_jobs.state)
       AND (list_jobs.queue IS NULL OR j.queue = list_jobs.queue)
       AND (list_jobs.kind IS NULL OR j.kind = list_jobs.kind)
       AND (list_jobs.search IS NULL
            OR strpos(lower(j.kind), lower(list_jobs.search)) > 0
            OR strpos(lower(coalesce(j.unique_key, '')), lower(list_jobs.search)) > 0
            OR strpos(lower(j.payload::text), lower(list_jobs.search)) > 0)
     ORDER BY j.created_at DESC, j.id DESC
     LIMIT max_rows OFFSET skip_rows;
END;
$$;

-- How many jobs list_jobs' filters match, all pages together.
CREATE OR REPLACE FUNCTION pgjobs.count_jobs(
    state  pgjobs.job_state DEFAULT NULL,
    queue  text DEFAULT NULL,
    kind   text DEFAULT NULL,
    search text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN (SELECT count(*) FROM jobs AS j
             WHERE (count_jobs.state IS NULL OR j.state = count_jobs.state)
               AND (count_jobs.queue IS NULL OR j.queue = count_jobs.queue)
               AND (count_jobs.kind IS NULL OR j.kind = count_jobs.kind)
               AND (count_jobs.search IS NULL
                    OR strpos(lower(j.kind), lower(count_jobs.search)) > 0
                    OR strpos(lower(coalesce(j.unique_key, '')), lower(count_jobs.search)) > 0
                    OR strpos(lower(j.payload::text), lower(count_jobs.search)) > 0));
END;
$$;

-- Every configured queue's settings (the rows configure_queue wrote), by name: the queue list of the
-- CLI and the dashboard, for roles that have no privilege on the table.
CREATE OR REPLACE FUNCTION pgjobs.list_queues()
RETURNS SETOF pgjobs.queues
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT q.* FROM queues AS q ORDER BY q.queue;
$$;
