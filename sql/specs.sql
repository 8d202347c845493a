-- Job specs, the JSON objects of enqueue_many, a graph, a batch or a recurring run: their checks
-- (_check_specs) and their insertion (_insert_specs, with the bounded queues' room taken first by
-- _reserve_capacity). Below both enqueue.sql and graph.sql, which build on them; enqueue.sql's header
-- explains why the inserts name the leaf jobs_live and what a producer's call costs.

-- True when `value` reads as a timestamptz (PostgreSQL 15 has no pg_input_is_valid).
CREATE OR REPLACE FUNCTION pgjobs._is_timestamp(value text)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    PERFORM value::timestamptz;
    RETURN true;
EXCEPTION WHEN data_exception THEN
    RETURN false;
END;
$$;

-- Validates an array of job specs: PJ002 naming the first bad spec (index and ref) and value.
CREATE OR REPLACE FUNCTION pgjobs._check_specs(jobs jsonb, label text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    v_bad record;
BEGIN
    IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array' THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('%s must be a JSON array of job specs, got %s', label, _shown(jobs::text));
    END IF;
    SELECT c.n, c.spec, c.problem INTO v_bad
      FROM (SELECT s.n, s.spec,
                   CASE
                     WHEN jsonb_typeof(s.spec) <> 'object' THEN format('a job spec must be a JSON object, got %s', _shown(s.spec::text))
                     WHEN s.spec - '{kind,payload,queue,run_at,priority,max_attempts,unique_key,unique_live_only,group_key,rate_key,meta,ref,depends_on}'::text[] <> '{}'
                       THEN format('unknown key(s) %s', (SELECT left(string_agg(quote_literal(k), ', '), 200)
                                                          FROM jsonb_object_keys(s.spec - '{kind,payload,queue,run_at,priority,max_attempts,unique_key,unique_live_only,group_key,rate_key,meta,ref,depends_on}'::text[]) AS k))
                     WHEN jsonb_typeof(s.spec -> 'kind') IS DISTINCT FROM 'string' OR s.spec ->> 'kind' = ''
                       THEN format('kind must be a non-empty string, got %s', coalesce(_shown((s.spec -> 'kind')::text), 'nothing'))
                     WHEN s.spec ? 'queue' AND (jsonb_typeof(s.spec -> 'queue') <> 'string' OR s.spec ->> 'queue' = '')
                       THEN format('queue must be a non-empty string, got %s', _shown((s.spec -> 'queue')::text))
                     -- (limits: checks.sql)
                     WHEN octet_length(s.spec ->> 'kind') > 1000
                       THEN format('kind must be at most 1000 bytes, got %s', _shown(s.spec ->> 'kind'))
                     WHEN octet_length(s.spec ->> 'queue') > 1000
                       THEN format('queue must be at most 1000 bytes, got %s', _shown(s.spec ->> 'queue'))
                     WHEN jsonb_typeof(s.spec -> 'payload') = 'null'
                       THEN 'payload must not be null (use {} for none)'
                     WHEN s.spec ? 'payload' AND jsonb_typeof(s.spec -> 'payload') <> 'object'
                       THEN format('payload must be a JSON object, got %s', _shown((s.spec -> 'payload')::text))
                     WHEN s.spec ? 'meta' AND jsonb_typeof(s.spec -> 'meta') <> 'object'
                       THEN format('meta must be a JSON object, got %s', _shown((s.spec -> 'meta')::text))
                     WHEN s.spec ? 'priority' AND (jsonb_typeof(s.spec -> 'priority') <> 'number'
                                                   OR (s.spec ->> 'priority')::numeric NOT BETWEEN -32768 AND 32767
                                                   OR (s.spec ->> 'priority')::numeric % 1 <> 0)
                       THEN format('priority must be an integer between -32768 and 32767, got %s', _shown((s.spec -> 'priority')::text))
                     WHEN s.spec ? 'max_attempts' AND (jsonb_typeof(s.spec -> 'max_attempts') <> 'number'
                                                       OR (s.spec ->> 'max_attempts')::numeric NOT BETWEEN 1 AND 2147483647
                                                       OR (s.spec ->> 'max_attempts')::numeric % 1 <> 0)
                       THEN format('max_attempts must be an integer >= 1, got %s', _shown((s.spec -> 'max_attempts')::text))
                     WHEN jsonb_typeof(s.spec -> 'run_at') NOT IN ('string', 'null')
                          OR (jsonb_typeof(s.spec -> 'run_at') = 'string' AND NOT _is_timestamp(s.spec ->> 'run_at'))
                       THEN format('run_at must be an ISO 8601 timestamp, got %s', _shown((s.spec -> 'run_at')::text))
                     WHEN jsonb_typeof(s.spec -> 'run_at') = 'string' AND NOT _time_ok((s.spec ->> 'run_at')::timestamptz)
                       THEN format('run_at must be a finite time in years 1 to 9999, got %s',
                                   _shown(s.spec ->> 'run_at'))
                     WHEN jsonb_typeof(s.spec -> 'unique_key') NOT IN ('string', 'null')
                       THEN format('unique_key must be a string, got %s', _shown((s.spec -> 'unique_key')::text))
                     WHEN octet_length(s.spec ->> 'unique_key') > 1000
                       THEN format('unique_key must be at most 1000 bytes, got %s', _shown(s.spec ->> 'unique_key'))
                     WHEN jsonb_typeof(s.spec -> 'group_key') NOT IN ('string', 'null')
                       THEN format('group_key must be a string, got %s', _shown((s.spec -> 'group_key')::text))
                     WHEN octet_length(s.spec ->> 'group_key') > 1000
                       THEN format('group_key must be at most 1000 bytes, got %s', _shown(s.spec ->> 'group_key'))
                     WHEN jsonb_typeof(s.spec -> 'rate_key') NOT IN ('string', 'null') OR s.spec ->> 'rate_key' = ''
                       THEN format('rate_key must be a non-empty string, got %s', _shown((s.spec -> 'rate_key')::text))
                     WHEN octet_length(s.spec ->> 'rate_key') > 1000
                       THEN format('rate_key must be at most 1000 bytes, got %s', _shown(s.spec ->> 'rate_key'))
                     WHEN jsonb_typeof(s.spec -> 'unique_live_only') NOT IN ('boolean', 'null')
                       THEN format('unique_live_only must be a boolean, got %s', _shown((s.spec -> 'unique_live_only')::text))
                     WHEN jsonb_typeof(s.spec -> 'ref') NOT IN ('string', 'number', 'null')
                       THEN format('ref must be a string, got %s', _shown((s.spec -> 'ref')::text))
                   END AS problem
              FROM jsonb_array_elements(jobs) WITH ORDINALITY AS s(spec, n)) AS c
     WHERE c.problem IS NOT NULL
     ORDER BY c.n
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('%s[%s]%s: %s', label, v_bad.n - 1,
                             CASE WHEN jsonb_typeof(v_bad.spec) = 'object' AND v_bad.spec ? 'ref'
                                  THEN format(' (ref %s)', left(v_bad.spec ->> 'ref', 100)) ELSE '' END,
                             v_bad.problem);
    END IF;
END;
$$;

-- Counts a bounded queue's live jobs under a per-queue transaction lock, so two enqueuers
-- racing for the last free slot cannot both take it. Raises PJ001 when `adding` would not fit.
-- Planned per call, unlike the hot paths (whose callers' generic-plan setting it would inherit):
-- whether a queue's jobs are few enough to count by index depends on which queue it is, which a
-- generic plan cannot see.
CREATE OR REPLACE FUNCTION pgjobs._reserve_capacity(queue text, adding int)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    v_max  int;
    v_live bigint;
BEGIN
    SELECT q.max_length INTO v_max FROM queues AS q WHERE q.queue = _reserve_capacity.queue;
    IF v_max IS NULL OR adding <= 0 THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('pgjobs.queue:' || _reserve_capacity.queue, 0));
    -- Count with a fresh snapshot taken after the lock: the previous holder has committed.
    -- One count per live state, each on that state's partial index: no index serves
    -- `state IN (...)`, and the table scan it would take grows with every finished job.
    -- Each count stops at v_max, enough to decide.
    SELECT least(v_max, (SELECT count(*) FROM (SELECT 1 FROM jobs AS j WHERE j.queue = _reserve_capacity.queue
                                                    AND j.state = 'pending' LIMIT v_max) AS s)
                        + (SELECT count(*) FROM (SELECT 1 FROM jobs AS j WHERE j.queue = _reserve_capacity.queue
                                                    AND j.state = 'scheduled' LIMIT v_max) AS s)
                        + (SELECT count(*) FROM (SELECT 1 FROM jobs AS j WHERE j.queue = _reserve_capacity.queue
                                                    AND j.state = 'active' LIMIT v_max) AS s)
                        + (SELECT count(*) FROM (SELECT 1 FROM jobs AS j WHERE j.queue = _reserve_capacity.queue
                                                    AND j.state = 'waiting' LIMIT v_max) AS s))
      INTO v_live;
    IF v_live + adding > v_max THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ001',
            MESSAGE = format('queue %L is full: %s of max_length %s jobs are live, cannot add %s',
                             _reserve_capacity.queue, v_live, v_max, adding);
    END IF;
END;
$$;

-- Inserts validated specs in one statement. Ids are reserved with nextval() first so a spec
-- can be matched to its row (and, in graph.sql, so edges can point at rows of the same call):
-- `ids` optionally passes ids reserved by the caller (parallel to the array). `batch` sets
-- batch_id; `waiting` (parallel array) puts a spec in state 'waiting'; `parents` (parallel
-- array) marks a spec that other specs of the call depend on (has_dependents, set here so the
-- row is not written twice). A spec whose unique key is held returns the holder with
-- created = false.
CREATE OR REPLACE FUNCTION pgjobs._insert_specs(jobs jsonb, batch bigint, ids bigint[],
                                                waiting boolean[] DEFAULT NULL, parents boolean[] DEFAULT NULL)
RETURNS TABLE (n bigint, ref text, id bigint, created boolean, batch_id bigint, state pgjobs.job_state,
               queue text, kind text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_count   int := jsonb_array_length(jobs);
    v_ids     bigint[] := ids;
    v_now     timestamptz := now();
    v_created bigint[];
    v_states  job_state[];
    v_queues  text[];
    v_kinds   text[];
    v_batches bigint[];
    v_wake    text[];
    v_bounded record;
    v_keyed   bigint[];
    v_gone    bigint;
BEGIN
    IF v_count = 0 THEN
        RETURN;
    END IF;
    IF v_ids IS NULL THEN
        v_ids := ARRAY(SELECT nextval('pgjobs.jobs_id_seq') FROM generate_series(1, v_count));
    END IF;

    -- Bounded queues (rare, and skipped at the cost of one probe when no queue is bounded):
    -- reserve room for the specs that would create a job.
    IF EXISTS (SELECT 1 FROM queues AS bq WHERE bq.max_length IS NOT NULL) THEN
        FOR v_bounded IN
            -- Grouped by the queue each spec lands in: an omitted queue and an explicit 'default'
            -- are one queue, and two reservations of it would each miss the other's jobs.
            -- Specs repeating one unique key make one job: counted once.
            SELECT coalesce(s.spec ->> 'queue', 'default') AS queue,
                   (count(*) FILTER (WHERE s.spec ->> 'unique_key' IS NULL)
                    + count(DISTINCT ARRAY[s.spec ->> 'kind', s.spec ->> 'unique_key'])
                          FILTER (WHERE s.spec ->> 'unique_key' IS NOT NULL))::int AS adding
              FROM jsonb_array_elements(jobs) AS s(spec)
              JOIN queues AS q ON q.queue = coalesce(s.spec ->> 'queue', 'default') AND q.max_length IS NOT NULL
             WHERE NOT EXISTS (SELECT 1 FROM job_keys AS h
                                WHERE s.spec ? 'unique_key' AND h.kind = s.spec ->> 'kind'
                                  AND h.unique_key = s.spec ->> 'unique_key')
             GROUP BY 1
             ORDER BY 1
        LOOP
            PERFORM _reserve_capacity(v_bounded.queue, v_bounded.adding);
        END LOOP;
    END IF;

    -- jsonb_to_recordset reads every key of a spec in one pass (a ->> per column costs a
    -- lookup each). Numbers go through numeric: JSON 5.0 is a valid integer (_check_specs),
    -- '5.0'::smallint is not. Without any unique key no row can conflict, and the insert skips
    -- job_keys (a speculative insertion and its WAL record per key); the two job inserts differ
    -- only by the filter on the keys won.
    IF jsonb_path_exists(jobs, 'lax $[*].unique_key ? (@.type() == "string")') THEN
        -- The keys first, in the specs' order: job_keys' primary key decides which spec (or which racing
        -- transaction) makes the job of a key; the specs that lost insert no job.
        v_keyed := '{}';
        FOR i IN 1..2 LOOP
            WITH k AS (
                INSERT INTO job_keys AS k (kind, unique_key, job_id)
                SELECT r.kind, r.unique_key, v_ids[r.n]
                  FROM ROWS FROM (jsonb_to_recordset(jobs) AS (kind text, unique_key text))
                       WITH ORDINALITY AS r(kind, unique_key, n)
                 WHERE r.unique_key IS NOT NULL
                 ORDER BY r.n
                ON CONFLICT (kind, unique_key) DO NOTHING
                RETURNING k.job_id)
            SELECT v_keyed || coalesce(array_agg(k.job_id), '{}') INTO v_keyed FROM k;
            -- Keys held by a job that is gone (its row deleted by hand: pgjobs' own deletes take the
            -- key along) are free: released, then taken on the second turn. Only when a key was lost.
            EXIT WHEN i = 2 OR cardinality(v_keyed) = (SELECT count(*) FROM jsonb_array_elements(jobs) AS e
                                                         WHERE jsonb_typeof(e -> 'unique_key') = 'string');
            WITH gone AS (
                DELETE FROM job_keys AS k
                 USING ROWS FROM (jsonb_to_recordset(jobs) AS (kind text, unique_key text)) AS r(kind, unique_key)
                 WHERE k.kind = r.kind AND k.unique_key = r.unique_key AND NOT (k.job_id = ANY (v_keyed))
                   AND NOT EXISTS (SELECT 1 FROM pgjobs.jobs AS j WHERE j.id = k.job_id)
                RETURNING 1)
            SELECT count(*) INTO v_gone FROM gone;
            EXIT WHEN v_gone = 0;
        END LOOP;
        WITH ins AS (
            INSERT INTO jobs_live AS j (id, kind, queue, payload, meta, state, priority, run_at, max_attempts,
                                        unique_key, unique_live_only, group_key, batch_id, has_dependents, rate_key)
            SELECT v_ids[r.n], r.kind, coalesce(r.queue, 'default'), coalesce(r.payload, '{}'),
                   coalesce(r.meta, '{}'),
                   CASE WHEN coalesce(waiting[r.n], false) THEN 'waiting'::job_state
                        WHEN r.run_at > v_now THEN 'scheduled'
                        ELSE 'pending' END,
                   coalesce(r.priority::smallint, 0), coalesce(r.run_at, v_now), coalesce(r.max_attempts::int, 20),
                   r.unique_key, coalesce(r.unique_live_only, false), r.group_key, batch,
                   coalesce(parents[r.n], false), r.rate_key
              FROM ROWS FROM (jsonb_to_recordset(jobs)
                       AS (kind text, queue text, payload jsonb, meta jsonb, run_at timestamptz, priority numeric,
                           max_attempts numeric, unique_key text, unique_live_only boolean, group_key text,
                           rate_key text))
                   WITH ORDINALITY AS r(kind, queue, payload, meta, run_at, priority, max_attempts, unique_key,
                                        unique_live_only, group_key, rate_key, n)
             WHERE r.unique_key IS NULL OR v_ids[r.n] = ANY (v_keyed)
            RETURNING j.id, j.state, j.queue, j.kind, j.batch_id
        )
        SELECT array_agg(ins.id), array_agg(ins.state), array_agg(ins.queue), array_agg(ins.kind),
               array_agg(ins.batch_id), array_agg(DISTINCT ins.queue) FILTER (WHERE ins.state = 'pending')
          INTO v_created, v_states, v_queues, v_kinds, v_batches, v_wake
          FROM ins;
    ELSE
        WITH ins AS (
            INSERT INTO jobs_live AS j (id, kind, queue, payload, meta, state, priority, run_at, max_attempts,
                                        unique_key, unique_live_only, group_key, batch_id, has_dependents, rate_key)
            SELECT v_ids[r.n], r.kind, coalesce(r.queue, 'default'), coalesce(r.payload, '{}'),
                   coalesce(r.meta, '{}'),
                   CASE WHEN coalesce(waiting[r.n], false) THEN 'waiting'::job_state
                        WHEN r.run_at > v_now THEN 'scheduled'
                        ELSE 'pending' END,
                   coalesce(r.priority::smallint, 0), coalesce(r.run_at, v_now), coalesce(r.max_attempts::int, 20),
                   r.unique_key, coalesce(r.unique_live_only, false), r.group_key, batch,
                   coalesce(parents[r.n], false), r.rate_key
              FROM ROWS FROM (jsonb_to_recordset(jobs)
                       AS (kind text, queue text, payload jsonb, meta jsonb, run_at timestamptz, priority numeric,
                           max_attempts numeric, unique_key text, unique_live_only boolean, group_key text,
                           rate_key text))
                   WITH ORDINALITY AS r(kind, queue, payload, meta, run_at, priority, max_attempts, unique_key,
                                        unique_live_only, group_key, rate_key, n)
            RETURNING j.id, j.state, j.queue, j.kind, j.batch_id
        )
        SELECT array_agg(ins.id), array_agg(ins.state), array_agg(ins.queue), array_agg(ins.kind),
               array_agg(ins.batch_id), array_agg(DISTINCT ins.queue) FILTER (WHERE ins.state = 'pending')
          INTO v_created, v_states, v_queues, v_kinds, v_batches, v_wake
          FROM ins;
    END IF;
    PERFORM _wake(v_wake);
    -- The status events: one append to the event log (stream.sql), status_events filtered there.
    PERFORM _log_events(v_created, v_states, v_queues, v_kinds,
                        array_fill(0, ARRAY[coalesce(cardinality(v_created), 0)]), v_batches);

    IF v_created = v_ids THEN
        -- Every spec made its job, in the specs' order (no unique key was held): the rows are
        -- known, nothing to read back. ROWS FROM walks the specs and the arrays in step.
        RETURN QUERY
        SELECT r.n, r.spec ->> 'ref', r.id, true, batch, r.state, r.queue, r.kind
          FROM ROWS FROM (jsonb_array_elements(jobs), unnest(v_created), unnest(v_states), unnest(v_queues),
                          unnest(v_kinds))
               WITH ORDINALITY AS r(spec, id, state, queue, kind, n);
        RETURN;
    END IF;

    -- A fresh statement (and snapshot) reads back holders of keys that were already taken,
    -- including ones committed by a racing transaction while our insert waited on it.
    RETURN QUERY
    SELECT s.n, s.spec ->> 'ref', coalesce(h.id, v_ids[s.n]), h.id IS NULL, coalesce(h.batch_id, batch),
           coalesce(h.state,
                    CASE WHEN coalesce(waiting[s.n], false) THEN 'waiting'::job_state
                         WHEN (s.spec ->> 'run_at')::timestamptz > v_now THEN 'scheduled'
                         ELSE 'pending' END),
           coalesce(s.spec ->> 'queue', 'default'), s.spec ->> 'kind'
      FROM jsonb_array_elements(jobs) WITH ORDINALITY AS s(spec, n)
      LEFT JOIN unnest(v_created) AS c(id) ON c.id = v_ids[s.n]
      LEFT JOIN LATERAL (
            SELECT hj.id, hj.batch_id, hj.state FROM job_keys AS hk JOIN jobs AS hj ON hj.id = hk.job_id
             WHERE c.id IS NULL
               AND hk.kind = s.spec ->> 'kind' AND hk.unique_key = s.spec ->> 'unique_key'
             LIMIT 1) AS h ON true
     ORDER BY s.n;
    IF coalesce(cardinality(v_created), 0) < v_count AND EXISTS (
           SELECT 1 FROM jsonb_array_elements(jobs) WITH ORDINALITY AS s(spec, n)
             LEFT JOIN unnest(v_created) AS c(id) ON c.id = v_ids[s.n]
            WHERE c.id IS NULL
              AND NOT EXISTS (SELECT 1 FROM job_keys AS hk JOIN jobs AS hj ON hj.id = hk.job_id
                               WHERE hk.kind = s.spec ->> 'kind' AND hk.unique_key = s.spec ->> 'unique_key')) THEN
        RAISE EXCEPTION USING ERRCODE = '40001',
            MESSAGE = 'a unique key conflicted with a job this transaction cannot see; retry the transaction';
    END IF;
END;
$$;
