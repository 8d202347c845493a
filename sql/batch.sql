-- Batches: a set of jobs with live counters and a state of its own (created by
-- enqueue_many(as_batch => true); counters kept by _propagate and _recount_batches in graph.sql).
--
-- Counters: total (members), pending (members not yet terminal), succeeded, failed, cancelled.
-- The batch settles when pending reaches 0: `failed` if any member failed, else `cancelled` if
-- any was cancelled, else `succeeded`; batch-level continuations (depends_on {"batch": id})
-- settle then: while the batch executes, a failed member may still be retried, so the batch's
-- outcome (and whether a batch-level trigger is met) is only known when it settles.

-- Counters, state and progress of a batch; no row for an unknown id.
CREATE OR REPLACE FUNCTION pgjobs.batch_status(batch_id bigint)
RETURNS TABLE (id bigint, state pgjobs.batch_state, total int, pending int, succeeded int, failed int,
               cancelled int, fraction_settled double precision, created_at timestamptz,
               started_at timestamptz, completed_at timestamptz)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT b.id, b.state, b.total, b.pending, b.succeeded, b.failed, b.cancelled,
           CASE WHEN b.total = 0 THEN 1.0 ELSE (b.total - b.pending)::double precision / b.total END,
           b.created_at, b.started_at, b.completed_at
      FROM batches AS b
     WHERE b.id = batch_status.batch_id;
$$;

-- The batch as a graph: {"batch": <batch_status>, "nodes": [...], "edges": [...]}. Nodes are the
-- members plus any job an edge connects them to ("member": false); edges are every edge into
-- or out of a member, and the batch's own continuations ({"from_batch": id, "to": child}).
-- NULL for an unknown id.
CREATE OR REPLACE FUNCTION pgjobs.batch_graph(batch_id bigint)
RETURNS jsonb
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    WITH b AS (
        SELECT * FROM batch_status(batch_graph.batch_id)
    ), members AS (
        SELECT j.id FROM jobs AS j WHERE j.batch_id = batch_graph.batch_id
    ), e AS (
        SELECT e.child_id, e.parent_job_id, e.parent_batch_id, e.trigger, e.satisfied FROM edges AS e
         WHERE e.child_id IN (SELECT m.id FROM members AS m)
        UNION
        SELECT e.child_id, e.parent_job_id, e.parent_batch_id, e.trigger, e.satisfied FROM edges AS e
         WHERE e.parent_job_id IN (SELECT m.id FROM members AS m)
        UNION
        SELECT e.child_id, e.parent_job_id, e.parent_batch_id, e.trigger, e.satisfied FROM edges AS e
         WHERE e.parent_batch_id = batch_graph.batch_id
    ), nodes AS (
        SELECT j.id, j.kind, j.queue, j.state, j.attempt, j.batch_id, j.completed_at
          FROM jobs AS j
         WHERE j.id IN (SELECT m.id FROM members AS m
                        UNION SELECT e.child_id FROM e
                        UNION SELECT e.parent_job_id FROM e WHERE e.parent_job_id IS NOT NULL)
    )
    SELECT jsonb_build_object(
               'batch', (SELECT to_jsonb(b) FROM b),
               'nodes', coalesce((SELECT jsonb_agg(jsonb_build_object(
                                             'id', n.id, 'kind', n.kind, 'queue', n.queue, 'state', n.state,
                                             'attempt', n.attempt, 'batch_id', n.batch_id,
                                             'member', n.batch_id IS NOT DISTINCT FROM batch_graph.batch_id)
                                         ORDER BY n.id)
                                    FROM nodes AS n), '[]'::jsonb),
               'edges', coalesce((SELECT jsonb_agg(CASE WHEN e.parent_job_id IS NOT NULL
                                                        THEN jsonb_build_object('from', e.parent_job_id)
                                                        ELSE jsonb_build_object('from_batch', e.parent_batch_id) END
                                                   || jsonb_build_object('to', e.child_id, 'on', e.trigger,
                                                                         'satisfied', e.satisfied)
                                                   ORDER BY e.child_id, e.parent_job_id NULLS LAST, e.parent_batch_id)
                                    FROM e), '[]'::jsonb))
      FROM b;
$$;

-- Cancels every member not yet terminal: waiting/scheduled/pending ones at once, running ones by
-- request (their workers are told on pgjobs_cancel and end them `cancelled`). Returns how many
-- members it cancelled (requests included). The batch settles when the last running member ends.
CREATE OR REPLACE FUNCTION pgjobs.cancel_batch(batch_id bigint)
RETURNS int
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_ids     bigint[];
    v_events  jsonb;
    v_active  int;
BEGIN
    -- Locking running members waits for the workers ending them. In READ COMMITTED that wait ends in
    -- 40001 ("tuple to be locked was already moved to another partition") when the holder moved the row
    -- (history.sql), and with workers completing members all the time, the same statement again could
    -- lose on every try: after one lost race the running members are locked one at a time, still in id
    -- order (_lock_jobs_in_turn, races.sql; each lock kept, so the call gets through). Not SKIP LOCKED
    -- and then a wait for the skipped ones: holding a later member while waiting for an earlier one
    -- deadlocks with a complete_many that holds the earlier and wants the later
    -- (tests/runtime/test_lease_races.py). The rest of the call retries as a whole.
    FOR i IN 1..20 LOOP
        BEGIN
            PERFORM 1 FROM batches AS b WHERE b.id = cancel_batch.batch_id;
            IF NOT FOUND THEN
                PERFORM _not_found('batch', cancel_batch.batch_id);
            END IF;
            -- Running members first: a worker completing one holds its row and then wants the batch row and
            -- the member's waiting children, so we must not hold those children while we wait for it.
            IF i = 1 THEN
                WITH a AS (
                    UPDATE jobs AS j SET cancel_requested = true
                      FROM (SELECT l.id FROM jobs AS l
                             WHERE l.batch_id = cancel_batch.batch_id AND l.state = 'active' AND NOT l.cancel_requested
                             ORDER BY l.id
                               FOR NO KEY UPDATE) AS l
                     WHERE j.id = l.id AND j.state = 'active'
                    RETURNING j.id
                )
                SELECT count(pg_notify('pgjobs_cancel', a.id::text))::int INTO v_active FROM a;
            ELSE
                v_ids := ARRAY(SELECT t.id
                                 FROM _lock_jobs_in_turn(ARRAY(SELECT l.id FROM jobs AS l
                                                                WHERE l.batch_id = cancel_batch.batch_id
                                                                  AND l.state = 'active' AND NOT l.cancel_requested)) AS t
                                WHERE t.state = 'active');
                WITH a AS (
                    UPDATE jobs AS j SET cancel_requested = true
                     WHERE j.id = ANY (v_ids) AND j.state = 'active' AND NOT j.cancel_requested
                       AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
                    RETURNING j.id
                )
                SELECT count(pg_notify('pgjobs_cancel', a.id::text))::int INTO v_active FROM a;
                v_ids := NULL;
            END IF;
            -- Then the idle ones, locked in id order (a claimer skips locked rows; a settler waits on them).
            -- cancel_requested marks a cancellation by a person: _reopen never revives these.
            WITH u AS (
                UPDATE jobs AS j SET state = 'cancelled', completed_at = now(), cancel_requested = true
                  FROM (SELECT l.id FROM jobs AS l
                         WHERE l.batch_id = cancel_batch.batch_id AND l.state IN ('waiting', 'scheduled', 'pending')
                         ORDER BY l.id
                           FOR NO KEY UPDATE) AS l
                 WHERE j.id = l.id AND j.state IN ('waiting', 'scheduled', 'pending')
                RETURNING j.id, j.queue, j.kind, j.attempt, j.batch_id
            )
            SELECT array_agg(u.id ORDER BY u.id),
                   jsonb_agg(jsonb_build_object('id', u.id, 'state', 'cancelled', 'queue', u.queue, 'kind', u.kind,
                                                'attempt', u.attempt, 'batch_id', u.batch_id) ORDER BY u.id)
              INTO v_ids, v_events
              FROM u;
            -- Members claimed between the two statements are running now. SKIP LOCKED: one locked at
            -- this instant is being ended by its worker (or renewed), and waiting for it while we hold
            -- the idle members could deadlock with its propagation.
            WITH a AS (
                UPDATE jobs AS j SET cancel_requested = true
                  FROM (SELECT l.id FROM jobs AS l
                         WHERE l.batch_id = cancel_batch.batch_id AND l.state = 'active' AND NOT l.cancel_requested
                         ORDER BY l.id
                           FOR NO KEY UPDATE SKIP LOCKED) AS l
                 WHERE j.id = l.id
                RETURNING j.id
            )
            SELECT v_active + count(pg_notify('pgjobs_cancel', a.id::text))::int INTO v_active FROM a;
            PERFORM _notify_status(v_events);
            IF v_ids IS NOT NULL THEN
                PERFORM _propagate(v_ids);
            END IF;
            RETURN coalesce(cardinality(v_ids), 0) + v_active;
        EXCEPTION WHEN serialization_failure THEN
            PERFORM _lost_race(i, SQLERRM);  -- (sql/history.sql, ROW MOVEMENT)
        END;
    END LOOP;
END;
$$;

-- A running batch member (lease token CAS: a stale token changes nothing and returns NULL) adds a
-- sibling to its batch; returns the sibling's id. With before_continuations, the jobs that depend
-- on the calling job (now, and any continuation attached later) also wait for the sibling to
-- settle (an extra `complete` dependency: its outcome is the batch's business, not theirs).
-- A job outside a batch, or one whose cancellation was requested, raises PJ004.
CREATE OR REPLACE FUNCTION pgjobs.add_to_batch(id bigint, lease_token uuid, job jsonb,
                                               before_continuations boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_batch   bigint;
    v_found   boolean;
    v_sib     bigint;
    v_created boolean;
    v_state   job_state;
    v_cancel  boolean;
BEGIN
    SELECT j.batch_id INTO v_batch FROM jobs AS j WHERE j.id = add_to_batch.id;
    v_found := FOUND;
    IF v_found AND v_batch IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ004',
            MESSAGE = format('job %s is not in a batch; add_to_batch needs a batch member', add_to_batch.id);
    END IF;
    PERFORM _check_specs(jsonb_build_array(job), 'job');
    IF NOT v_found THEN
        RETURN NULL;
    END IF;
    -- The caller's row lock keeps it active (so its batch cannot settle) until we commit.
    BEGIN
        SELECT j.batch_id, j.cancel_requested INTO v_batch, v_cancel FROM jobs AS j
         WHERE j.id = add_to_batch.id AND j.lease_token = add_to_batch.lease_token AND j.state = 'active'
           FOR NO KEY UPDATE;
    EXCEPTION WHEN serialization_failure THEN
        -- the caller's row moved to history while we waited on it (its attempt ended: history.sql)
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE;
        END IF;
        RETURN NULL;
    END;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- A member whose cancellation was requested (cancel, or cancel_batch of its batch) must not add
    -- work: a sibling added after cancel_batch would be pending in a batch its owner cancelled, and
    -- would run. cancel_batch flags running members under their row lock, which we hold now, so
    -- either it flagged the caller before (refused here) or it runs after we commit and cancels the
    -- new sibling with the other idle members.
    IF v_cancel THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ004',
            MESSAGE = format('job %s is being cancelled; it cannot add a job to batch %s', add_to_batch.id, v_batch);
    END IF;

    SELECT g.id, g.created INTO v_sib, v_created
      FROM _graph_insert(jsonb_build_array(job), v_batch, false, NULL, 'job') AS g;
    SELECT j.state INTO v_state FROM jobs AS j WHERE j.id = v_sib;

    IF before_continuations AND v_created AND v_state NOT IN ('succeeded', 'failed', 'cancelled') THEN
        INSERT INTO continuation_holds (job_id, sibling_id) VALUES (add_to_batch.id, v_sib);
        -- The caller's waiting children now also wait for the sibling (each under its row lock,
        -- so a child being cancelled concurrently is left alone).
        WITH kids AS (
            SELECT c.id FROM jobs AS c
             WHERE c.id IN (SELECT e.child_id FROM edges AS e
                             WHERE e.parent_job_id = add_to_batch.id AND e.satisfied IS NULL)
               AND c.state = 'waiting'
             ORDER BY c.id
               FOR NO KEY UPDATE
        ), u AS (
            UPDATE jobs AS c SET remaining_deps = c.remaining_deps + 1
             WHERE c.id IN (SELECT kids.id FROM kids) AND c.state = 'waiting'
            RETURNING c.id
        )
        INSERT INTO edges (child_id, parent_job_id, trigger)
        SELECT u.id, v_sib, 'complete' FROM u;
        UPDATE jobs AS j SET has_dependents = true WHERE j.id = v_sib AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[]);
    END IF;
    RETURN v_sib;
END;
$$;

-- Deletes a settled batch with its members and their edges; returns the members removed.
-- Unknown id: PJ003; a batch still executing: PJ004 (cancel it first).
CREATE OR REPLACE FUNCTION pgjobs.delete_batch(batch_id bigint)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_state   batch_state;
    v_removed bigint;
    v_ids     bigint[];
BEGIN
    SELECT b.state INTO v_state FROM batches AS b WHERE b.id = delete_batch.batch_id FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM _not_found('batch', delete_batch.batch_id);
    END IF;
    IF v_state = 'executing' THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ004',
            MESSAGE = format('batch %s is executing; only settled batches can be deleted (cancel it first)',
                             delete_batch.batch_id);
    END IF;
    -- (no foreign keys to jobs since job_history: _forget_jobs removes the members' edges, holds and keys)
    WITH gone AS (DELETE FROM jobs AS j WHERE j.batch_id = delete_batch.batch_id RETURNING j.id)
    SELECT count(*), array_agg(gone.id) INTO v_removed, v_ids FROM gone;
    PERFORM _forget_jobs(v_ids);
    DELETE FROM batches AS b WHERE b.id = delete_batch.batch_id;
    RETURN v_removed;
END;
$$;

-- purge(): settled batches whose members are all past their age go whole, members and edges
-- together (NULL age: that class is kept). Returns the members removed.
CREATE OR REPLACE FUNCTION pgjobs._purge_batches(succeeded_before interval, failed_before interval)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_ids     bigint[];
    v_members bigint[];
    v_removed bigint;
BEGIN
    IF succeeded_before IS NULL AND failed_before IS NULL THEN
        RETURN 0;
    END IF;
    SELECT array_agg(l.id) INTO v_ids
      FROM (SELECT b.id FROM batches AS b
             WHERE b.state <> 'executing'
               AND NOT EXISTS (SELECT 1 FROM jobs AS j
                                WHERE j.batch_id = b.id
                                  AND NOT coalesce((j.state = 'succeeded' AND j.completed_at < now() - succeeded_before)
                                                   OR (j.state IN ('failed', 'cancelled')
                                                       AND j.completed_at < now() - failed_before), false))
               FOR UPDATE SKIP LOCKED) AS l;
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    WITH gone AS (DELETE FROM jobs AS j WHERE j.batch_id = ANY (v_ids) RETURNING j.id)
    SELECT count(*), array_agg(gone.id) INTO v_removed, v_members FROM gone;
    PERFORM _forget_jobs(v_members);
    DELETE FROM batches AS b WHERE b.id = ANY (v_ids);
    RETURN v_removed;
END;
$$;
