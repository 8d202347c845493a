-- Producing work: enqueue (one job), enqueue_many (a set, in one statement) and enqueue_arrays (a set of
-- plain jobs as columns).
-- All run inside the caller's transaction: the job exists, and listeners hear of it, only if
-- that transaction commits.

-- Plans: the hot functions here run with plan_cache_mode = force_generic_plan (their statements'
-- shapes are fixed by index order and keys, and planning each call cost more than running it)
-- and jit = off (a generic plan cannot see that LIMIT max_jobs is small, so on a big table its
-- cost passes jit_above_cost, and JIT compiled every claim: 25 ms per claim at 1M pending jobs).
-- That setting would carry into the functions they call in other files (graph, fair), so a call
-- into those first restores the planner's default choice for the rest of the function
-- (set_config(..., true) inside a function with a SET clause ends with the function).

-- PRODUCER COSTS (server CPU; same-run comparisons with bench/core_enqueue.py, pgbench and bench peers).
-- * enqueue, per committed call, is about twice a bare one-row INSERT at the server. The difference is
--   what the contract asks of every enqueue: the status event (one event_inbox row, _append_events),
--   pgjobs_wake, the argument checks and the queue's settings. A queue with status_events = 'none' saves
--   the event. Folding the settings read, the insert and the NOTIFY into one statement saves nothing.
-- * enqueue_many of 1,000 plain specs is about 2.5x the bare INSERT from the same JSON: the rows, the
--   status events (their inbox row's arrays compressed with lz4 by the event_log baseline: pglz was a tenth
--   of the call) and the spec checks, in one pass.
-- * enqueue_arrays of 1,000 plain jobs is 1.5-1.8x the bare INSERT: its events are read from the specs
--   rather than from the INSERT's RETURNING rows, and a NULL payloads array stands for {} everywhere.
--
-- Inserts: those whose ids are drawn first (nextval: enqueue with a unique key, _insert_plain_specs,
-- _insert_specs, enqueue_arrays) name the leaf pgjobs.jobs_live, not the partitioned parent: a new job is
-- waiting, scheduled or pending, all of them states of jobs_live (history.sql), and the leaf takes the rows
-- routing would give it, with the same checks: jobs_valid is the leaf's own constraint too, and an insert
-- into a partition checks its partition constraint (a state outside jobs_live fails the statement
-- instead of being routed). No trigger is skipped: the only row trigger (jobs_release_key) is on the
-- history trees, none is on the parent. The inserts that let the parent's identity default draw the id
-- (enqueue without a key, enqueue_staged) stay on the parent: the leaf has no default, and nextval()
-- as a call costs more per row (1.0 ms per 1,000 rows: a function call and a privilege check, where the
-- identity's expression has neither) than routing does (0.25 ms per 1,000); enqueue_staged ran 9-10 %
-- slower with it. (Measured: PRODUCER COSTS above.)

-- Raises PJ002 when a job spec is unusable; the message names the bad value. Limits: checks.sql.
CREATE OR REPLACE FUNCTION pgjobs._check_job_args(kind text, queue text, payload jsonb,
                                                  max_attempts int, label text DEFAULT 'job',
                                                  unique_key text DEFAULT NULL, group_key text DEFAULT NULL,
                                                  run_at timestamptz DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    PERFORM _check_name(label || ': kind', kind);
    PERFORM _check_name(label || ': queue', queue);
    IF payload IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('%s: payload must not be NULL (use ''{}'' for none)', label);
    ELSIF jsonb_typeof(payload) <> 'object' THEN
        -- A handler reads its payload by key: an array or a scalar would fail every attempt.
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('%s: payload must be a JSON object, got %s', label, _shown(payload::text));
    ELSIF max_attempts IS NULL OR max_attempts < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('%s: max_attempts must be >= 1, got %s', label, coalesce(max_attempts::text, 'NULL'));
    END IF;
    PERFORM _check_name(label || ': unique_key', unique_key, 1000, true);
    PERFORM _check_name(label || ': group_key', group_key, 1000, true);
    PERFORM _check_time(label || ': run_at', run_at);
END;
$$;

CREATE OR REPLACE FUNCTION pgjobs.enqueue(
    kind             text,
    payload          jsonb DEFAULT '{}',
    queue            text DEFAULT 'default',
    run_at           timestamptz DEFAULT NULL,
    priority         smallint DEFAULT 0,
    max_attempts     int DEFAULT 20,
    unique_key       text DEFAULT NULL,
    unique_live_only boolean DEFAULT false,
    group_key        text DEFAULT NULL,
    meta             jsonb DEFAULT '{}',
    rate_key         text DEFAULT NULL)
RETURNS TABLE (id bigint, created boolean, state pgjobs.job_state)
LANGUAGE plpgsql
-- (No plan_cache_mode: its statements plan the same either way, and a SET clause costs every call.)
SET search_path = pg_catalog, pgjobs, pg_temp
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_state  job_state := CASE WHEN enqueue.run_at > now() THEN 'scheduled' ELSE 'pending' END;
    v_id     bigint;
    v_found  job_state;
    v_max    int;
    v_events text;
BEGIN
    -- The hot path costs one statement per step: argument checks inline (the helper only words
    -- the error), one read of the queue's settings, the insert, and the notifications built
    -- here rather than through _notify_status (a jsonb round trip that cost more than the insert).
    -- (limits: checks.sql)
    IF enqueue.kind IS NULL OR enqueue.kind = '' OR enqueue.queue IS NULL OR enqueue.queue = ''
       OR enqueue.payload IS NULL OR jsonb_typeof(enqueue.payload) <> 'object'
       OR enqueue.max_attempts IS NULL OR enqueue.max_attempts < 1
       OR octet_length(enqueue.kind) > 1000 OR octet_length(enqueue.queue) > 1000
       OR octet_length(enqueue.unique_key) > 1000 OR octet_length(enqueue.group_key) > 1000
       OR enqueue.rate_key = '' OR octet_length(enqueue.rate_key) > 1000
       OR NOT (enqueue.run_at >= '0001-01-01 00:00:00+00' AND enqueue.run_at < '10000-01-01 00:00:00+00') THEN
        PERFORM _check_job_args(enqueue.kind, enqueue.queue, enqueue.payload, enqueue.max_attempts, 'job',
                                enqueue.unique_key, enqueue.group_key, enqueue.run_at);
        IF enqueue.rate_key = '' THEN   -- (NULL: no key; '' names none either, and is refused)
            RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = 'job: rate_key must be a non-empty string or NULL, got ''''';
        END IF;
        PERFORM _check_name('job: rate_key', enqueue.rate_key, 1000, true);
    END IF;
    SELECT q.max_length, q.status_events INTO v_max, v_events FROM queues AS q WHERE q.queue = enqueue.queue;

    IF enqueue.unique_key IS NULL THEN
        -- No key, no conflict possible: a plain insert.
        IF v_max IS NOT NULL THEN
            PERFORM _reserve_capacity(enqueue.queue, 1);
        END IF;
        -- Through the parent: the identity default draws the id (see "Inserts" above).
        INSERT INTO jobs AS j (kind, queue, payload, meta, state, priority, run_at, max_attempts,
                               unique_live_only, group_key, rate_key)
        VALUES (enqueue.kind, enqueue.queue, enqueue.payload, coalesce(enqueue.meta, '{}'), v_state,
                coalesce(enqueue.priority, 0), coalesce(enqueue.run_at, now()), enqueue.max_attempts,
                coalesce(enqueue.unique_live_only, false), enqueue.group_key, enqueue.rate_key)
        RETURNING j.id INTO v_id;
    ELSE
        FOR i IN 1..10 LOOP
            -- Idempotency first, capacity second: an existing key answers even on a full queue.
            -- The key's holder is in job_keys (history.sql): a unique_live_only key leaves it when
            -- its job ends, any other key when its job is deleted or purged.
            SELECT k.job_id INTO v_id FROM job_keys AS k
             WHERE k.kind = enqueue.kind AND k.unique_key = enqueue.unique_key;
            IF FOUND THEN
                SELECT j.state INTO v_found FROM jobs AS j WHERE j.id = v_id;
                IF FOUND THEN
                    id := v_id;
                    created := false;
                    state := v_found;
                    RETURN NEXT;
                    RETURN;
                END IF;
                -- A key whose job is gone (its row deleted by hand: pgjobs' own deletes take the key
                -- along) is free: a key and its job commit together, so this snapshot would see both.
                DELETE FROM job_keys AS k
                 WHERE k.kind = enqueue.kind AND k.unique_key = enqueue.unique_key AND k.job_id = v_id;
            END IF;

            IF i = 1 AND v_max IS NOT NULL THEN
                PERFORM _reserve_capacity(enqueue.queue, 1);
            END IF;

            -- The key table's primary key, not the check above, decides a race between two enqueuers:
            -- the loser waits on the winner's uncommitted key, then inserts nothing.
            v_id := nextval('pgjobs.jobs_id_seq');
            INSERT INTO job_keys AS k (kind, unique_key, job_id)
            VALUES (enqueue.kind, enqueue.unique_key, v_id)
            ON CONFLICT (kind, unique_key) DO NOTHING;
            IF FOUND THEN
                INSERT INTO jobs_live AS j (id, kind, queue, payload, meta, state, priority, run_at, max_attempts,
                                            unique_key, unique_live_only, group_key, rate_key)
                VALUES (v_id, enqueue.kind, enqueue.queue, enqueue.payload, coalesce(enqueue.meta, '{}'), v_state,
                        coalesce(enqueue.priority, 0), coalesce(enqueue.run_at, now()), enqueue.max_attempts,
                        enqueue.unique_key, coalesce(enqueue.unique_live_only, false), enqueue.group_key,
                        enqueue.rate_key);
                EXIT;
            END IF;
            v_id := NULL;
            -- Lost the race to a holder that committed after our snapshot: read it on the next turn
            -- (each statement takes a fresh snapshot under READ COMMITTED).
        END LOOP;
        IF v_id IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '40001',
                MESSAGE = format('enqueue of %L with unique_key %L kept conflicting with a job this transaction cannot see; retry the transaction',
                                 enqueue.kind, enqueue.unique_key);
        END IF;
    END IF;

    IF enqueue.rate_key IS NOT NULL THEN
        PERFORM _rate_note_queues(ARRAY[enqueue.queue]);   -- (rate_limits.sql)
    END IF;
    IF v_state = 'pending' THEN
        PERFORM pg_notify('pgjobs_wake', enqueue.queue);
    END IF;
    -- A new job is never terminal: only queues whose status_events is 'all' (the default) log it.
    -- The event log's append (stream.sql): one call.
    IF v_events IS NULL OR v_events = 'all' THEN
        PERFORM _append_events(ARRAY[v_id], ARRAY[v_state], ARRAY[enqueue.queue], ARRAY[enqueue.kind], '{0}', '{NULL}');
    END IF;
    id := v_id;
    created := true;
    state := v_state;
    RETURN NEXT;
END;
$$;

-- Bulk enqueue. `jobs` is a JSON array of specs with the enqueue() arguments as keys, plus
-- `ref` (a label returned back) and `depends_on` (see graph.sql). All or nothing.
CREATE OR REPLACE FUNCTION pgjobs.enqueue_many(jobs jsonb, as_batch boolean DEFAULT false)
RETURNS TABLE (ref text, id bigint, created boolean, batch_id bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    -- Specs with a rate_key: their queues are noted for the claims (rate_limits.sql). A spec that is
    -- refused below aborts the call, and the note with it.
    IF jsonb_typeof(enqueue_many.jobs) = 'array'
       AND jsonb_path_exists(enqueue_many.jobs, 'lax $[*].rate_key ? (@.type() == "string")') THEN
        PERFORM _rate_note_queues(ARRAY(SELECT coalesce(e.spec ->> 'queue', 'default')
                                          FROM jsonb_array_elements(enqueue_many.jobs) AS e(spec)
                                         WHERE jsonb_typeof(e.spec -> 'rate_key') = 'string'));
    END IF;
    -- The common bulk load (no batch, no dependency, no unique key, no bounded queue) takes the
    -- one-pass path; each of those needs reads or locks the plain insert does not take.
    IF NOT coalesce(enqueue_many.as_batch, false) AND jsonb_typeof(enqueue_many.jobs) = 'array'
       AND NOT jsonb_path_exists(enqueue_many.jobs, 'lax $[*] ? (exists(@.depends_on) || @.unique_key.type() == "string")')
       AND NOT _reaches_bounded_queue(enqueue_many.jobs) THEN
        RETURN QUERY SELECT * FROM _insert_plain_specs(enqueue_many.jobs);
        RETURN;
    END IF;
    PERFORM _check_specs_fast(enqueue_many.jobs, 'jobs');
    IF coalesce(enqueue_many.as_batch, false)
       OR jsonb_path_exists(enqueue_many.jobs, 'lax $[*].depends_on') THEN
        -- Graph or batch: the bookkeeping lives in graph.sql.
        PERFORM set_config('plan_cache_mode', 'auto', true);  -- see the note at the top of this file
        RETURN QUERY SELECT * FROM _enqueue_graph(enqueue_many.jobs, coalesce(enqueue_many.as_batch, false), NULL);
        RETURN;
    END IF;
    -- _insert_specs returns its rows in the specs' order (no sort needed here).
    RETURN QUERY SELECT r.ref, r.id, r.created, r.batch_id FROM _insert_specs(enqueue_many.jobs, NULL, NULL) AS r;
END;
$$;

-- True when a spec of `jobs` lands in a bounded queue (max_length set), whose capacity must be
-- reserved under its lock (_insert_specs does). One probe when no queue is bounded (the usual
-- case), else one scan of the specs per bounded queue.
CREATE OR REPLACE FUNCTION pgjobs._reaches_bounded_queue(jobs jsonb)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM queues AS q
                    WHERE q.max_length IS NOT NULL
                      AND jsonb_path_exists(jobs, 'lax $[*] ? (@.queue == $q || $d == true && !exists(@.queue))',
                                            jsonb_build_object('q', q.queue, 'd', q.queue = 'default')));
END;
$$;

-- Refuses the specs passed to _insert_plain_specs, whose check flagged `spec`: _check_specs words
-- the first problem (PJ002). Should it find none (the flag is meant to be exactly its rules), the
-- error names the flagged spec itself. Raising aborts the statement: nothing was inserted.
CREATE OR REPLACE FUNCTION pgjobs._refuse_spec(jobs jsonb, spec jsonb)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    PERFORM _check_specs(jobs, 'jobs');
    RAISE EXCEPTION USING ERRCODE = 'PJ002',
        MESSAGE = format('jobs: spec %s is not valid', _shown(spec::text));
END;
$$;

-- enqueue_many's one-pass path, for specs without batch, dependencies, unique keys or bounded
-- queues: one statement reads each spec once, checks it in the same pass (a flagged spec aborts
-- the statement through _refuse_spec, so the check costs no pass of its own), takes its id from
-- the sequence, inserts, words the status events and returns the rows in the specs' order.
-- A timestamp string is the one thing the pass cannot check without a cast that would fail with
-- the wrong error: when some spec carries one, a cast-only pass runs first, and _check_specs
-- words its failure. Rules here mirror _check_specs (keep the three in step: see _check_specs_fast).
CREATE OR REPLACE FUNCTION pgjobs._insert_plain_specs(jobs jsonb)
RETURNS TABLE (ref text, id bigint, created boolean, batch_id bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := now();
    v_quiet text[] := ARRAY(SELECT q.queue FROM queues AS q WHERE q.status_events <> 'all');
    v_far   boolean;
BEGIN
    IF jsonb_path_exists(jobs, 'lax $[*].run_at ? (@.type() == "string")') THEN
        BEGIN
            -- (limits: checks.sql) a time must be finite, in years 1 to 9999
            v_far := EXISTS (SELECT 1 FROM jsonb_array_elements(jobs) AS x(e)
                              WHERE jsonb_typeof(x.e -> 'run_at') = 'string'
                                AND NOT ((x.e ->> 'run_at')::timestamptz >= '0001-01-01 00:00:00+00'
                                         AND (x.e ->> 'run_at')::timestamptz < '10000-01-01 00:00:00+00'));
        EXCEPTION WHEN data_exception THEN
            PERFORM _check_specs(jobs, 'jobs');
            RAISE;
        END;
        IF v_far THEN
            PERFORM _check_specs(jobs, 'jobs');
        END IF;
    END IF;

    RETURN QUERY
    WITH spec AS (
        -- Each spec, checked, with its id. `lean`: nothing but kind, queue and payload (most of a
        -- bulk load), so the other columns take their defaults without a lookup each.
        SELECT x.e, x.lean, nextval('pgjobs.jobs_id_seq') AS id
          FROM (SELECT a.e, a.e - '{kind,payload,queue}'::text[] = '{}' AS lean
                  FROM jsonb_array_elements(jobs) AS a(e)
                 -- A spec that is not an object has no kind (-> gives NULL): refused here, before
                 -- `-`, which raises on a scalar, meets it.
                 WHERE CASE WHEN jsonb_typeof(a.e -> 'kind') = 'string' THEN true ELSE _refuse_spec(jobs, a.e) END
                OFFSET 0) AS x   -- `lean` is computed once per spec, not once per use
         -- CASE, not OR: its branches run in order.
         WHERE CASE WHEN x.e ->> 'kind' = ''
                         OR jsonb_typeof(x.e -> 'queue') <> 'string' OR x.e ->> 'queue' = ''
                         OR jsonb_typeof(x.e -> 'payload') <> 'object'
                         -- (limits: checks.sql)
                         OR octet_length(x.e ->> 'kind') > 1000 OR octet_length(x.e ->> 'queue') > 1000
                      THEN _refuse_spec(jobs, x.e)
                    WHEN x.lean THEN true
                    WHEN x.e - '{kind,payload,queue,run_at,priority,max_attempts,unique_key,unique_live_only,group_key,rate_key,meta,ref}'::text[] <> '{}'
                         OR jsonb_typeof(x.e -> 'meta') <> 'object'
                         OR jsonb_typeof(x.e -> 'run_at') NOT IN ('string', 'null')
                         -- a string key took the other path; any other non-null one is wrong
                         OR jsonb_typeof(x.e -> 'unique_key') <> 'null'
                         OR jsonb_typeof(x.e -> 'group_key') NOT IN ('string', 'null')
                         OR octet_length(x.e ->> 'group_key') > 1000
                         OR jsonb_typeof(x.e -> 'rate_key') NOT IN ('string', 'null') OR x.e ->> 'rate_key' = ''
                         OR octet_length(x.e ->> 'rate_key') > 1000
                         OR jsonb_typeof(x.e -> 'unique_live_only') NOT IN ('boolean', 'null')
                         OR jsonb_typeof(x.e -> 'ref') NOT IN ('string', 'number', 'null')
                         OR CASE jsonb_typeof(x.e -> 'priority')
                                 WHEN 'number' THEN (x.e -> 'priority')::numeric NOT BETWEEN -32768 AND 32767
                                                    OR (x.e -> 'priority')::numeric % 1 <> 0
                                 ELSE x.e ? 'priority' END
                         OR CASE jsonb_typeof(x.e -> 'max_attempts')
                                 WHEN 'number' THEN (x.e -> 'max_attempts')::numeric NOT BETWEEN 1 AND 2147483647
                                                    OR (x.e -> 'max_attempts')::numeric % 1 <> 0
                                 ELSE x.e ? 'max_attempts' END
                      THEN _refuse_spec(jobs, x.e)
                    ELSE true END
    ), ins AS (
        INSERT INTO jobs_live AS j (id, kind, queue, payload, meta, state, priority, run_at, max_attempts,
                                    unique_live_only, group_key, rate_key)
        SELECT s.id, s.e ->> 'kind', coalesce(s.e ->> 'queue', 'default'), coalesce(s.e -> 'payload', '{}'),
               CASE WHEN s.lean THEN '{}' ELSE coalesce(s.e -> 'meta', '{}') END,
               CASE WHEN s.lean THEN 'pending'::job_state
                    WHEN (s.e ->> 'run_at')::timestamptz > v_now THEN 'scheduled' ELSE 'pending' END,
               CASE WHEN s.lean THEN 0 ELSE coalesce((s.e ->> 'priority')::numeric::smallint, 0) END,
               CASE WHEN s.lean THEN v_now ELSE coalesce((s.e ->> 'run_at')::timestamptz, v_now) END,
               CASE WHEN s.lean THEN 20 ELSE coalesce((s.e ->> 'max_attempts')::numeric::int, 20) END,
               CASE WHEN s.lean THEN false ELSE coalesce((s.e ->> 'unique_live_only')::boolean, false) END,
               CASE WHEN s.lean THEN NULL ELSE s.e ->> 'group_key' END,
               CASE WHEN s.lean THEN NULL ELSE s.e ->> 'rate_key' END
          FROM spec AS s
        RETURNING j.id, j.kind, j.queue, j.state, j.run_at
    ), sent AS (
        -- The status events: one append to the event log (stream.sql), in the specs' order (ids
        -- were drawn in that order). One sort feeds the four arrays in step (an ORDER BY inside
        -- each array_agg sorted the rows four times: 5 % of the call at 1,000 specs).
        SELECT _append_events(array_agg(o.id), array_agg(o.state), array_agg(o.queue), array_agg(o.kind),
                              array_fill(0, ARRAY[count(*)::int]), array_fill(NULL::bigint, ARRAY[count(*)::int])) AS n
          FROM (SELECT i.id, i.state, i.queue, i.kind FROM ins AS i WHERE i.queue <> ALL (v_quiet) ORDER BY i.id) AS o
    ), woke AS (
        SELECT _wake(array_agg(DISTINCT i.queue)) FROM ins AS i WHERE i.state = 'pending'
    )
    -- The specs' rows, in their order (spec is materialized: read by the insert and here). The
    -- two subqueries make the statement send the notifications (each runs once; neither is NULL).
    SELECT s.e ->> 'ref', s.id, true, NULL::bigint
      FROM spec AS s
     WHERE (SELECT count(*) FROM sent) IS NOT NULL AND (SELECT count(*) FROM woke) IS NOT NULL;
END;
$$;

-- Bulk enqueue as columns: job i is (kinds[i], payloads->(i-1), queues[i]), every other setting at its
-- default (pending now, priority 0, 20 attempts, no key, group, meta or dependency). enqueue_many's
-- contract for those specs: all or nothing, the same checks (PJ002 naming the element), bounded queues'
-- capacity reserved (PJ001), status events per queue, one pgjobs_wake per queue; ids come back in the
-- arrays' order. `payloads` NULL: every payload {}; `queues` NULL: every job in 'default'.
-- Why a second bulk entry: the common bulk load (kind, queue, payload) spent a third of its server time
-- and most of the client's reading a JSON document of specs key by key (the client dumping one dict
-- per job, the server extracting each key and testing its type) and returning four columns a row.
-- The arrays cross as two lists (binary from the client), the JSON is the payloads alone, and one
-- bigint a row comes back.
-- (Measured: PRODUCER COSTS above.)
CREATE OR REPLACE FUNCTION pgjobs.enqueue_arrays(kinds text[], payloads jsonb DEFAULT NULL,
                                                 queues text[] DEFAULT NULL)
RETURNS TABLE (id bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := now();
    v_n      int := coalesce(cardinality(kinds), 0);
    v_queues text[];  -- `queues`, or 'default' for every job
    v_quiet  text[];
    v_queue  text;
    v_adding int;
BEGIN
    -- (limits: checks.sql) arrays one-dimensional, at most 100,000 elements
    IF kinds IS NULL OR array_ndims(kinds) > 1 OR v_n > 100000 THEN
        PERFORM _check_array('kinds', kinds, false);
    END IF;
    IF queues IS NOT NULL AND (array_ndims(queues) > 1 OR cardinality(queues) <> v_n) THEN
        PERFORM _check_array('queues', queues);
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('queues must have one element per kind (%s), got %s', v_n, cardinality(queues));
    END IF;
    IF payloads IS NOT NULL AND (jsonb_typeof(payloads) <> 'array' OR jsonb_array_length(payloads) <> v_n) THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('payloads must be a JSON array with one payload per kind (%s), got %s', v_n,
                             _shown(left(payloads::text, 200)));
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;
    v_queues := coalesce(queues, array_fill('default'::text, ARRAY[v_n]));
    -- A bounded queue counts its live jobs under its lock first (_reserve_capacity); queues in name
    -- order, as _insert_specs takes them, so two callers filling the same two queues cannot deadlock.
    -- One probe when none is bounded.
    IF EXISTS (SELECT 1 FROM queues AS q WHERE q.max_length IS NOT NULL AND q.queue = ANY (v_queues)) THEN
        FOR v_queue, v_adding IN
            SELECT u.queue, count(*)::int FROM unnest(v_queues) AS u(queue) GROUP BY u.queue ORDER BY u.queue
        LOOP
            PERFORM _reserve_capacity(v_queue, v_adding);
        END LOOP;
    END IF;
    v_quiet := ARRAY(SELECT q.queue FROM queues AS q WHERE q.status_events <> 'all');

    RETURN QUERY
    WITH spec AS (
        -- ROWS FROM zips the lists in step (their lengths were checked); a NULL `payloads` yields no
        -- rows, so its column is NULL and takes the default. CASE, not OR: a refused element raises.
        SELECT nextval('pgjobs.jobs_id_seq') AS id, s.kind, s.queue, coalesce(s.payload, '{}') AS payload
          FROM ROWS FROM (unnest(enqueue_arrays.kinds), unnest(v_queues),
                          jsonb_array_elements(enqueue_arrays.payloads)) WITH ORDINALITY AS s(kind, queue, payload, n)
         -- (limits: checks.sql)
         WHERE CASE WHEN s.kind IS NULL OR s.kind = '' OR octet_length(s.kind) > 1000
                         OR s.queue IS NULL OR s.queue = '' OR octet_length(s.queue) > 1000
                         OR jsonb_typeof(s.payload) <> 'object'
                    THEN _refuse_array_job(s.n, s.kind, s.queue, s.payload)
                    ELSE true END
    ), ins AS (
        INSERT INTO jobs_live AS j (id, kind, queue, payload, state, run_at)
        SELECT s.id, s.kind, s.queue, s.payload, 'pending', v_now FROM spec AS s
    ), sent AS (
        -- The status events, read from spec (the rows as inserted, in id order: the ids were drawn in
        -- spec's order), not from the insert's RETURNING rows: the statement runs its INSERT to the end
        -- whether or not it is read, and not returning 1,000 rows saved 5 % of the call (pgbench).
        SELECT _append_events(array_agg(o.id), array_fill('pending'::job_state, ARRAY[count(*)::int]),
                              array_agg(o.queue), array_agg(o.kind), array_fill(0, ARRAY[count(*)::int]),
                              array_fill(NULL::bigint, ARRAY[count(*)::int])) AS n
          FROM (SELECT s.id, s.queue, s.kind FROM spec AS s WHERE s.queue <> ALL (v_quiet)) AS o
    ), woke AS (
        SELECT _wake(array_agg(DISTINCT s.queue)) FROM spec AS s
    )
    -- The ids in the arrays' order (spec is materialized: read by the insert and here); the two
    -- subqueries make the statement send the notifications (each runs once; neither is NULL).
    SELECT s.id FROM spec AS s
     WHERE (SELECT count(*) FROM sent) IS NOT NULL AND (SELECT count(*) FROM woke) IS NOT NULL;
END;
$$;

-- Words enqueue_arrays' refusal of element n (1-based) as _check_specs words a spec's (0-based, as
-- JSON and most clients count).
CREATE OR REPLACE FUNCTION pgjobs._refuse_array_job(n bigint, kind text, queue text, payload jsonb)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    PERFORM _check_name(format('jobs[%s]: kind', n - 1), kind);
    PERFORM _check_name(format('jobs[%s]: queue', n - 1), queue);
    IF jsonb_typeof(payload) = 'null' THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('jobs[%s]: payload must not be null (use {} for none)', n - 1);
    ELSIF jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('jobs[%s]: payload must be a JSON object, got %s', n - 1, _shown(payload::text));
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'PJ002',
        MESSAGE = format('jobs[%s]: job (%s, %s) is not valid', n - 1, _shown(kind), _shown(queue));
END;
$$;

-- _check_specs at a fraction of the cost for the common array of plain, well-formed specs: one
-- pass reads every key of a spec at once (jsonb_to_record; `?` tells an explicit null from an
-- absent key) and tests its JSON type, and only when some spec is not plainly valid does
-- _check_specs run, to find and word the problem. The test flags a superset of what _check_specs
-- refuses (any run_at that is not null, too: only a cast can tell a valid one), so a spec it lets
-- through is one _check_specs accepts. Keep the three in step (this, _check_specs and the check
-- inside _insert_plain_specs): a new rule there needs a flag here and there.
-- tests/test_enqueue_many_paths.py holds the one-pass path to _check_specs' answers.
CREATE OR REPLACE FUNCTION pgjobs._check_specs_fast(jobs jsonb, label text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array'
       OR EXISTS (
            SELECT 1
              FROM jsonb_array_elements(jobs) AS e(spec)
             CROSS JOIN LATERAL jsonb_to_record(CASE WHEN jsonb_typeof(e.spec) = 'object' THEN e.spec ELSE '{}' END)
                   AS r(kind jsonb, queue jsonb, payload jsonb, meta jsonb, priority jsonb, max_attempts jsonb,
                        unique_key jsonb, unique_live_only jsonb, group_key jsonb, rate_key jsonb, ref jsonb)
             WHERE jsonb_typeof(e.spec) <> 'object'
                OR e.spec - '{kind,payload,queue,run_at,priority,max_attempts,unique_key,unique_live_only,group_key,rate_key,meta,ref,depends_on}'::text[] <> '{}'
                OR jsonb_typeof(r.kind) IS DISTINCT FROM 'string' OR r.kind = '""'
                OR (e.spec ? 'queue' AND (jsonb_typeof(r.queue) IS DISTINCT FROM 'string' OR r.queue = '""'))
                -- (limits: checks.sql)
                OR octet_length(r.kind #>> '{}') > 1000 OR octet_length(r.queue #>> '{}') > 1000
                OR octet_length(r.unique_key #>> '{}') > 1000 OR octet_length(r.group_key #>> '{}') > 1000
                OR (e.spec ? 'payload' AND jsonb_typeof(r.payload) IS DISTINCT FROM 'object')
                OR (e.spec ? 'meta' AND jsonb_typeof(r.meta) IS DISTINCT FROM 'object')
                OR (e.spec ? 'priority'
                    AND CASE WHEN jsonb_typeof(r.priority) = 'number'
                             THEN r.priority::numeric NOT BETWEEN -32768 AND 32767 OR r.priority::numeric % 1 <> 0
                             ELSE true END)
                OR (e.spec ? 'max_attempts'
                    AND CASE WHEN jsonb_typeof(r.max_attempts) = 'number'
                             THEN r.max_attempts::numeric NOT BETWEEN 1 AND 2147483647
                                  OR r.max_attempts::numeric % 1 <> 0
                             ELSE true END)
                OR jsonb_typeof(e.spec -> 'run_at') <> 'null'
                OR jsonb_typeof(r.unique_key) <> 'string'
                OR jsonb_typeof(r.group_key) <> 'string'
                OR jsonb_typeof(r.rate_key) <> 'string' OR r.rate_key = '""' OR octet_length(r.rate_key #>> '{}') > 1000
                OR jsonb_typeof(r.unique_live_only) <> 'boolean'
                OR jsonb_typeof(r.ref) NOT IN ('string', 'number')) THEN
        PERFORM _check_specs(jobs, label);
    END IF;
END;
$$;

-- ---------------------------------------------------------------------------------------------
-- Bulk enqueue at COPY speed: the client COPYs specs (binary) into a temporary staging table of
-- its own session and calls enqueue_staged, which validates and inserts them set-based, with
-- enqueue_many's contract (all or nothing, unique keys, dependencies, batches, events). Typed
-- columns spare the per-key JSON extraction and checks of enqueue_many's document.
-- The staging table's shape (the client creates it; these names and types, in this order):
--   n bigint (the spec's position, from 0), kind text, queue text, payload jsonb, meta jsonb,
--   run_at text, priority bigint, max_attempts bigint, unique_key text, unique_live_only boolean,
--   group_key text, ref text, depends_on jsonb
-- run_at is text and the integers bigint so that a bad value reaches the checks here and is
-- refused with PJ002 naming it, as enqueue_many refuses it, rather than failing inside COPY.

-- The staging table, checked: enqueue_staged reads it with its owner's rights (SECURITY DEFINER),
-- so it must be a plain temporary table of the calling session, nothing that could run the caller's
-- code as the owner on read: no view (its functions would run as the reader), no triggers, rules,
-- row security or child tables, and only built-in column types. Returns its qualified name.
CREATE OR REPLACE FUNCTION pgjobs._staging_table(staging regclass)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_rel  record;
    v_cols text[];
BEGIN
    SELECT c.relkind, c.relpersistence, c.relnamespace, c.relhastriggers, c.relhasrules, c.relrowsecurity,
           c.relhassubclass, n.nspname, c.relname
      INTO v_rel
      FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
     WHERE c.oid = staging;
    IF NOT FOUND OR v_rel.relpersistence <> 't' OR v_rel.relnamespace IS DISTINCT FROM pg_my_temp_schema() THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('staging must be a temporary table of this session, got %s', coalesce(staging::text, 'NULL'));
    END IF;
    IF v_rel.relkind <> 'r' OR v_rel.relhastriggers OR v_rel.relhasrules OR v_rel.relrowsecurity OR v_rel.relhassubclass THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('staging table %s must be a plain table (no view, triggers, rules, row security or children)',
                             staging);
    END IF;
    SELECT array_agg(a.attname::text || ' ' || a.atttypid::regtype::text ORDER BY a.attnum)
      INTO v_cols
      FROM pg_attribute AS a
     WHERE a.attrelid = staging AND a.attnum > 0 AND NOT a.attisdropped;
    IF v_cols IS DISTINCT FROM ARRAY['n bigint', 'kind text', 'queue text', 'payload jsonb', 'meta jsonb', 'run_at text',
                                     'priority bigint', 'max_attempts bigint', 'unique_key text',
                                     'unique_live_only boolean', 'group_key text', 'ref text', 'depends_on jsonb'] THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('staging table %s has columns (%s), not enqueue_staged''s', staging,
                             array_to_string(v_cols, ', '));
    END IF;
    RETURN format('%I.%I', v_rel.nspname, v_rel.relname);
END;
$$;

-- The staged specs as enqueue_many's JSON document (in their order; absent values left out), for
-- the specs that take the general path and for wording a refusal with _check_specs.
CREATE OR REPLACE FUNCTION pgjobs._staged_specs(staging regclass)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_jobs jsonb;
BEGIN
    -- Read as _staging_table names it (schema-qualified, quoted): this function takes no text to run.
    EXECUTE format($q$
        SELECT coalesce(jsonb_agg(coalesce(
                   (SELECT jsonb_object_agg(f.k, f.v)
                      FROM (VALUES ('kind', to_jsonb(s.kind)), ('queue', to_jsonb(s.queue)), ('payload', s.payload),
                                   ('meta', s.meta), ('run_at', to_jsonb(s.run_at)), ('priority', to_jsonb(s.priority)),
                                   ('max_attempts', to_jsonb(s.max_attempts)), ('unique_key', to_jsonb(s.unique_key)),
                                   ('unique_live_only', to_jsonb(s.unique_live_only)),
                                   ('group_key', to_jsonb(s.group_key)), ('ref', to_jsonb(s.ref)),
                                   ('depends_on', s.depends_on)) AS f(k, v)
                     WHERE f.v IS NOT NULL), '{}') ORDER BY s.n), '[]')
          FROM ONLY %s AS s$q$, _staging_table(staging)) INTO v_jobs;
    RETURN v_jobs;
END;
$$;

CREATE OR REPLACE FUNCTION pgjobs.enqueue_staged(staging regclass, as_batch boolean DEFAULT false)
RETURNS TABLE (ref text, id bigint, created boolean, batch_id bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_table   text := _staging_table(staging);
    v_general boolean;
    v_bad     boolean;
    v_dated   boolean;
    v_named   boolean;
    v_quiet   text[] := ARRAY(SELECT q.queue FROM queues AS q WHERE q.status_events <> 'all');
    v_refs    text[];
    v_ids     bigint[] := '{}';
    v_wake    text[] := '{}';
    v_group   record;
    v_groups  int := 0;
    v_ev_ids    bigint[] := '{}';
    v_ev_states job_state[] := '{}';
    v_ev_queues text[] := '{}';
    v_ev_kinds  text[] := '{}';
BEGIN
    -- One pass decides the path and checks the plain specs. The general path (enqueue_many on the
    -- specs as JSON) takes a batch, unique keys (their races are decided there, by the unique
    -- index), dependencies, bounded queues (capacity is reserved there, under the queue's lock)
    -- and names long enough that an event would need cutting.
    EXECUTE format($q$
        SELECT coalesce(bool_or(s.unique_key IS NOT NULL OR s.depends_on IS NOT NULL
                                OR octet_length(s.kind) + octet_length(coalesce(s.queue, '')) > 140), false)
                   OR EXISTS (SELECT 1 FROM queues AS q
                               WHERE q.max_length IS NOT NULL
                                 AND q.queue IN (SELECT coalesce(b.queue, 'default') FROM ONLY %1$s AS b)),
               coalesce(bool_or(s.n IS NULL OR s.kind IS NULL OR s.kind = '' OR s.queue = ''
                                OR jsonb_typeof(s.payload) <> 'object' OR jsonb_typeof(s.meta) <> 'object'
                                OR s.priority NOT BETWEEN -32768 AND 32767
                                OR s.max_attempts NOT BETWEEN 1 AND 2147483647), false),
               coalesce(bool_or(s.run_at IS NOT NULL), false),
               coalesce(bool_or(s.ref IS NOT NULL), false)
          FROM ONLY %1$s AS s$q$, v_table)
      INTO v_general, v_bad, v_dated, v_named;
    IF v_general OR coalesce(as_batch, false) THEN
        PERFORM set_config('plan_cache_mode', 'auto', true);  -- see the note at the top of this file
        RETURN QUERY SELECT * FROM enqueue_many(_staged_specs(staging), coalesce(as_batch, false));
        RETURN;
    END IF;
    IF v_bad THEN
        -- _check_specs words the first problem (PJ002 naming the spec and the value).
        PERFORM _check_specs(_staged_specs(staging), 'jobs');
        RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = 'jobs: a staged spec is not valid';
    END IF;
    IF v_dated THEN
        -- A bad timestamp would fail the insert's cast with the wrong error: one cast-only pass
        -- first, and _check_specs words its failure.
        BEGIN
            EXECUTE format('SELECT count(s.run_at::timestamptz) FROM ONLY %s AS s', v_table);
        EXCEPTION WHEN data_exception THEN
            PERFORM _check_specs(_staged_specs(staging), 'jobs');
            RAISE;
        END;
    END IF;

    -- The insert takes the specs in their order, so the ids it draws ascend in that order: sorted,
    -- they pair with the specs without reading anything back (through the parent: see "Inserts").
    -- It returns one row per group of kind, queue and state (a bulk load is mostly one group) with
    -- the group's ids.
    FOR v_group IN EXECUTE format($q$
        WITH ins AS (
            INSERT INTO jobs AS j (kind, queue, payload, meta, state, priority, run_at, max_attempts,
                                   unique_live_only, group_key)
            SELECT s.kind, coalesce(s.queue, 'default'), coalesce(s.payload, '{}'), coalesce(s.meta, '{}'),
                   CASE WHEN s.run_at::timestamptz > now() THEN 'scheduled'::job_state ELSE 'pending' END,
                   coalesce(s.priority, 0), coalesce(s.run_at::timestamptz, now()), coalesce(s.max_attempts, 20),
                   coalesce(s.unique_live_only, false), s.group_key
              FROM ONLY %s AS s
             ORDER BY s.n
            RETURNING j.id, j.kind, j.queue, j.state, j.run_at
        )
        SELECT ins.queue, ins.state, ins.kind, array_agg(ins.id ORDER BY ins.id) AS ids, min(ins.run_at) AS oldest
          FROM ins
         GROUP BY ins.kind, ins.queue, ins.state$q$, v_table)
    LOOP
        v_ids := v_ids || v_group.ids;
        v_groups := v_groups + 1;
        IF v_group.state = 'pending' THEN
            v_wake := v_wake || v_group.queue;
        END IF;
        IF v_group.queue <> ALL (v_quiet) THEN
            -- The group's status events, appended to the event log after the loop (one call).
            v_ev_ids := v_ev_ids || v_group.ids;
            v_ev_states := v_ev_states || array_fill(v_group.state, ARRAY[cardinality(v_group.ids)]);
            v_ev_queues := v_ev_queues || array_fill(v_group.queue, ARRAY[cardinality(v_group.ids)]);
            v_ev_kinds := v_ev_kinds || array_fill(v_group.kind, ARRAY[cardinality(v_group.ids)]);
        END IF;
    END LOOP;
    IF v_groups > 1 THEN
        v_ids := ARRAY(SELECT u.id FROM unnest(v_ids) AS u(id) ORDER BY u.id);
    END IF;
    IF v_named THEN
        EXECUTE format('SELECT array_agg(s.ref ORDER BY s.n) FROM ONLY %s AS s', v_table) INTO v_refs;
    END IF;
    PERFORM _append_events(v_ev_ids, v_ev_states, v_ev_queues, v_ev_kinds,
                           array_fill(0, ARRAY[cardinality(v_ev_ids)]), array_fill(NULL::bigint, ARRAY[cardinality(v_ev_ids)]));
    PERFORM _wake(v_wake);
    RETURN QUERY SELECT u.ref, u.id, true, NULL::bigint FROM unnest(v_refs, v_ids) AS u(ref, id);
END;
$$;
