-- Workers: presence (heartbeat) and recovery of the jobs of workers that went silent.

CREATE OR REPLACE FUNCTION pgjobs.worker_heartbeat(worker text, meta jsonb DEFAULT '{}')
RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM _check_name('worker', worker);  -- limits: checks.sql
    -- A NULL meta keeps what the worker reported before (EXCLUDED.meta is never NULL here).
    INSERT INTO workers AS w (id, meta) VALUES (worker, coalesce(meta, '{}'))
    ON CONFLICT (id) DO UPDATE SET last_seen = now(), meta = coalesce(worker_heartbeat.meta, w.meta);
    PERFORM _maintain_if_due();  -- the maintenance pass (maintain.sql), at most every few seconds
    RETURN now();
END;
$$;

-- Forgets workers silent for longer than stale_after and makes their leased jobs claimable at
-- once (lease expired now), so a crashed worker's jobs do not wait out their lease. The jobs'
-- tokens stay, so a worker that was only slow and comes back can still finish them until a
-- claimer takes them. Returns how many workers were forgotten.
CREATE OR REPLACE FUNCTION pgjobs.reap_workers(stale_after interval DEFAULT '1 minute')
RETURNS int
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_gone text[];
    v_queues text[];
BEGIN
    -- SKIP LOCKED does not cover a job row moved to history after the statement's snapshot: locking it
    -- raises 40001 ("tuple to be locked was already moved to another partition", history.sql) in READ
    -- COMMITTED: the whole call again, in a new snapshot that sees the job gone from jobs_live.
    FOR i IN 1..20 LOOP
        BEGIN
            -- 0 is allowed: every worker not seen in this very transaction is forgotten.
            IF stale_after IS NULL OR stale_after < interval '0' THEN
                RAISE EXCEPTION USING ERRCODE = 'PJ002',
                    MESSAGE = format('stale_after must not be negative, got %s', coalesce(stale_after::text, 'NULL'));
            END IF;
            PERFORM _check_interval('stale_after', stale_after, non_negative => true);  -- limits: checks.sql
            -- Rows locked in id order and SKIP LOCKED, workers and jobs alike: reap_workers runs in every
            -- worker's heartbeat loop, concurrently with other reapers and with the completions and renewals
            -- of the very jobs it frees. A plain multi-row UPDATE locked them in scan order and deadlocked
            -- with a complete_many over the same jobs in its own order (tests/runtime/test_lease_races.py).
            -- A worker row held by another transaction is its heartbeat (alive: not reaped) or another
            -- reaper's delete (that one counts it); a job row held elsewhere is ending, being renewed by its
            -- live worker or claimed: none needs its lease cut short (the lease still ends on time).
            WITH gone AS (
                DELETE FROM workers AS w
                 WHERE w.id = ANY (ARRAY(SELECT s.id FROM workers AS s WHERE s.last_seen < now() - stale_after
                                          ORDER BY s.id FOR UPDATE SKIP LOCKED))
                RETURNING w.id)
            SELECT array_agg(gone.id) INTO v_gone FROM gone;
            IF v_gone IS NULL THEN
                RETURN 0;
            END IF;
            -- The gone workers' jobs, found among the active ones (jobs_active_idx holds exactly those).
            WITH freed AS (
                UPDATE jobs AS j SET lease_expires_at = least(j.lease_expires_at, now() - interval '1 microsecond')
                 WHERE j.id = ANY (ARRAY(SELECT a.id FROM jobs AS a WHERE a.state = 'active' AND a.leased_by = ANY (v_gone)
                                          ORDER BY a.id FOR NO KEY UPDATE SKIP LOCKED))
                   AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
                RETURNING j.queue)
            SELECT array_agg(DISTINCT freed.queue) INTO v_queues FROM freed;
            PERFORM _wake(v_queues);
            RETURN cardinality(v_gone);
        EXCEPTION WHEN serialization_failure THEN
            PERFORM _lost_race(i, SQLERRM);  -- (sql/history.sql, ROW MOVEMENT)
        END;
    END LOOP;
END;
$$;

-- status: 'live' while the worker heartbeats, 'stale' once it has been silent for stale_after (default:
-- three of its own heartbeat intervals, from its meta, else 30 s). A stopped worker deregisters, so what
-- stays 'stale' crashed or lost the database; reap_workers forgets it.
CREATE OR REPLACE FUNCTION pgjobs.list_workers(stale_after interval DEFAULT NULL)
RETURNS TABLE (id text, last_seen timestamptz, meta jsonb, started_at timestamptz, active_jobs bigint, status text)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- now() minus 100 million years is out of timestamp range: bad input is PJ002 (limits: checks.sql)
    PERFORM _check_interval('stale_after', stale_after, non_negative => true, nullable => true);
    -- One pass over the active jobs (jobs_active_idx), not one per worker.
    RETURN QUERY
    SELECT w.id, w.last_seen, w.meta, w.started_at, coalesce(a.n, 0),
           CASE WHEN w.last_seen >= now() - coalesce(
                    list_workers.stale_after,
                    make_interval(secs => 3 * coalesce(_heartbeat_seconds(w.meta), 10)))
                THEN 'live' ELSE 'stale' END
      FROM workers AS w
      LEFT JOIN (SELECT j.leased_by, count(*) AS n FROM jobs AS j WHERE j.state = 'active' GROUP BY j.leased_by) AS a
        ON a.leased_by = w.id
     ORDER BY w.id;
END;
$$;

-- The heartbeat interval a worker reported in its meta, in seconds (NULL when absent, not a number or not
-- in (0, 1 day]: meta is whatever the worker sent, and a bad value, such as one whose triple overflows an
-- interval, must not break list_workers for everyone).
CREATE OR REPLACE FUNCTION pgjobs._heartbeat_seconds(meta jsonb)
RETURNS float8
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT CASE WHEN jsonb_typeof(meta -> 'heartbeat_interval') = 'number'
                 AND (meta ->> 'heartbeat_interval')::numeric > 0
                 AND (meta ->> 'heartbeat_interval')::numeric <= 86400
                THEN (meta ->> 'heartbeat_interval')::float8 END;
$$;

-- A worker that stops says so: its row goes (it is no longer listed as live, nor left to look stale), and
-- any job it still holds (one it could not release before its deadline) is claimable at once instead of at
-- its lease's end, as reap_workers does for a silent worker. The jobs' tokens stay: a completion still in
-- flight from it is not refused until a claimer takes the job. Returns false when the worker was not
-- registered (already reaped during an outage, say): nothing to do, not an error.
CREATE OR REPLACE FUNCTION pgjobs.deregister_worker(worker text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_queues text[];
BEGIN
    -- SKIP LOCKED does not cover a job row moved to history after the statement's snapshot: locking it
    -- raises 40001 ("tuple to be locked was already moved to another partition", history.sql) in READ
    -- COMMITTED: the whole call again, in a new snapshot that sees the job gone from jobs_live.
    FOR i IN 1..20 LOOP
        BEGIN
            PERFORM _check_name('worker', worker);  -- limits: checks.sql
            DELETE FROM workers AS w WHERE w.id = deregister_worker.worker;
            IF NOT FOUND THEN
                RETURN false;
            END IF;
            -- (locked in id order, SKIP LOCKED: see reap_workers)
            WITH freed AS (
                UPDATE jobs AS j SET lease_expires_at = least(j.lease_expires_at, now() - interval '1 microsecond')
                 WHERE j.id = ANY (ARRAY(SELECT a.id FROM jobs AS a
                                          WHERE a.state = 'active' AND a.leased_by = deregister_worker.worker
                                          ORDER BY a.id FOR NO KEY UPDATE SKIP LOCKED))
                   AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
                RETURNING j.queue)
            SELECT array_agg(DISTINCT freed.queue) INTO v_queues FROM freed;
            PERFORM _wake(v_queues);
            RETURN true;
        EXCEPTION WHEN serialization_failure THEN
            PERFORM _lost_race(i, SQLERRM);  -- (sql/history.sql, ROW MOVEMENT)
        END;
    END LOOP;
END;
$$;

-- Kinds whose claimable jobs no live worker takes: a job of a kind nobody handles (or in a queue nobody
-- serves) stays pending forever, with no error anywhere, unless something says so. The worker logs them
-- (once per kind), `pgjobs stats` / `status` and the dashboard show them.
-- A live worker (list_workers' 'live') takes a job when its heartbeat meta lists the job's queue in
-- `queues` and its kind in `kinds` (a Python worker reports both); a meta without `queues` (or `kinds`),
-- such as a worker in another language reports, counts as serving every queue (or kind).
-- Read: the head of each queue in claim order (pending, then due scheduled jobs), at most `sample` jobs
-- each. Jobs nobody claims sink to that head (everything else is claimed past them), so the head finds
-- them at a bounded cost, whatever the backlog. `jobs` counts those in the sample; `served` says whether
-- some live worker serves the queue at all (false: the queue is the problem, not the kind).
CREATE OR REPLACE FUNCTION pgjobs.unhandled_kinds(queues text[] DEFAULT NULL, sample int DEFAULT 1000)
RETURNS TABLE (queue text, kind text, jobs bigint, oldest timestamptz, served boolean)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_queues text[] := unhandled_kinds.queues;
    v_sample int := unhandled_kinds.sample;
BEGIN
    PERFORM _check_array('queues', v_queues);  -- limits: checks.sql
    PERFORM _check_count('sample', v_sample, 1, 100000);
    RETURN QUERY
    WITH RECURSIVE pend AS (  -- the queues with pending jobs: one descent of jobs_pending_idx each
        (SELECT j.queue FROM jobs AS j WHERE j.state = 'pending' ORDER BY j.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT j.queue FROM jobs AS j WHERE j.state = 'pending' AND j.queue > p.queue ORDER BY j.queue LIMIT 1)
          FROM pend AS p WHERE p.queue IS NOT NULL
    ), sched AS (  -- and with scheduled ones (due or not: the head read below keeps the due)
        (SELECT j.queue FROM jobs AS j WHERE j.state = 'scheduled' ORDER BY j.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT j.queue FROM jobs AS j WHERE j.state = 'scheduled' AND j.queue > s.queue ORDER BY j.queue LIMIT 1)
          FROM sched AS s WHERE s.queue IS NOT NULL
    ), q AS (
        SELECT DISTINCT x.queue FROM (SELECT p.queue FROM pend AS p UNION ALL SELECT s.queue FROM sched AS s) AS x
         WHERE x.queue IS NOT NULL AND (v_queues IS NULL OR x.queue = ANY (v_queues))
    ), head AS (
        SELECT q.queue, h.kind, h.run_at
          FROM q
         CROSS JOIN LATERAL (
                (SELECT j.kind, j.run_at FROM jobs AS j WHERE j.state = 'pending' AND j.queue = q.queue
                  ORDER BY j.priority, j.run_at, j.id LIMIT v_sample)
                UNION ALL
                (SELECT j.kind, j.run_at FROM jobs AS j
                  WHERE j.state = 'scheduled' AND j.queue = q.queue AND j.run_at <= now()
                  ORDER BY j.run_at LIMIT v_sample)) AS h
    ), live AS (
        SELECT w.meta FROM workers AS w
         WHERE w.last_seen >= now() - make_interval(secs => 3 * coalesce(_heartbeat_seconds(w.meta), 10))
    ), grouped AS (
        SELECT h.queue, h.kind, count(*) AS jobs, min(h.run_at) AS oldest FROM head AS h GROUP BY h.queue, h.kind
    )
    SELECT g.queue, g.kind, g.jobs, g.oldest,
           EXISTS (SELECT 1 FROM live AS l WHERE _meta_lists(l.meta, 'queues', g.queue))
      FROM grouped AS g
     WHERE NOT EXISTS (SELECT 1 FROM live AS l
                        WHERE _meta_lists(l.meta, 'queues', g.queue) AND _meta_lists(l.meta, 'kinds', g.kind))
     ORDER BY g.queue, g.kind;
END;
$$;

-- True when a worker's meta lists `value` under `key` (an array of names or an object keyed by them), or
-- does not say (no such key, or not a list): a worker that does not report its queues or kinds may take any.
CREATE OR REPLACE FUNCTION pgjobs._meta_lists(meta jsonb, key text, value text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT coalesce(jsonb_typeof(meta -> key), '') NOT IN ('array', 'object') OR (meta -> key) ? value;
$$;
