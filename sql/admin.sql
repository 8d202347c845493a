-- Managing work: cancel, retry, delete, purge, and per-queue settings.

-- Not yet running -> 'cancelled' (success/failure children cancelled in cascade by _propagate).
-- Running -> cancel_requested, and its worker is told on pgjobs_cancel; it ends the job as
-- 'cancelled' (ack_cancel), or a later fail/release/lease expiry does. Terminal -> false.
CREATE OR REPLACE FUNCTION pgjobs.cancel(id bigint)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_job record;
BEGIN
    -- Locking the job waits for whoever holds it: a worker completing it, a cascade cancelling it.
    -- In READ COMMITTED that wait ends in 40001 ("tuple to be locked was already moved to another
    -- partition") when the holder moved the row (history.sql): the whole call again, in a new snapshot.
    FOR i IN 1..20 LOOP
        BEGIN
            -- Lock first: the state read and the transition must see the same row version.
            SELECT j.id, j.state, j.queue, j.kind, j.attempt, j.batch_id, j.has_dependents INTO v_job
              FROM jobs AS j WHERE j.id = cancel.id FOR UPDATE;
            IF NOT FOUND THEN
                PERFORM _not_found('job', cancel.id);
            END IF;
            IF v_job.state IN ('succeeded', 'failed', 'cancelled') THEN
                RETURN false;
            ELSIF v_job.state = 'active' THEN
                UPDATE jobs AS j SET cancel_requested = true WHERE j.id = cancel.id;
                PERFORM pg_notify('pgjobs_cancel', cancel.id::text);
                RETURN true;
            END IF;
            UPDATE jobs AS j SET state = 'cancelled', completed_at = now(), cancel_requested = true
             WHERE j.id = cancel.id;
            PERFORM _notify_status(jsonb_build_array(jsonb_build_object(
                'id', v_job.id, 'state', 'cancelled', 'queue', v_job.queue, 'kind', v_job.kind,
                'attempt', v_job.attempt, 'batch_id', v_job.batch_id)));
            IF v_job.batch_id IS NOT NULL OR v_job.has_dependents THEN
                PERFORM _propagate(ARRAY[v_job.id]);
            END IF;
            RETURN true;
        EXCEPTION WHEN serialization_failure THEN
            PERFORM _lost_race(i, SQLERRM);  -- (sql/history.sql, ROW MOVEMENT)
        END;
    END LOOP;
END;
$$;

-- A failed or cancelled job becomes pending again. Its attempt count is kept (history), and
-- max_attempts is raised when needed so the retry gets one more attempt. A job cancelled before its
-- dependencies settled waits for them again; one whose dependency settled unmet is refused (PJ004):
-- it would run with that edge unmet (retrying the parent reopens it).
CREATE OR REPLACE FUNCTION pgjobs.retry(id bigint)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_job record;
    v_edge record;
    v_waits int;
BEGIN
    -- Locking the job waits for whoever holds it (another retry or delete).
    -- In READ COMMITTED that wait ends in 40001 ("tuple to be locked was already moved to another
    -- partition") when the holder moved the row (history.sql): the whole call again, in a new snapshot.
    FOR i IN 1..20 LOOP
        BEGIN
            SELECT j.id, j.state, j.queue, j.kind, j.unique_key, j.unique_live_only INTO v_job
              FROM jobs AS j WHERE j.id = retry.id FOR UPDATE;
            IF NOT FOUND THEN
                PERFORM _not_found('job', retry.id);
            END IF;
            IF v_job.state NOT IN ('failed', 'cancelled') THEN
                RAISE EXCEPTION USING ERRCODE = 'PJ004',
                    MESSAGE = format('job %s is %s; only failed or cancelled jobs can be retried', retry.id, v_job.state);
            END IF;
            -- A child cancelled because a dependency settled the wrong way would run with that edge unmet:
            -- refused; retrying the parent reopens it (the edge waits for the parent again).
            SELECT e.parent_job_id, e.parent_batch_id, e.trigger INTO v_edge
              FROM edges AS e WHERE e.child_id = retry.id AND NOT e.satisfied
             ORDER BY e.parent_job_id NULLS LAST, e.parent_batch_id
             LIMIT 1;
            IF FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'PJ004',
                    MESSAGE = format('job %s cannot be retried: its dependency on %s (on %s) can no longer be met; retry that %s instead',
                                     retry.id, coalesce('job ' || v_edge.parent_job_id, 'batch ' || v_edge.parent_batch_id),
                                     v_edge.trigger, CASE WHEN v_edge.parent_job_id IS NULL THEN 'batch''s members' ELSE 'job' END);
            END IF;
            -- A job cancelled while it waited still has unsettled edges: it waits again (read under the job's
            -- lock: a parent settling concurrently updates this row after us, as waiting, or settled its edge
            -- before this statement's snapshot).
            SELECT count(*) INTO v_waits FROM edges AS e WHERE e.child_id = retry.id AND e.satisfied IS NULL;
            -- The job becomes live again, so it takes a slot of a bounded queue like an enqueue
            -- (PJ001 when the queue is full): max_length bounds the live jobs, however they got there.
            PERFORM _reserve_capacity(v_job.queue, 1);
            -- A unique_live_only key was given back when the job ended: the retried job takes it again, through
            -- job_keys' primary key (a live job that took it meanwhile keeps it, and the retry is refused).
            IF v_job.unique_live_only AND v_job.unique_key IS NOT NULL THEN
                INSERT INTO job_keys AS k (kind, unique_key, job_id) VALUES (v_job.kind, v_job.unique_key, v_job.id)
                ON CONFLICT (kind, unique_key) DO NOTHING;
                IF NOT FOUND THEN
                    RAISE EXCEPTION USING ERRCODE = 'PJ004',
                        MESSAGE = format('job %s cannot be retried: another live job holds its unique key', retry.id);
                END IF;
            END IF;
            BEGIN
                UPDATE jobs AS j
                   SET state = CASE WHEN v_waits > 0 THEN 'waiting'::job_state ELSE 'pending' END,
                       remaining_deps = v_waits, failed_deps = 0,
                       run_at = now(), completed_at = NULL, cancel_requested = false,
                       max_attempts = greatest(j.max_attempts, j.attempt + 1),
                       lease_token = NULL, lease_expires_at = NULL
                 WHERE j.id = retry.id
                RETURNING j.id, j.state, j.queue, j.kind, j.attempt, j.batch_id INTO v_job;
            EXCEPTION WHEN unique_violation THEN
                RAISE EXCEPTION USING ERRCODE = 'PJ004',
                    MESSAGE = format('job %s cannot be retried: another live job holds its unique key', retry.id);
            END;
            PERFORM _reopen(ARRAY[v_job.id]);
            IF v_job.state = 'pending' THEN
                PERFORM pg_notify('pgjobs_wake', v_job.queue);
            END IF;
            PERFORM _notify_status(jsonb_build_array(jsonb_build_object(
                'id', v_job.id, 'state', v_job.state, 'queue', v_job.queue, 'kind', v_job.kind,
                'attempt', v_job.attempt, 'batch_id', v_job.batch_id)));
            RETURN true;
        EXCEPTION WHEN serialization_failure THEN
            PERFORM _lost_race(i, SQLERRM);  -- (sql/history.sql, ROW MOVEMENT)
        END;
    END LOOP;
END;
$$;

-- Removes a terminal job (its edges go with it).
CREATE OR REPLACE FUNCTION pgjobs.delete(id bigint)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_state job_state;
    v_batch bigint;
BEGIN
    -- Locking the job waits for whoever holds it (a retry moving it back to jobs_live).
    -- In READ COMMITTED that wait ends in 40001 ("tuple to be locked was already moved to another
    -- partition") when the holder moved the row (history.sql): the whole call again, in a new snapshot.
    FOR i IN 1..20 LOOP
        BEGIN
            SELECT j.state, j.batch_id INTO v_state, v_batch FROM jobs AS j WHERE j.id = delete.id FOR UPDATE;
            IF NOT FOUND THEN
                PERFORM _not_found('job', delete.id);
            END IF;
            IF v_state NOT IN ('succeeded', 'failed', 'cancelled') THEN
                RAISE EXCEPTION USING ERRCODE = 'PJ004',
                    MESSAGE = format('job %s is %s; only terminal jobs can be deleted (cancel it first)', delete.id, v_state);
            END IF;
            DELETE FROM jobs AS j WHERE j.id = delete.id;
            -- Its edges (either end), continuation holds and unique key (no foreign keys to jobs: history.sql).
            PERFORM _forget_jobs(ARRAY[delete.id]);
            IF v_batch IS NOT NULL THEN
                -- A batch's counters and state must keep equalling a recount of its members: a `failed` batch
                -- whose only failed member is deleted is `succeeded` now (or `cancelled`). What the batch's own
                -- continuations did when it settled stays done.
                PERFORM _recount_batches(ARRAY[v_batch]);
            END IF;
            RETURN true;
        EXCEPTION WHEN serialization_failure THEN
            PERFORM _lost_race(i, SQLERRM);  -- (sql/history.sql, ROW MOVEMENT)
        END;
    END LOOP;
END;
$$;

-- purge(): sql/maintain.sql (whole history slices, rows only in the boundary slice).

-- configure_queue: NULL leaves a setting as it is; 0 removes a limit (retention '0': keep until purge).
-- Returns the settings.
CREATE OR REPLACE FUNCTION pgjobs.configure_queue(
    queue                text,
    max_length           int DEFAULT NULL,
    paused               boolean DEFAULT NULL,
    fair                 boolean DEFAULT NULL,
    noisy_share          real DEFAULT NULL,
    noisy_min_active     int DEFAULT NULL,
    max_active_per_group int DEFAULT NULL,
    max_active           int DEFAULT NULL,
    status_events        text DEFAULT NULL,
    retention            interval DEFAULT NULL,
    max_starts           int DEFAULT NULL,
    per                  interval DEFAULT NULL)
RETURNS pgjobs.queues
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_row queues;
    v_was_paused boolean;
    v_was_counted boolean;
    v_was_grouped boolean;
BEGIN
    PERFORM _check_name('queue', queue);  -- limits: checks.sql
    IF max_length < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = format('max_length must be >= 0 (0 removes the limit), got %s', max_length);
    ELSIF max_active < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = format('max_active must be >= 0 (0 removes the limit), got %s', max_active);
    ELSIF max_active_per_group < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('max_active_per_group must be >= 0 (0 removes the limit), got %s', max_active_per_group);
    ELSIF noisy_min_active < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = format('noisy_min_active must be >= 0, got %s', noisy_min_active);
    ELSIF noisy_share <= 0 OR noisy_share > 1 OR noisy_share = 'NaN'::real THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = format('noisy_share must be in (0, 1], got %s', noisy_share);
    ELSIF retention < interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('retention must be >= 0 (0 removes it: keep until purge), got %s', retention);
    ELSIF status_events NOT IN ('all', 'terminal', 'none') THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('status_events must be ''all'', ''terminal'' or ''none'', got %s', _shown(status_events));
    END IF;

    -- The queue's rate limit (rate_limits.sql): NULL keeps it, max_starts 0 removes it.
    IF configure_queue.max_starts IS NOT NULL OR configure_queue.per IS NOT NULL THEN
        PERFORM _rate_configure('queue', configure_queue.queue, configure_queue.max_starts, configure_queue.per, NULL);
    END IF;
    -- A call that sets max_active, fair or max_active_per_group may start, end or regroup the queue's active
    -- ledger (caps.sql), whose triggers file a change only for a queue counted when their statement runs. A
    -- transaction that ended an active job before the change and commits after the ledger's first count would
    -- be missing from it for good, so the call waits for every transaction writing jobs to end, and holds new
    -- ones back until it commits. Taken before the queue's row lock: writers that lock that row (an enqueue
    -- to a bounded queue) hold their lock on jobs first.
    IF configure_queue.max_active IS NOT NULL OR configure_queue.fair IS NOT NULL
       OR configure_queue.max_active_per_group IS NOT NULL THEN
        LOCK TABLE jobs IN SHARE MODE;
    END IF;
    INSERT INTO queues AS q (queue) VALUES (configure_queue.queue) ON CONFLICT (queue) DO NOTHING;
    SELECT q.paused, q.max_active IS NOT NULL OR q.fair OR q.max_active_per_group IS NOT NULL,
           q.fair OR q.max_active_per_group IS NOT NULL
      INTO v_was_paused, v_was_counted, v_was_grouped
      FROM queues AS q WHERE q.queue = configure_queue.queue FOR UPDATE;
    UPDATE queues AS q
       SET max_length           = CASE WHEN configure_queue.max_length IS NULL THEN q.max_length
                                       ELSE nullif(configure_queue.max_length, 0) END,
           paused               = coalesce(configure_queue.paused, q.paused),
           fair                 = coalesce(configure_queue.fair, q.fair),
           noisy_share          = coalesce(configure_queue.noisy_share, q.noisy_share),
           noisy_min_active     = coalesce(configure_queue.noisy_min_active, q.noisy_min_active),
           max_active_per_group = CASE WHEN configure_queue.max_active_per_group IS NULL THEN q.max_active_per_group
                                       ELSE nullif(configure_queue.max_active_per_group, 0) END,
           max_active           = CASE WHEN configure_queue.max_active IS NULL THEN q.max_active
                                       ELSE nullif(configure_queue.max_active, 0) END,
           status_events        = coalesce(configure_queue.status_events, q.status_events),
           -- finished jobs of the queue are dropped by maintenance this long after they ended (history.sql)
           retention            = CASE WHEN configure_queue.retention IS NULL THEN q.retention
                                       ELSE nullif(configure_queue.retention, interval '0') END,
           updated_at           = now()
     WHERE q.queue = configure_queue.queue
    RETURNING q.* INTO v_row;
    -- A queue's active ledger (caps.sql) is kept while it is capped or fair, per group while fair or capped
    -- per group: one that changes either is counted afresh by its next claim, and its ring (fair.sql) is read
    -- afresh.
    IF v_was_counted <> (v_row.max_active IS NOT NULL OR v_row.fair OR v_row.max_active_per_group IS NOT NULL)
       OR v_was_grouped <> (v_row.fair OR v_row.max_active_per_group IS NOT NULL) THEN
        DELETE FROM cap_checkpoints AS c WHERE c.queue = configure_queue.queue;
        DELETE FROM fair_rings AS r WHERE r.queue = configure_queue.queue;
    END IF;
    -- Resuming a queue (or lifting a cap) may make work claimable: wake idle workers.
    IF v_was_paused AND NOT v_row.paused OR configure_queue.max_active IS NOT NULL
       OR configure_queue.max_active_per_group IS NOT NULL THEN
        PERFORM pg_notify('pgjobs_wake', v_row.queue);
    END IF;
    RETURN v_row;
END;
$$;

-- configure_group(queue, group_key, weight): a fair queue's group's share of the claims while it and others
-- have work (fair.sql, virtual time); weight 1, the default, removes the row. Returns the weight now.
CREATE OR REPLACE FUNCTION pgjobs.configure_group(queue text, group_key text, weight real DEFAULT 1)
RETURNS real
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM _check_name('queue', queue);
    PERFORM _check_name('group_key', group_key);
    IF weight IS NULL OR weight = 'NaN'::real OR weight <= 0 OR weight > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('weight must be in (0, 1000], got %s', coalesce(weight::text, 'NULL'));
    END IF;
    IF weight = 1 THEN
        DELETE FROM fair_weights AS w WHERE w.queue = configure_group.queue AND w.group_key = configure_group.group_key;
    ELSE
        INSERT INTO fair_weights AS w (queue, group_key, weight)
        VALUES (configure_group.queue, configure_group.group_key, configure_group.weight)
        ON CONFLICT ON CONSTRAINT fair_weights_pkey DO UPDATE SET weight = excluded.weight;
    END IF;
    RETURN weight;
END;
$$;
