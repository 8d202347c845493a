-- Maintenance: the pass the workers' heartbeats run (_maintain_if_due, at most one every 5 seconds across
-- all workers) and operations run (maintain), and purge. It sits above the files whose storage it keeps:
-- the status stream (stream.sql: inbox partitions emptied, the log rotated, follower marks forgotten),
-- job history (history.sql: slices made ahead, queue retention), rate limits (rate_limits.sql: the log
-- rows of starts no window reads again) and batches (batch.sql: settled batches purged whole). One pass at a time, under the stream's
-- advisory lock (_stream_lock).

-- One maintenance pass of the stream (see stream.sql's header): empties the inbox partitions the log has
-- taken in, rotates the log once its period has passed and the next partition's events are past
-- retention, forgets expired follower marks. One at a time: a pass that finds another running
-- reports 'busy' and does nothing. Returns what it did, one row per action.
CREATE OR REPLACE FUNCTION pgjobs.maintain()
RETURNS TABLE (action text, target text, rows bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pgjobs, pg_temp
SET jit = off
AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ004',
            MESSAGE = format('maintain needs READ COMMITTED, the transaction is %s', current_setting('transaction_isolation'));
    END IF;
    IF NOT pg_try_advisory_xact_lock(_stream_lock()) THEN
        RETURN QUERY
        SELECT 'busy'::text,
               'another tick or maintenance pass holds the stream lock (pid '
               || coalesce((SELECT string_agg(l.pid::text, ', ') FROM pg_locks AS l
                             WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                               AND (l.classid::bigint << 32) + l.objid::bigint = _stream_lock()), '?') || ')',
               NULL::bigint;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM _maintain();
END;
$$;

-- maintain()'s work; the caller holds the stream lock.
CREATE OR REPLACE FUNCTION pgjobs._maintain()
RETURNS TABLE (action text, target text, rows bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_cur_inbox smallint := (floor(extract(epoch FROM clock_timestamp()) / 15)::bigint % 4)::smallint;
    v_locked    smallint[] := '{}';
    v_tick      record;
    v_set       stream_settings;
    v_rot       event_rotations;
    v_next      smallint;
    v_ended     timestamptz;
    v_timeout   text := current_setting('lock_timeout');
    v_n         bigint;
    v_part      text;
BEGIN
    -- 1. Lock every non-current inbox partition that has rows; NOWAIT: one still held by a writer's
    --    open transaction is left for a later pass (its rows are not committed, or not yet ticked).
    FOR s IN 0..3 LOOP
        CONTINUE WHEN s = v_cur_inbox;
        CONTINUE WHEN NOT EXISTS (SELECT 1 FROM event_inbox AS i WHERE i.slot = s);
        BEGIN
            EXECUTE format('LOCK TABLE pgjobs.%I IN ACCESS EXCLUSIVE MODE NOWAIT', 'event_inbox_' || s);
            v_locked := v_locked || s::smallint;
        EXCEPTION WHEN lock_not_available THEN
            action := 'skip'; target := 'event_inbox_' || s || ' (a transaction that wrote to it is still open)';
            rows := NULL;
            RETURN NEXT;
        END;
    END LOOP;
    -- 2. Tick, in a snapshot taken after the locks: every row of the locked partitions is visible.
    v_tick := _tick_events(true);
    action := 'tick'; target := 'event_log'; rows := v_tick.events;
    RETURN NEXT;
    IF v_tick.events > 0 AND EXISTS (SELECT 1 FROM stream_followers AS f WHERE f.until > statement_timestamp()) THEN
        PERFORM pg_notify('pgjobs_status', '{"event_id": ' || v_tick.newest || '}');
    END IF;
    -- 3. Empty the locked inbox partitions: all their rows are in the log now.
    FOREACH v_next IN ARRAY v_locked LOOP
        EXECUTE format('TRUNCATE pgjobs.%I', 'event_inbox_' || v_next);
        action := 'truncate'; target := 'event_inbox_' || v_next; rows := NULL;
        RETURN NEXT;
    END LOOP;
    -- 4. Rotate the log when its period has passed, into a partition past retention.
    SELECT * INTO v_set FROM stream_settings;
    SELECT * INTO v_rot FROM event_rotations AS r ORDER BY r.rotation_id DESC LIMIT 1;
    IF clock_timestamp() - v_rot.started_at >= v_set.rotate_every THEN
        v_next := (v_rot.slot + 1) % 16;
        v_part := lpad(v_next::text, 2, '0');
        -- When the next partition was last written to: the start of the rotation after its last use.
        SELECT (SELECT r2.started_at FROM event_rotations AS r2 WHERE r2.rotation_id > r1.rotation_id
                 ORDER BY r2.rotation_id LIMIT 1)
          INTO v_ended
          FROM event_rotations AS r1 WHERE r1.slot = v_next ORDER BY r1.rotation_id DESC LIMIT 1;
        IF v_ended IS NOT NULL AND v_ended > clock_timestamp() - v_set.retention
           AND EXISTS (SELECT 1 FROM event_log AS l WHERE l.slot = v_next) THEN
            action := 'wait'; rows := NULL;
            target := format('event_log_%s holds events until %s (retention %s)', v_part, v_ended + v_set.retention,
                             v_set.retention);
            RETURN NEXT;
        ELSE
            BEGIN
                -- Readers hold the partition for a statement at a time: wait for them briefly only.
                PERFORM set_config('lock_timeout', '200ms', true);
                EXECUTE format('LOCK TABLE pgjobs.%I, pgjobs.%I IN ACCESS EXCLUSIVE MODE',
                               'event_log_' || v_part, 'event_ticks_' || v_part);
                PERFORM set_config('lock_timeout', v_timeout, true);
                SELECT count(*) INTO v_n FROM event_log AS l WHERE l.slot = v_next;
                EXECUTE format('TRUNCATE pgjobs.%I, pgjobs.%I', 'event_log_' || v_part, 'event_ticks_' || v_part);
                INSERT INTO event_rotations (slot) VALUES (v_next);
                action := 'rotate'; target := 'event_log_' || v_part; rows := v_n;
                RETURN NEXT;
            EXCEPTION WHEN lock_not_available THEN
                PERFORM set_config('lock_timeout', v_timeout, true);
                action := 'skip'; target := 'event_log_' || v_part || ' (readers held it; retried next pass)';
                rows := NULL;
                RETURN NEXT;
            END;
        END IF;
    END IF;
    -- 4b. Job history: slices ahead, queue retention (history.sql; never fails this pass).
    RETURN QUERY SELECT * FROM _maintain_history();
    -- 5. Forget what nobody needs (few rows: one per follower renewal, per rotation, per pass).
    DELETE FROM stream_followers AS f WHERE f.until < clock_timestamp() - interval '1 minute';
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n > 0 THEN
        action := 'forget'; target := 'stream_followers'; rows := v_n;
        RETURN NEXT;
    END IF;
    DELETE FROM event_rotations AS r
     WHERE r.started_at < clock_timestamp() - greatest(interval '1 day', 2 * v_set.retention)
       AND r.rotation_id < (SELECT max(r2.rotation_id) - 32 FROM event_rotations AS r2);
    DELETE FROM stream_maintenance AS m WHERE m.at < clock_timestamp() - interval '1 hour';
    INSERT INTO stream_maintenance DEFAULT VALUES;
END;
$$;

-- Maintenance from the workers: worker_heartbeat calls this; at most one pass every 5 seconds
-- across all workers, and never waits for another pass.
CREATE OR REPLACE FUNCTION pgjobs._maintain_if_due()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET jit = off
AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed'
       OR EXISTS (SELECT 1 FROM stream_maintenance AS m WHERE m.at > clock_timestamp() - interval '5 seconds')
       OR NOT pg_try_advisory_xact_lock(_stream_lock()) THEN
        RETURN;
    END IF;
    BEGIN
        PERFORM count(*) FROM _maintain();
    EXCEPTION WHEN OTHERS THEN
        -- The heartbeat must not fail with it (a worker whose heartbeats fail is reaped by the others).
        RAISE WARNING 'pgjobs status stream maintenance failed: % (%)', SQLERRM, SQLSTATE;
    END;
END;
$$;

-- maintenance's history step; the caller holds the stream lock. Never fails the pass it is part of.
CREATE OR REPLACE FUNCTION pgjobs._maintain_history()
RETURNS TABLE (action text, target text, rows bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    BEGIN
        RETURN QUERY SELECT * FROM _premake_slices('200ms');
        RETURN QUERY SELECT * FROM _apply_retention('200ms');
        RETURN QUERY SELECT * FROM _rate_prune();   -- (rate_limits.sql)
    EXCEPTION WHEN OTHERS THEN
        action := 'error'; target := 'history: ' || SQLERRM || ' (' || SQLSTATE || ')'; rows := NULL;
        RETURN NEXT;
    END;
END;
$$;

-- One history maintenance pass for operations (the workers run it inside the stream's pass): makes the
-- slices ahead, applies queue retention; returns what it did. One at a time (the stream lock).
CREATE OR REPLACE FUNCTION pgjobs.maintain_history()
RETURNS TABLE (action text, target text, rows bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    IF NOT pg_try_advisory_xact_lock(_stream_lock()) THEN
        RETURN QUERY SELECT 'busy'::text, 'another maintenance pass holds the lock'::text, NULL::bigint;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM _maintain_history();
END;
$$;

-- Removes terminal jobs older than the given ages (NULL: keep that class). failed_before covers
-- 'failed' and 'cancelled'. Batch members go with their batch, once it is settled and every member is
-- past its age. Whole slices older than the cutoff are dropped; rows are deleted only in the boundary
-- slice and the DEFAULT partitions. Returns the number of jobs removed.
CREATE OR REPLACE FUNCTION pgjobs.purge(succeeded_before interval DEFAULT NULL, failed_before interval DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_n      bigint;
    v_cutoff timestamptz;
    v_slice  record;
    v_tree   text;
BEGIN
    IF succeeded_before < interval '0' OR failed_before < interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('purge ages must not be negative, got succeeded_before=%s, failed_before=%s',
                             succeeded_before, failed_before);
    END IF;
    -- (limits: checks.sql) now() minus 100 million years is out of timestamp range
    PERFORM _check_interval('succeeded_before', succeeded_before, non_negative => true, nullable => true);
    PERFORM _check_interval('failed_before', failed_before, non_negative => true, nullable => true);
    -- Batches first: their members leave the slices, which may then go whole.
    v_n := _purge_batches(succeeded_before, failed_before);
    FOREACH v_tree IN ARRAY ARRAY['succeeded', 'failed'] LOOP
        v_cutoff := now() - CASE v_tree WHEN 'succeeded' THEN succeeded_before ELSE failed_before END;
        CONTINUE WHEN v_cutoff IS NULL;
        FOR v_slice IN
            SELECT p.name, p.upper FROM history_partitions AS p
             WHERE p.tree = v_tree AND (p.lower IS NULL OR p.lower < v_cutoff)
             ORDER BY p.upper
        LOOP
            IF v_slice.upper <= v_cutoff THEN
                -- (rows one by one only when the slice holds a batch member, or its locks did not come in 2 s:
                -- more than deadlock_timeout, after which an autovacuum of the slice gives way)
                v_n := v_n + coalesce(_drop_slice(v_slice.name, '2s'), _purge_slice_rows(v_slice.name, v_cutoff));
            ELSE
                v_n := v_n + _purge_slice_rows(v_slice.name, v_cutoff);  -- the boundary slice
            END IF;
        END LOOP;
        v_n := v_n + _purge_slice_rows('jobs_' || v_tree || '_default', v_cutoff);
    END LOOP;
    RETURN v_n;
END;
$$;
