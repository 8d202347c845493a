-- Job graphs: dependencies between jobs (and on whole batches), and their propagation.
--
-- An edge (child_id, parent_job_id | parent_batch_id, trigger) says "child runs once the parent
-- settles in a way its trigger accepts": `success` (parent succeeded), `failure` (parent
-- failed), `complete` (parent terminal in any way). A parent that ends `cancelled` is neither
-- a success nor a failure. Edges are AND-ed: a child runs when every edge is satisfied, and is
-- cancelled as soon as one edge can no longer be (the cancellation cascades).
--
-- Bookkeeping on the child row: remaining_deps counts edges whose parent has not settled,
-- failed_deps edges that settled unsatisfied. Each edge settles exactly once (satisfied goes
-- from NULL to true/false under the UPDATE that sets it), and the child's counters move under
-- the child's row lock, so parents settling in overlapping transactions release it once.
--
-- The race with a parent settling while an edge to it is being added is closed by the parent's
-- row lock: the enqueuer locks the parent (FOR NO KEY UPDATE) and sets has_dependents; the
-- settler's UPDATE of the parent waits for that lock and then reads has_dependents = true and,
-- in its next statement, the committed edge. Or the settler goes first, and the enqueuer, after
-- waiting, reads the parent as terminal and settles the edge at insert. (A batch member always
-- propagates, flag or not; the flag is left unset on members whose children were created in the
-- same call, where no race is possible: nobody else can see the rows yet.)

-- Whether a parent that ended in state `st` satisfies trigger `t` is written inline wherever it is
-- needed (NULL while the parent is not terminal; batch states use the same names):
--   CASE WHEN st NOT IN ('succeeded', 'failed', 'cancelled') THEN NULL WHEN t = 'complete' THEN true
--        WHEN t = 'success' THEN st = 'succeeded' ELSE st = 'failed' END
-- not as a function: a SQL function that pins search_path (as every pgjobs routine does) is never
-- inlined, and called once per edge it cost as much as the rest of the propagation.

-- enqueue_many's graph/batch path. Validation of the plain spec keys has run (_check_specs).
CREATE OR REPLACE FUNCTION pgjobs._enqueue_graph(jobs jsonb, as_batch boolean, parent bigint)
RETURNS TABLE (ref text, id bigint, created boolean, batch_id bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT g.ref, g.id, g.created, g.batch_id
      FROM _graph_insert(_enqueue_graph.jobs, NULL, coalesce(_enqueue_graph.as_batch, false),
                         _enqueue_graph.parent, 'jobs') AS g
     ORDER BY g.n;
END;
$$;

-- _graph_insert's steps, each its own function (called once per _graph_insert call, never per spec or
-- per edge): 1 _graph_check_deps, 2-3 _graph_dep_arrays, 4-5b _graph_lock_parents, 6 in _graph_insert,
-- 7-8 _graph_link. Errors are raised before anything is written (steps 1-5b write nothing).

-- 1. Shape of each dependency of `jobs` (PJ002, the first bad one by spec and dependency order;
--    `label` names the array in the message).
CREATE OR REPLACE FUNCTION pgjobs._graph_check_deps(jobs jsonb, label text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_bad       record;
BEGIN
    SELECT c.n, c.sref, c.k, c.problem INTO v_bad
      FROM (SELECT s.n, s.spec ->> 'ref' AS sref, d.k,
                   CASE
                     WHEN s.spec ? 'depends_on' AND jsonb_typeof(s.spec -> 'depends_on') NOT IN ('array', 'null')
                       THEN format('depends_on must be a JSON array of {"ref"|"job"|"batch": ..., "on": ...}, got %s',
                                   left((s.spec -> 'depends_on')::text, 200))
                     WHEN d.dep IS NULL THEN NULL
                     WHEN jsonb_typeof(d.dep) <> 'object'
                       THEN format('a dependency must be an object {"ref"|"job"|"batch": ..., "on": ...}, got %s',
                                   left(d.dep::text, 200))
                     WHEN d.dep - '{ref,job,batch,on}'::text[] <> '{}'
                       THEN format('unknown key(s) %s in dependency %s',
                                   (SELECT string_agg(quote_literal(x), ', ')
                                      FROM jsonb_object_keys(d.dep - '{ref,job,batch,on}'::text[]) AS x),
                                   left(d.dep::text, 200))
                     WHEN (d.dep ? 'ref')::int + (d.dep ? 'job')::int + (d.dep ? 'batch')::int <> 1
                       THEN format('a dependency names exactly one of "ref", "job", "batch", got %s', left(d.dep::text, 200))
                     WHEN jsonb_typeof(d.dep -> 'on') NOT IN ('string', 'null')
                          OR d.dep ->> 'on' NOT IN ('success', 'failure', 'complete')
                       THEN format('unknown trigger %s in dependency %s (expected "success", "failure" or "complete")',
                                   d.dep -> 'on', left(d.dep::text, 200))
                     WHEN d.dep ? 'ref' AND jsonb_typeof(d.dep -> 'ref') NOT IN ('string', 'number')
                       THEN format('ref must be a string, got %s', d.dep -> 'ref')
                     WHEN (d.dep ? 'job' AND (jsonb_typeof(d.dep -> 'job') <> 'number'
                                             OR (d.dep ->> 'job')::numeric % 1 <> 0
                                             OR (d.dep ->> 'job')::numeric NOT BETWEEN 1 AND 9223372036854775807))
                       THEN format('job must be a job id (a positive integer), got %s', d.dep -> 'job')
                     WHEN (d.dep ? 'batch' AND (jsonb_typeof(d.dep -> 'batch') <> 'number'
                                               OR (d.dep ->> 'batch')::numeric % 1 <> 0
                                               OR (d.dep ->> 'batch')::numeric NOT BETWEEN 1 AND 9223372036854775807))
                       THEN format('batch must be a batch id (a positive integer), got %s', d.dep -> 'batch')
                   END AS problem
              FROM jsonb_array_elements(jobs) WITH ORDINALITY AS s(spec, n)
              LEFT JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof(s.spec -> 'depends_on') = 'array'
                                                          THEN s.spec -> 'depends_on' END)
                        WITH ORDINALITY AS d(dep, k) ON true
             WHERE s.spec ? 'depends_on') AS c
     WHERE c.problem IS NOT NULL
     ORDER BY c.n, c.k
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('%s[%s]%s: %s%s', label, v_bad.n - 1,
                             CASE WHEN v_bad.sref IS NOT NULL THEN format(' (ref %s)', v_bad.sref) ELSE '' END,
                             CASE WHEN v_bad.k IS NOT NULL THEN format('depends_on[%s]: ', v_bad.k - 1) ELSE '' END,
                             v_bad.problem);
    END IF;
END;
$$;

-- 2-3. The dependencies of `jobs` as parallel arrays (one entry per dependency: the dependent spec's
-- index (1-based), the parent's kind ('ref' | 'job' | 'batch'), its key (ref text or id), the trigger,
-- and for a ref the parent spec's index), with the implicit dependency on `parent` and refs resolved;
-- then the graph errors (PJ005): unknown or ambiguous refs, duplicate edges, cycles among the refs.
CREATE OR REPLACE FUNCTION pgjobs._graph_dep_arrays(jobs jsonb, parent bigint, label text,
                                                    OUT d_child int[], OUT d_kind text[], OUT d_key text[],
                                                    OUT d_trig pgjobs.dep_trigger[], OUT d_pidx int[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_bad       record;
BEGIN
    -- 2. The dependencies as arrays, with the implicit dependency on `parent` and refs resolved.
    WITH deps AS (
        SELECT s.n::int AS child, d.k AS k,
               CASE WHEN d.dep ? 'ref' THEN 'ref' WHEN d.dep ? 'job' THEN 'job' ELSE 'batch' END AS kind,
               CASE WHEN d.dep ? 'ref' THEN d.dep ->> 'ref'
                    WHEN d.dep ? 'job' THEN ((d.dep ->> 'job')::numeric)::bigint::text
                    ELSE ((d.dep ->> 'batch')::numeric)::bigint::text END AS key,
               coalesce(d.dep ->> 'on', 'success')::dep_trigger AS trig
          FROM jsonb_array_elements(jobs) WITH ORDINALITY AS s(spec, n)
         CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof(s.spec -> 'depends_on') = 'array'
                                                      THEN s.spec -> 'depends_on' END) WITH ORDINALITY AS d(dep, k)
        UNION ALL
        -- A continuation depends on the job that added it (already succeeded: settled at insert),
        -- unless its spec names that job itself.
        SELECT s.n::int, 0, 'job', parent::text, 'success'::dep_trigger
          FROM jsonb_array_elements(jobs) WITH ORDINALITY AS s(spec, n)
         WHERE parent IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(CASE WHEN jsonb_typeof(s.spec -> 'depends_on') = 'array'
                                                                   THEN s.spec -> 'depends_on' END) AS d(dep)
                            WHERE d.dep ? 'job' AND (d.dep ->> 'job')::numeric = parent)
    ), refs AS (
        SELECT s.spec ->> 'ref' AS ref, min(s.n)::int AS idx, count(*) AS uses
          FROM jsonb_array_elements(jobs) WITH ORDINALITY AS s(spec, n)
         WHERE s.spec ? 'ref' AND jsonb_typeof(s.spec -> 'ref') <> 'null'
         GROUP BY 1
    )
    SELECT array_agg(d.child ORDER BY d.child, d.k), array_agg(d.kind ORDER BY d.child, d.k),
           array_agg(d.key ORDER BY d.child, d.k), array_agg(d.trig ORDER BY d.child, d.k),
           array_agg(CASE WHEN r.uses = 1 THEN r.idx END ORDER BY d.child, d.k)
      INTO d_child, d_kind, d_key, d_trig, d_pidx
      FROM deps AS d
      LEFT JOIN refs AS r ON d.kind = 'ref' AND r.ref = d.key;

    -- 3. Graph errors (PJ005), first one by spec order: unknown or ambiguous refs, duplicate edges.
    SELECT c.child, c.problem INTO v_bad
      FROM (SELECT d.child, d.ord,
                   CASE WHEN d.kind = 'ref' AND d.pidx IS NULL
                             AND EXISTS (SELECT 1 FROM jsonb_array_elements(jobs) AS s(spec) WHERE s.spec ->> 'ref' = d.key)
                          THEN format('depends on ref %L, which names more than one job of this call', d.key)
                        WHEN d.kind = 'ref' AND d.pidx IS NULL
                          THEN format('depends on unknown ref %L', d.key)
                        WHEN count(*) OVER (PARTITION BY d.child, d.kind, coalesce(d.pidx::text, d.key)) > 1
                          THEN format('depends on %s %s more than once', d.kind,
                                      CASE WHEN d.kind = 'ref' THEN quote_literal(d.key) ELSE d.key END)
                   END AS problem
              FROM unnest(d_child, d_kind, d_key, d_pidx) WITH ORDINALITY AS d(child, kind, key, pidx, ord)) AS c
     WHERE c.problem IS NOT NULL
     ORDER BY c.child, c.ord
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ005',
            MESSAGE = format('%s[%s]%s %s', label, v_bad.child - 1,
                             coalesce(format(' (ref %s)', jobs -> (v_bad.child - 1) ->> 'ref'), ''), v_bad.problem);
    END IF;
    PERFORM _check_acyclic(jobs, d_child, d_pidx, label);
END;
$$;

-- 4-5b. The existing parents, locked (FOR NO KEY UPDATE, in id order): the race with a parent settling
-- while an edge to it is added is closed by this lock (see the header). Jobs with the siblings their
-- continuations are held for (held siblings become extra `complete` dependencies: d_* grow), then
-- batches; PJ005 for a parent that does not exist, and for a job joining `batch` (add_to_batch) while
-- waiting for that batch, directly or through live ancestors (a dependency cycle).
CREATE OR REPLACE FUNCTION pgjobs._graph_lock_parents(jobs jsonb, batch bigint, label text,
                                                      INOUT d_child int[], INOUT d_kind text[], INOUT d_key text[],
                                                      INOUT d_trig pgjobs.dep_trigger[], INOUT d_pidx int[],
                                                      OUT x_ids bigint[], OUT x_states text[],
                                                      OUT xb_ids bigint[], OUT xb_states text[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_bad       record;
    v_pids      bigint[];
BEGIN
    -- 4. Existing parent jobs, with the siblings their continuations are held for
    --    (add_to_batch(..., before_continuations)), locked in id order: see the header.
    -- A parent may be ending (a worker completing it). A row that moves to history while we wait
    -- on its lock fails the statement with 40001 in READ COMMITTED (history.sql): again, in a new snapshot that sees it moved.
    -- After one lost race the locks are taken row by row (_lock_jobs_in_turn, races.sql): with workers completing
    -- the parents all the time, the whole statement again could lose on every try.
    FOR i IN 1..20 LOOP
        BEGIN
            WITH ext AS (
                SELECT DISTINCT d.key::bigint AS pid FROM unnest(d_kind, d_key) AS d(kind, key) WHERE d.kind = 'job'
            ), held AS (
                SELECT DISTINCT h.sibling_id AS pid FROM continuation_holds AS h JOIN ext ON h.job_id = ext.pid
            )
            SELECT array_agg(ext.pid) || coalesce((SELECT array_agg(held.pid) FROM held), '{}') INTO v_pids FROM ext;
            IF i = 1 THEN
                SELECT array_agg(l.id ORDER BY l.id), array_agg(l.state::text ORDER BY l.id) INTO x_ids, x_states
                  FROM (SELECT j.id, j.state FROM jobs AS j
                         WHERE j.id = ANY (v_pids)
                         ORDER BY j.id
                           FOR NO KEY UPDATE) AS l;
            ELSE
                SELECT array_agg(l.id ORDER BY l.id), array_agg(l.state::text ORDER BY l.id) INTO x_ids, x_states
                  FROM _lock_jobs_in_turn(v_pids) AS l;
            END IF;
            EXIT;
        EXCEPTION WHEN serialization_failure THEN
            PERFORM _lost_race(i, SQLERRM);  -- (sql/history.sql, ROW MOVEMENT)
        END;
    END LOOP;
    SELECT d.child, d.key INTO v_bad
      FROM unnest(d_child, d_kind, d_key) AS d(child, kind, key)
     WHERE d.kind = 'job' AND NOT (d.key::bigint = ANY (coalesce(x_ids, '{}')))
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ005',
            MESSAGE = format('%s[%s]%s depends on job %s, which does not exist', label, v_bad.child - 1,
                             coalesce(format(' (ref %s)', jobs -> (v_bad.child - 1) ->> 'ref'), ''), v_bad.key);
    END IF;
    -- Held siblings become extra `complete` dependencies of whoever depends on their holder.
    IF EXISTS (SELECT 1 FROM continuation_holds AS h WHERE h.job_id = ANY (x_ids)) THEN
        WITH extra AS (
            SELECT DISTINCT d.child, h.sibling_id::text AS key
              FROM unnest(d_child, d_kind, d_key) AS d(child, kind, key)
              JOIN continuation_holds AS h ON d.kind = 'job' AND h.job_id = d.key::bigint
             WHERE NOT EXISTS (SELECT 1 FROM unnest(d_child, d_kind, d_key) AS o(child, kind, key)
                                WHERE o.child = d.child AND o.kind = 'job' AND o.key = h.sibling_id::text)
        )
        -- (An aggregate without HAVING: SELECT INTO that finds no row sets its targets to NULL, which
        -- dropped every dependency of the call when no extra one was needed.)
        SELECT d_child || coalesce(array_agg(e.child), '{}'), d_kind || coalesce(array_agg('job'::text), '{}'),
               d_key || coalesce(array_agg(e.key), '{}'),
               d_trig || coalesce(array_agg('complete'::dep_trigger), '{}'),
               d_pidx || coalesce(array_agg(NULL::int), '{}')
          INTO d_child, d_kind, d_key, d_trig, d_pidx
          FROM extra AS e;
    END IF;

    -- 5. Existing parent batches, locked likewise.
    SELECT array_agg(l.id ORDER BY l.id), array_agg(l.state::text ORDER BY l.id) INTO xb_ids, xb_states
      FROM (SELECT b.id, b.state FROM batches AS b
             WHERE b.id IN (SELECT d.key::bigint FROM unnest(d_kind, d_key) AS d(kind, key) WHERE d.kind = 'batch')
             ORDER BY b.id
               FOR NO KEY UPDATE) AS l;
    SELECT d.child, d.key INTO v_bad
      FROM unnest(d_child, d_kind, d_key) AS d(child, kind, key)
     WHERE d.kind = 'batch' AND NOT (d.key::bigint = ANY (coalesce(xb_ids, '{}')))
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ005',
            MESSAGE = format('%s[%s]%s depends on batch %s, which does not exist', label, v_bad.child - 1,
                             coalesce(format(' (ref %s)', jobs -> (v_bad.child - 1) ->> 'ref'), ''), v_bad.key);
    END IF;

    -- 5b. Joining an existing batch (add_to_batch): the batch settles only after the new job, so
    --     the new job must not wait on that batch, directly or through live ancestors (a job, or
    --     the members of a batch, that it waits for). Nothing existing can wait on a new batch.
    IF batch IS NOT NULL AND d_kind IS NOT NULL THEN
        WITH RECURSIVE anc(id) AS (
            SELECT x.id FROM unnest(x_ids, x_states) AS x(id, st)
             WHERE x.st NOT IN ('succeeded', 'failed', 'cancelled')
            UNION
            SELECT n.id
              FROM anc
             CROSS JOIN LATERAL (
                   SELECT e.parent_job_id AS id FROM edges AS e
                    WHERE e.child_id = anc.id AND e.satisfied IS NULL AND e.parent_job_id IS NOT NULL
                   UNION ALL
                   SELECT m.id FROM edges AS e
                     JOIN jobs AS m ON m.batch_id = e.parent_batch_id
                    WHERE e.child_id = anc.id AND e.satisfied IS NULL AND e.parent_batch_id IS NOT NULL
                      AND m.state NOT IN ('succeeded', 'failed', 'cancelled')) AS n
        )
        SELECT d.child, d.key INTO v_bad
          FROM unnest(d_child, d_kind, d_key) AS d(child, kind, key)
         WHERE (d.kind = 'batch' AND d.key::bigint = batch)
            OR EXISTS (SELECT 1 FROM anc JOIN edges AS e ON e.child_id = anc.id
                        WHERE e.parent_batch_id = batch AND e.satisfied IS NULL)
         LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'PJ005',
                MESSAGE = format('%s[%s] would join batch %s while waiting for that batch to settle (a dependency cycle)',
                                 label, v_bad.child - 1, batch);
        END IF;
    END IF;
END;
$$;

-- 7-8. The edges of the created jobs (r_id/r_created: what step 6 inserted or found, by spec), settled
-- at insert when the parent has already settled; parents get has_dependents, children their counters,
-- in one UPDATE. A ref whose spec found an existing job by unique key points at that job: it is locked
-- first, as the existing parents were (the same race). Status events, wake-ups, and the propagation of
-- the children cancelled at insert (a parent had already settled the wrong way) follow.
CREATE OR REPLACE FUNCTION pgjobs._graph_link(r_id bigint[], r_created boolean[], d_child int[], d_kind text[],
                                              d_key text[], d_trig pgjobs.dep_trigger[], d_pidx int[],
                                              x_ids bigint[], x_states text[], xb_ids bigint[], xb_states text[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_cancelled bigint[];
    v_events    jsonb;
    v_wake      text[];
BEGIN
    -- 7. A ref whose spec found an existing job by unique key points at that job: lock it too.
    IF NOT (true = ALL (r_created)) THEN
        -- A holder may be ending (a worker completing it). A row that moves to history while we
        -- wait on its lock fails the statement with 40001 in READ COMMITTED (history.sql): again, in a new snapshot that sees it moved.
        FOR i IN 1..20 LOOP
            BEGIN
                WITH holders AS (
                    SELECT j.id, j.state FROM jobs AS j
                     WHERE j.id IN (SELECT r_id[d.pidx] FROM unnest(d_kind, d_pidx) AS d(kind, pidx)
                                     WHERE d.kind = 'ref' AND NOT r_created[d.pidx])
                       AND NOT (j.id = ANY (coalesce(x_ids, '{}')))
                     ORDER BY j.id
                       FOR NO KEY UPDATE)
                -- (No HAVING: a SELECT INTO that finds no row sets x_ids to NULL, and the edges of step 8 would
                -- then read every existing parent as unknown: a `complete` edge on a live parent satisfied at
                -- once, an edge on a finished parent left unsettled forever.)
                SELECT coalesce(x_ids, '{}') || coalesce(array_agg(h.id), '{}'),
                       coalesce(x_states, '{}') || coalesce(array_agg(h.state::text), '{}')
                  INTO x_ids, x_states
                  FROM holders AS h;
                EXIT;
            EXCEPTION WHEN serialization_failure THEN
                PERFORM _lost_race(i, SQLERRM);  -- (sql/history.sql, ROW MOVEMENT)
            END;
        END LOOP;
    END IF;

    -- 8. Edges of the created jobs, settled at insert when the parent has already settled.
    WITH e AS (
        INSERT INTO edges AS e (child_id, parent_job_id, parent_batch_id, trigger, satisfied)
        SELECT q.child_id, q.pj, q.pb, q.trig,
               CASE WHEN q.fresh THEN NULL
                    WHEN coalesce(xj.st, xb.st) NOT IN ('succeeded', 'failed', 'cancelled') THEN NULL
                    WHEN q.trig = 'complete' THEN true
                    WHEN q.trig = 'success' THEN coalesce(xj.st, xb.st) = 'succeeded'
                    ELSE coalesce(xj.st, xb.st) = 'failed' END
          FROM (SELECT r_id[d.child] AS child_id, d.trig,
                       CASE d.kind WHEN 'ref' THEN r_id[d.pidx] WHEN 'job' THEN d.key::bigint END AS pj,
                       CASE WHEN d.kind = 'batch' THEN d.key::bigint END AS pb,
                       -- a parent created by this call: live, settled later by _propagate
                       d.kind = 'ref' AND r_created[d.pidx] AS fresh
                  FROM unnest(d_child, d_kind, d_key, d_trig, d_pidx) AS d(child, kind, key, trig, pidx)
                 WHERE r_created[d.child]) AS q
          LEFT JOIN unnest(x_ids, x_states) AS xj(id, st) ON xj.id = q.pj AND NOT q.fresh
          LEFT JOIN unnest(xb_ids, xb_states) AS xb(id, st) ON xb.id = q.pb
        -- Two dependencies can only land on one parent through a ref resolved by unique key.
        ON CONFLICT DO NOTHING
        RETURNING e.child_id, e.parent_job_id, e.satisfied
    ), counts AS (
        SELECT e.child_id, count(*) FILTER (WHERE e.satisfied IS NULL)::int AS rem,
               count(*) FILTER (WHERE NOT e.satisfied)::int AS fail
          FROM e GROUP BY e.child_id
    ), targets AS (
        SELECT coalesce(c.child_id, p.pid) AS id, c.rem, c.fail, p.pid IS NOT NULL AS is_parent
          FROM counts AS c
          -- (A parent created by this call was inserted with has_dependents set: the UPDATE below
          -- passes it by, unless it is a child too. Rewriting 10,000 new rows of a fan-in left dead
          -- versions that slowed the claims and completions of the whole batch by a third.)
          FULL JOIN (SELECT DISTINCT e.parent_job_id AS pid FROM e WHERE e.parent_job_id IS NOT NULL) AS p
            ON p.pid = c.child_id
    ), u AS (
        -- One UPDATE for both roles (a job can be a parent and a child of this call; two UPDATEs
        -- of one row in one statement would drop one). Parents get has_dependents; specs
        -- inserted as waiting get their counters (the others had every dependency satisfied
        -- already and were inserted runnable).
        UPDATE jobs AS j
           SET has_dependents = j.has_dependents OR t.is_parent,
               remaining_deps = CASE WHEN t.rem IS NOT NULL AND j.state = 'waiting' THEN t.rem ELSE j.remaining_deps END,
               failed_deps = CASE WHEN t.rem IS NOT NULL AND j.state = 'waiting' THEN t.fail ELSE j.failed_deps END,
               state = CASE WHEN t.rem IS NULL OR j.state <> 'waiting' THEN j.state
                            WHEN t.fail > 0 THEN 'cancelled'::job_state
                            WHEN t.rem > 0 THEN 'waiting'
                            WHEN j.run_at > now() THEN 'scheduled'
                            ELSE 'pending' END,
               completed_at = CASE WHEN t.rem IS NOT NULL AND j.state = 'waiting' AND t.fail > 0 THEN now()
                                   ELSE j.completed_at END
          FROM targets AS t
         WHERE j.id = t.id
           AND ((t.is_parent AND NOT j.has_dependents) OR (t.rem IS NOT NULL AND j.state = 'waiting'))
        RETURNING j.id, j.state, j.queue, j.kind, j.attempt, j.batch_id, t.rem IS NOT NULL AS is_child
    )
    SELECT jsonb_agg(jsonb_build_object('id', u.id, 'state', u.state, 'queue', u.queue, 'kind', u.kind,
                                        'attempt', u.attempt, 'batch_id', u.batch_id))
               FILTER (WHERE u.is_child AND u.state <> 'waiting'),
           array_agg(DISTINCT u.queue) FILTER (WHERE u.is_child AND u.state = 'pending'),
           array_agg(u.id) FILTER (WHERE u.is_child AND u.state = 'cancelled')
      INTO v_events, v_wake, v_cancelled
      FROM u;
    UPDATE batches AS b SET has_dependents = true WHERE b.id = ANY (xb_ids) AND NOT b.has_dependents;
    PERFORM _wake(v_wake);
    PERFORM _notify_status(v_events);
    -- Cancelled at insert (a parent had already settled the wrong way): settle what waits on them.
    IF v_cancelled IS NOT NULL THEN
        PERFORM _propagate(v_cancelled);
    END IF;
END;
$$;

-- Inserts a set of job specs with their dependencies, all or nothing:
--   batch      an existing batch the new jobs join (add_to_batch), or NULL;
--   new_batch  make the created jobs one new batch (enqueue_many(as_batch => true));
--   parent     every spec also depends on this job with `success` (complete(..., continuations));
--   label      names the array in error messages.
-- Errors (PJ002 malformed dependency, PJ005 unknown ref / missing parent / duplicate edge / cycle)
-- are raised before anything is written.
CREATE OR REPLACE FUNCTION pgjobs._graph_insert(jobs jsonb, batch bigint, new_batch boolean, parent bigint,
                                                label text)
RETURNS TABLE (n bigint, ref text, id bigint, created boolean, batch_id bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_count     int := jsonb_array_length(jobs);
    v_batch     bigint := batch;
    d_child     int[];
    d_kind      text[];
    d_key       text[];
    d_trig      dep_trigger[];
    d_pidx      int[];
    -- Existing parents, locked: jobs and batches with their states.
    x_ids       bigint[];
    x_states    text[];
    xb_ids      bigint[];
    xb_states   text[];
    v_waiting   boolean[];
    v_parent    boolean[];
    v_ids       bigint[];
    r_id        bigint[];
    r_created   boolean[];
    r_ref       text[];
    v_created   int;
BEGIN
    IF v_count = 0 THEN
        RETURN;
    END IF;

    PERFORM _graph_check_deps(jobs, label);
    SELECT * INTO d_child, d_kind, d_key, d_trig, d_pidx FROM _graph_dep_arrays(jobs, parent, label);
    SELECT * INTO d_child, d_kind, d_key, d_trig, d_pidx, x_ids, x_states, xb_ids, xb_states
      FROM _graph_lock_parents(jobs, batch, label, d_child, d_kind, d_key, d_trig, d_pidx);

    -- 6. Insert. A spec waits when some dependency is not already satisfied by an existing parent.
    SELECT array_agg(coalesce(w.wait, false) ORDER BY g.i) INTO v_waiting
      FROM generate_series(1, v_count) AS g(i)
      LEFT JOIN (SELECT d.child,
                        bool_or(CASE WHEN p.st IS NULL OR p.st NOT IN ('succeeded', 'failed', 'cancelled') THEN true
                                     WHEN d.trig = 'complete' THEN false
                                     WHEN d.trig = 'success' THEN p.st <> 'succeeded'
                                     ELSE p.st <> 'failed' END) AS wait
                   FROM unnest(d_child, d_kind, d_key, d_trig) AS d(child, kind, key, trig)
                   LEFT JOIN (SELECT 'job'::text AS kind, x.id, x.st FROM unnest(x_ids, x_states) AS x(id, st)
                              UNION ALL
                              SELECT 'batch', x.id, x.st FROM unnest(xb_ids, xb_states) AS x(id, st)) AS p
                     ON p.kind = d.kind AND p.id::text = d.key
                  GROUP BY d.child) AS w ON w.child = g.i;
    IF new_batch THEN
        INSERT INTO batches DEFAULT VALUES RETURNING batches.id INTO v_batch;
    END IF;
    -- Specs that other specs of this call depend on are inserted with has_dependents set.
    SELECT array_agg(p.pidx IS NOT NULL ORDER BY g.i) INTO v_parent
      FROM generate_series(1, v_count) AS g(i)
      LEFT JOIN (SELECT DISTINCT d.pidx FROM unnest(d_kind, d_pidx) AS d(kind, pidx) WHERE d.kind = 'ref') AS p
        ON p.pidx = g.i;
    v_ids := ARRAY(SELECT nextval('pgjobs.jobs_id_seq') FROM generate_series(1, v_count));
    SELECT array_agg(r.id ORDER BY r.n), array_agg(r.created ORDER BY r.n), array_agg(r.ref ORDER BY r.n)
      INTO r_id, r_created, r_ref
      FROM _insert_specs(jobs, v_batch, v_ids, v_waiting, v_parent) AS r;
    SELECT count(*) FILTER (WHERE c) INTO v_created FROM unnest(r_created) AS c;
    IF v_batch IS NOT NULL AND v_created > 0 THEN
        UPDATE batches AS b SET total = b.total + v_created, pending = b.pending + v_created
         WHERE b.id = v_batch;
    END IF;

    PERFORM _graph_link(r_id, r_created, d_child, d_kind, d_key, d_trig, d_pidx, x_ids, x_states, xb_ids, xb_states);

    IF new_batch AND v_created = 0 THEN
        -- Every spec found an existing job by unique key: nothing joined the new batch.
        DELETE FROM batches AS b WHERE b.id = v_batch;
    END IF;
    -- unnest, not r_ref[i]: subscripting an array of variable-width elements walks it from the start.
    RETURN QUERY
    SELECT r.n, r.ref, r.id, r.created,
           CASE WHEN r.created THEN v_batch ELSE (SELECT j.batch_id FROM jobs AS j WHERE j.id = r.id) END
      FROM unnest(r_ref, r_id, r_created) WITH ORDINALITY AS r(ref, id, created, n)
     ORDER BY r.n;
END;
$$;

-- PJ005 when the refs of one call form a cycle; the message spells the cycle out. Specs whose
-- refs all point backwards (what any builder produces) are acyclic without a search.
CREATE OR REPLACE FUNCTION pgjobs._check_acyclic(jobs jsonb, d_child int[], d_pidx int[], label text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_count  int := jsonb_array_length(jobs);
    v_adj    int[];   -- ref edges parent -> child, grouped by parent: p's children are
    v_start  int[];   -- v_adj[v_start[p] .. v_start[p + 1] - 1]
    v_radj   int[];   -- the same edges grouped by child (its parents)
    v_rstart int[];
    v_indeg  int[];
    v_queue  int[];
    v_head   int := 1;
    v_tail   int := 0;
    v_node   int;
    v_next   int;
    v_path   text[];
BEGIN
    IF d_child IS NULL OR NOT EXISTS (SELECT 1 FROM unnest(d_child, d_pidx) AS d(c, p) WHERE d.p >= d.c) THEN
        RETURN;
    END IF;
    -- Kahn's algorithm: peel jobs whose parents are all peeled; whatever remains holds a cycle.
    -- Arrays, not a loop of queries: O(jobs + edges).
    SELECT array_agg(d.c ORDER BY d.p, d.c), array_agg(d.p ORDER BY d.c, d.p) INTO v_adj, v_radj
      FROM unnest(d_child, d_pidx) AS d(c, p) WHERE d.p IS NOT NULL;
    SELECT array_agg(s.fwd ORDER BY s.i), array_agg(s.rev ORDER BY s.i), array_agg(s.indeg ORDER BY s.i) FILTER (WHERE s.i <= v_count)
      INTO v_start, v_rstart, v_indeg
      FROM (SELECT g.i,
                   1 + coalesce(sum(coalesce(o.outs, 0)) OVER (ORDER BY g.i ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)::int AS fwd,
                   1 + coalesce(sum(coalesce(q.ins, 0)) OVER (ORDER BY g.i ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)::int AS rev,
                   coalesce(q.ins, 0)::int AS indeg
              FROM generate_series(1, v_count + 1) AS g(i)
              LEFT JOIN (SELECT d.p, count(*) AS outs FROM unnest(d_child, d_pidx) AS d(c, p)
                          WHERE d.p IS NOT NULL GROUP BY d.p) AS o ON o.p = g.i
              LEFT JOIN (SELECT d.c, count(*) AS ins FROM unnest(d_child, d_pidx) AS d(c, p)
                          WHERE d.p IS NOT NULL GROUP BY d.c) AS q ON q.c = g.i) AS s;
    v_queue := array_fill(0, ARRAY[v_count]);
    FOR i IN 1..v_count LOOP
        IF v_indeg[i] = 0 THEN
            v_tail := v_tail + 1;
            v_queue[v_tail] := i;
        END IF;
    END LOOP;
    WHILE v_head <= v_tail LOOP
        v_node := v_queue[v_head];
        v_head := v_head + 1;
        FOR e IN v_start[v_node] .. v_start[v_node + 1] - 1 LOOP
            v_next := v_adj[e];
            v_indeg[v_next] := v_indeg[v_next] - 1;
            IF v_indeg[v_next] = 0 THEN
                v_tail := v_tail + 1;
                v_queue[v_tail] := v_next;
            END IF;
        END LOOP;
    END LOOP;
    IF v_tail = v_count THEN
        RETURN;
    END IF;

    -- Every job left has a parent left, so walking up parents enters the cycle within v_count steps.
    v_node := array_position(ARRAY(SELECT x > 0 FROM unnest(v_indeg) AS x), true);
    FOR step IN 1..v_count LOOP
        v_node := _cycle_parent(v_node, v_radj, v_rstart, v_indeg);
    END LOOP;
    v_next := v_node;
    v_path := ARRAY[quote_literal(jobs -> (v_node - 1) ->> 'ref')];
    LOOP
        v_next := _cycle_parent(v_next, v_radj, v_rstart, v_indeg);
        v_path := v_path || quote_literal(jobs -> (v_next - 1) ->> 'ref');
        EXIT WHEN v_next = v_node;
    END LOOP;
    RAISE EXCEPTION USING ERRCODE = 'PJ005',
        MESSAGE = format('%s[%s] (ref %s) is in a dependency cycle: %s (each depends on the next)', label, v_node - 1,
                         jobs -> (v_node - 1) ->> 'ref', array_to_string(v_path, ' -> '));
END;
$$;

-- A parent of `node` that Kahn's peel left behind (helper of _check_acyclic).
CREATE OR REPLACE FUNCTION pgjobs._cycle_parent(node int, radj int[], rstart int[], indeg int[])
RETURNS int
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    FOR e IN rstart[node] .. rstart[node + 1] - 1 LOOP
        IF indeg[radj[e]] > 0 THEN
            RETURN radj[e];
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;

-- Called in the transaction that made `ids` terminal (only for jobs in a batch or with
-- dependents): updates batch counters, settles the edges of every job and batch that settled,
-- releases or cancels the children, and repeats for the children it cancelled (the cascade).
-- Set-based per round: one UPDATE of batches, one of edges, one of children, however many
-- jobs settled. Rows are locked in id order (batches, then children) so concurrent settlers
-- queue on each other instead of deadlocking.
-- Generic plans (planning these statements anew on every call cost as much as running them),
-- and enable_seqscan = off: every statement here starts from arrays of ids and must probe indexes.
-- A freshly filled edges table has no statistics yet (autovacuum analyzes it later), and the
-- planner's default guess (0.5 % of rows per parent id) then prefers a scan of every edge per
-- call, which made settling a 10,000-job fan-in 3x slower than it should be.
CREATE OR REPLACE FUNCTION pgjobs._propagate(ids bigint[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_jobs    bigint[] := ids;
    v_parents bigint[];
    v_pstates job_state[];
    b_ids     bigint[];
    b_n       int[];
    b_s       int[];
    b_f       int[];
    b_c       int[];
    v_settled bigint[];
    c_ids     bigint[];
    c_n       int[];
    c_k       int[];
    v_ev      jsonb;
    v_wk      text[];
    v_events  jsonb := '[]';
    v_wake    text[] := '{}';
BEGIN
    WHILE v_jobs IS NOT NULL AND cardinality(v_jobs) > 0 LOOP
        -- What settled: per batch, how many members ended each way; and which jobs have dependents.
        WITH t AS MATERIALIZED (
            SELECT j.id, j.batch_id, j.state, j.has_dependents FROM jobs AS j
             WHERE j.id = ANY (v_jobs) AND j.state IN ('succeeded', 'failed', 'cancelled')
        ), g AS (
            SELECT t.batch_id, count(*)::int AS n,
                   count(*) FILTER (WHERE t.state = 'succeeded')::int AS s,
                   count(*) FILTER (WHERE t.state = 'failed')::int AS f,
                   count(*) FILTER (WHERE t.state = 'cancelled')::int AS c
              FROM t WHERE t.batch_id IS NOT NULL GROUP BY t.batch_id
        )
        -- Parents to settle edges for: the jobs flagged has_dependents (set on every job that
        -- ever got a job-level dependent: at its insert, or under its row lock when a later call
        -- added one). A batch member without it has no edge to settle: batch-level edges are
        -- settled with the batch below.
        SELECT (SELECT array_agg(t.id) FROM t WHERE t.has_dependents),
               (SELECT array_agg(t.state) FROM t WHERE t.has_dependents),
               array_agg(g.batch_id ORDER BY g.batch_id), array_agg(g.n ORDER BY g.batch_id),
               array_agg(g.s ORDER BY g.batch_id), array_agg(g.f ORDER BY g.batch_id),
               array_agg(g.c ORDER BY g.batch_id)
          INTO v_parents, v_pstates, b_ids, b_n, b_s, b_f, b_c
          FROM g;

        -- Batch counters: one UPDATE for all members settled in this call. The last member to
        -- settle (pending reaching 0 under the batch's row lock) settles the batch.
        v_settled := NULL;
        IF b_ids IS NOT NULL THEN
            IF cardinality(b_ids) > 1 THEN
                PERFORM 1 FROM (SELECT b.id FROM batches AS b WHERE b.id = ANY (b_ids) ORDER BY b.id
                                   FOR NO KEY UPDATE) AS l;
            END IF;
            WITH u AS (
                UPDATE batches AS b
                   SET pending = b.pending - t.n,
                       succeeded = b.succeeded + t.s,
                       failed = b.failed + t.f,
                       cancelled = b.cancelled + t.c,
                       state = CASE WHEN b.pending - t.n > 0 THEN 'executing'::batch_state
                                    WHEN b.failed + t.f > 0 THEN 'failed'
                                    WHEN b.cancelled + t.c > 0 THEN 'cancelled'
                                    ELSE 'succeeded' END,
                       completed_at = CASE WHEN b.pending - t.n > 0 THEN NULL ELSE now() END
                  FROM unnest(b_ids, b_n, b_s, b_f, b_c) AS t(id, n, s, f, c)
                 WHERE b.id = t.id
                RETURNING b.id, b.pending, b.has_dependents
            )
            SELECT array_agg(u.id) FILTER (WHERE u.pending <= 0 AND u.has_dependents) INTO v_settled FROM u;
        END IF;

        -- Settle the edges of what settled: each edge once (satisfied IS NULL -> true/false).
        c_ids := NULL;
        IF v_parents IS NOT NULL OR v_settled IS NOT NULL THEN
            -- Both sides filtered by the id arrays (= ANY on edges too), so the plan probes the
            -- parent indexes instead of hashing a scan of all edges. The parents' states are the
            -- ones read above (each parent's row was locked by its settling statement).
            WITH ej AS (
                UPDATE edges AS e
                   SET satisfied = CASE WHEN e.trigger = 'complete' THEN true
                                        WHEN e.trigger = 'success' THEN p.state = 'succeeded'
                                        ELSE p.state = 'failed' END
                  FROM unnest(v_parents, v_pstates) AS p(id, state)
                 WHERE e.parent_job_id = ANY (v_parents)
                   AND e.parent_job_id = p.id AND e.satisfied IS NULL
                RETURNING e.child_id, e.satisfied
            ), eb AS (
                UPDATE edges AS e
                   SET satisfied = CASE WHEN e.trigger = 'complete' THEN true
                                        WHEN e.trigger = 'success' THEN b.state = 'succeeded'
                                        ELSE b.state = 'failed' END
                  FROM batches AS b
                 WHERE e.parent_batch_id = ANY (v_settled) AND b.id = ANY (v_settled)
                   AND e.parent_batch_id = b.id AND e.satisfied IS NULL
                RETURNING e.child_id, e.satisfied
            ), s AS (
                SELECT ej.child_id, ej.satisfied FROM ej UNION ALL SELECT eb.child_id, eb.satisfied FROM eb
            )
            SELECT array_agg(x.child_id ORDER BY x.child_id), array_agg(x.n ORDER BY x.child_id),
                   array_agg(x.k ORDER BY x.child_id)
              INTO c_ids, c_n, c_k
              FROM (SELECT s.child_id, count(*)::int AS n, count(*) FILTER (WHERE NOT s.satisfied)::int AS k
                      FROM s GROUP BY s.child_id) AS x;
        END IF;

        -- Children: decrement under the child's row lock (the UPDATE re-reads the newest row
        -- version when it had to wait), so N parents settling in overlapping transactions
        -- release a child exactly once. An unsatisfiable edge cancels the child at once.
        v_jobs := NULL;
        IF c_ids IS NOT NULL THEN
            -- A waiting child may be being cancelled (cancel, cancel_batch). A row that moves to history
            -- while we wait on its lock fails the statement with 40001 in READ COMMITTED (history.sql): again, in a new snapshot that sees it moved.
            FOR i IN 1..20 LOOP
                BEGIN
                    IF cardinality(c_ids) > 1 THEN
                        PERFORM 1 FROM (SELECT j.id FROM jobs AS j WHERE j.id = ANY (c_ids) ORDER BY j.id
                                           FOR NO KEY UPDATE) AS l;
                    END IF;
                    WITH u AS (
                        UPDATE jobs AS c
                           SET remaining_deps = c.remaining_deps - t.n,
                               failed_deps = c.failed_deps + t.k,
                               state = CASE WHEN c.failed_deps + t.k > 0 THEN 'cancelled'::job_state
                                            WHEN c.remaining_deps - t.n > 0 THEN 'waiting'
                                            WHEN c.run_at > now() THEN 'scheduled'
                                            ELSE 'pending' END,
                               completed_at = CASE WHEN c.failed_deps + t.k > 0 THEN now() ELSE c.completed_at END
                          FROM unnest(c_ids, c_n, c_k) AS t(id, n, k)
                         WHERE c.id = t.id AND c.state = 'waiting'
                        RETURNING c.id, c.state, c.queue, c.kind, c.attempt, c.batch_id
                    )
                    SELECT jsonb_agg(jsonb_build_object('id', u.id, 'state', u.state, 'queue', u.queue, 'kind', u.kind,
                                                        'attempt', u.attempt, 'batch_id', u.batch_id))
                               FILTER (WHERE u.state <> 'waiting'),
                           array_agg(DISTINCT u.queue) FILTER (WHERE u.state = 'pending'),
                           array_agg(u.id) FILTER (WHERE u.state = 'cancelled')
                      INTO v_ev, v_wk, v_jobs
                      FROM u;
                    v_events := v_events || coalesce(v_ev, '[]');
                    v_wake := v_wake || coalesce(v_wk, '{}');
                    EXIT;
                EXCEPTION WHEN serialization_failure THEN
                    PERFORM _lost_race(i, SQLERRM);  -- (sql/history.sql, ROW MOVEMENT)
                END;
            END LOOP;
        END IF;
    END LOOP;
    IF cardinality(v_wake) > 0 THEN
        PERFORM _wake(v_wake);
    END IF;
    IF jsonb_array_length(v_events) > 0 THEN
        PERFORM _notify_status(v_events);
    END IF;
END;
$$;

-- complete(..., continuations): follow-up jobs of `parent` (which has just succeeded), added
-- atomically with the completion. Each depends on the parent with `success` (settled at insert:
-- it shows in job_status().depends_on and lets the follow-up read the parent's result), and on
-- any sibling the parent added with before_continuations.
CREATE OR REPLACE FUNCTION pgjobs._add_continuations(parent bigint, specs jsonb)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    PERFORM _check_specs(specs, 'continuations');
    PERFORM 1 FROM _graph_insert(specs, NULL, false, parent, 'continuations');
END;
$$;

-- retry() made `ids` (failed or cancelled) pending again: undo what their settlement closed.
-- Their batches are recounted (and reopened); edges they had settled are unsettled for the
-- children that still wait or that the graph cancelled because of them (cancelled with no
-- cancel_requested: never run, never cancelled by a person); such a child with no other
-- unsatisfied edge goes back to waiting, and the reopening cascades through it. Children that
-- were already released (or ran) stay as they are.
CREATE OR REPLACE FUNCTION pgjobs._reopen(ids bigint[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_jobs     bigint[] := ids;
    v_batches  bigint[];
    v_reopened bigint[];
    v_kids     bigint[];
    v_was      bigint[];
    v_ev       jsonb;
    v_events   jsonb := '[]';
BEGIN
    WHILE v_jobs IS NOT NULL AND cardinality(v_jobs) > 0 LOOP
        SELECT array_agg(DISTINCT j.batch_id) INTO v_batches
          FROM jobs AS j WHERE j.id = ANY (v_jobs) AND j.batch_id IS NOT NULL;
        v_reopened := NULL;
        IF v_batches IS NOT NULL THEN
            SELECT array_agg(r.id) FILTER (WHERE r.reopened) INTO v_reopened FROM _recount_batches(v_batches) AS r;
        END IF;

        -- Children that can still be affected, locked in id order.
        SELECT array_agg(l.id ORDER BY l.id), array_agg(l.id ORDER BY l.id) FILTER (WHERE l.state = 'cancelled')
          INTO v_kids, v_was
          FROM (SELECT j.id, j.state FROM jobs AS j
                 WHERE j.id IN (SELECT e.child_id FROM edges AS e
                                 WHERE (e.parent_job_id = ANY (v_jobs) OR e.parent_batch_id = ANY (v_reopened))
                                   AND e.satisfied IS NOT NULL)
                   AND (j.state = 'waiting' OR (j.state = 'cancelled' AND NOT j.cancel_requested))
                 ORDER BY j.id
                   FOR NO KEY UPDATE) AS l;
        IF v_kids IS NULL THEN
            EXIT;
        END IF;
        UPDATE edges AS e SET satisfied = NULL
         WHERE e.child_id = ANY (v_kids) AND e.satisfied IS NOT NULL
           AND (e.parent_job_id = ANY (v_jobs) OR e.parent_batch_id = ANY (v_reopened));
        -- Recount each child from its edges; a graph-cancelled child with nothing unsatisfied left waits again.
        WITH cnt AS (
            SELECT e.child_id, count(*) FILTER (WHERE e.satisfied IS NULL)::int AS rem,
                   count(*) FILTER (WHERE NOT e.satisfied)::int AS fail
              FROM edges AS e WHERE e.child_id = ANY (v_kids) GROUP BY e.child_id
        ), u AS (
            UPDATE jobs AS c
               SET remaining_deps = cnt.rem, failed_deps = cnt.fail,
                   state = CASE WHEN cnt.fail = 0 THEN 'waiting'::job_state ELSE c.state END,
                   completed_at = CASE WHEN cnt.fail = 0 THEN NULL ELSE c.completed_at END
              FROM cnt
             WHERE c.id = cnt.child_id
            RETURNING c.id, c.state, c.queue, c.kind, c.attempt, c.batch_id
        )
        SELECT jsonb_agg(jsonb_build_object('id', u.id, 'state', u.state, 'queue', u.queue, 'kind', u.kind,
                                            'attempt', u.attempt, 'batch_id', u.batch_id)) FILTER (WHERE u.id = ANY (v_was)),
               array_agg(u.id) FILTER (WHERE u.id = ANY (v_was))
          INTO v_ev, v_jobs
          FROM u
         WHERE u.state = 'waiting';
        v_events := v_events || coalesce(v_ev, '[]');
    END LOOP;
    PERFORM _notify_status(v_events);
END;
$$;

-- The results of a job's parents, as {"<parent job id>": result}: its job parents, and every
-- member of its batch parents. NULL for an unknown job; {} for a job with no parents.
CREATE OR REPLACE FUNCTION pgjobs.parent_results(id bigint)
RETURNS jsonb
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM jobs AS c WHERE c.id = parent_results.id) THEN NULL
                ELSE coalesce((SELECT jsonb_object_agg(p.id::text, p.result ORDER BY p.id)
                                 FROM jobs AS p
                                WHERE p.id IN (SELECT e.parent_job_id FROM edges AS e
                                                WHERE e.child_id = parent_results.id AND e.parent_job_id IS NOT NULL)
                                   OR p.batch_id IN (SELECT e.parent_batch_id FROM edges AS e
                                                      WHERE e.child_id = parent_results.id
                                                        AND e.parent_batch_id IS NOT NULL)),
                              '{}'::jsonb) END;
$$;

-- parent_results for many jobs in one round trip (a worker filling ctx.parent_results for a claim):
-- one row per job of `ids` that has parents.
CREATE OR REPLACE FUNCTION pgjobs.parent_results_many(ids bigint[])
RETURNS TABLE (id bigint, results jsonb)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT c.id, parent_results(c.id)
      FROM (SELECT DISTINCT u.id FROM unnest(parent_results_many.ids) AS u(id)) AS c
     WHERE EXISTS (SELECT 1 FROM edges AS e WHERE e.child_id = c.id)
     ORDER BY c.id;
$$;

-- Recounts batches from their members, under the batches' row locks (taken in id order, before
-- counting: a member settling concurrently either committed before the lock, and is counted
-- as settled, or updates the counters after us). Returns whether each batch went from settled
-- back to executing.
CREATE OR REPLACE FUNCTION pgjobs._recount_batches(ids bigint[])
RETURNS TABLE (id bigint, reopened boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_old bigint[];
BEGIN
    SELECT array_agg(l.id) FILTER (WHERE l.state <> 'executing') INTO v_old
      FROM (SELECT b.id, b.state FROM batches AS b WHERE b.id = ANY (ids) ORDER BY b.id FOR NO KEY UPDATE) AS l;
    RETURN QUERY
    WITH cnt AS (
        SELECT b.id,
               count(j.id)::int AS total,
               count(j.id) FILTER (WHERE j.state NOT IN ('succeeded', 'failed', 'cancelled'))::int AS pending,
               count(j.id) FILTER (WHERE j.state = 'succeeded')::int AS succeeded,
               count(j.id) FILTER (WHERE j.state = 'failed')::int AS failed,
               count(j.id) FILTER (WHERE j.state = 'cancelled')::int AS cancelled
          FROM unnest(ids) AS b(id)
          LEFT JOIN jobs AS j ON j.batch_id = b.id
         GROUP BY b.id
    ), u AS (
        UPDATE batches AS b
           SET total = c.total, pending = c.pending, succeeded = c.succeeded, failed = c.failed,
               cancelled = c.cancelled,
               state = CASE WHEN c.pending > 0 THEN 'executing'::batch_state
                            WHEN c.failed > 0 THEN 'failed'
                            WHEN c.cancelled > 0 THEN 'cancelled'
                            ELSE 'succeeded' END,
               completed_at = CASE WHEN c.pending > 0 THEN NULL ELSE coalesce(b.completed_at, now()) END
          FROM cnt AS c
         WHERE b.id = c.id
        RETURNING b.id, b.state
    )
    SELECT u.id, u.state = 'executing' AND u.id = ANY (coalesce(v_old, '{}')) FROM u;
END;
$$;
