-- The status stream: a durable, append-only, rotated event log read in order from a cursor.
-- Every status event is written here, by one family: _append_events (the hot paths' one call), _log_events
-- (the same after each queue's status_events setting), _log_event (one job), _notify_status (events as
-- JSON) and _notify_status_rows (events as arrays). The maintenance pass (maintain) is in maintain.sql.
--
-- THE PROBLEM. Event ids must be handed out in an order a reader can follow with one cursor
-- (`event_id > cursor`), yet a sequence hands out ids in call order, not commit order: a job
-- enqueued in a user's long transaction takes id 10, others commit ids 11..50, a reader returns
-- them and moves its cursor to 50; the long transaction commits, and id 10 is never read.
--
-- THE CHOICE: PgQ-style ticks (design (a)), not a watermark (design (b)).
--   (b) makes each event-writing transaction publish a lower bound of its ids, and readers stop
--   below the smallest bound still in flight. Cheap, but "production is hostile": one session that
--   enqueued in a transaction and then sat idle (or a long batch import) stalls delivery for every
--   subscriber until it commits, and the hot path pays an advisory lock per call.
--   (a) costs the hot path one INSERT (no lock, no shared counter) and a long transaction delays
--   only its own events. It was chosen.
--
-- HOW (a) WORKS HERE.
-- * Writers (`_append_events`, called once per transition call by claim/complete_many/enqueue/...)
--   append ONE event_inbox row: arrays of the call's events, the top-level transaction id
--   (pg_current_xact_id(); the same for every subtransaction), and a call-order seq.
-- * The ticker (`_tick_events`; one at a time under the advisory xact lock _STREAM_LOCK; run by
--   read_events and by maintain) reads, in ONE statement, its own snapshot (pg_current_snapshot(),
--   the statement's) and the inbox rows that snapshot sees but the previous tick's did not. Those are
--   exactly the rows of transactions that were in progress at the previous tick (xid in its xip list)
--   or began after it (xid >= its xmax): two index probes on event_inbox(xid), so a session idle in
--   transaction does not make every tick rescan the inbox from the oldest xmin. It gives them final
--   event ids (a block from event_id_seq, in seq order within the tick) and copies them into
--   event_log, and records its snapshot in event_ticks. A later tick can only give higher ids, and
--   it starts after this one committed (the lock is held to commit; each statement of a READ
--   COMMITTED function takes a new snapshot after the lock), so committed ids always form a prefix:
--   a reader never sees id N+1 before id N is readable. Ids are never reused (the sequence is not
--   transactional): a tick that rolls back burns its ids, and the next tick gives those events new,
--   higher ids (a reader inside that rolled-back transaction may see them again: a duplicate, never a
--   loss).
-- * Ids and crashes: see IDS AND CRASHES below (why a tick need not wait for its own WAL flush).
-- * Own transaction: a snapshot does not list the taking transaction's own xid as in progress, so
--   a tick inside a transaction that has an xid (worker_heartbeat's maintenance pass, or a user who
--   enqueued and then read) leaves its own rows out and records its xid as in progress: those rows
--   are ticked after their commit, like anyone's.
-- * read_events ticks before it reads, waiting at most 200 ms for another reader's tick to end: so
--   it returns every event whose transaction committed before the call (unless the lock holder is a
--   transaction left open, which is not waited out).
-- * The ticker needs READ COMMITTED (a new snapshot after taking the lock); read_events under
--   REPEATABLE READ/SERIALIZABLE or in a read-only transaction does not tick, it reads what others
--   ticked (maintain or another reader). read_events ticks only as the first statement of its
--   transaction (autocommit, the usual subscriber: call it so), since the lock is held to commit:
--   a reader that then left its transaction open would hold every other ticker off (maintain
--   reports 'busy' with the holder's pid).
--
-- IDS AND CRASHES (why a tick's commit need not wait for its WAL flush). A reader must never be shown
-- an id that names another event after a crash: a tick whose commit the crash lost (committed, seen,
-- not yet flushed) would let the next tick give its ids to other events, and a follower whose cursor
-- passed them would skip those. Waiting for every tick's flush prevents that but costs each read a
-- flush (the largest part of the delivery time under load). Instead ids come from blocks of a million
-- whose end is on disk before any id of the block is handed out:
-- * event_id_block.hi (logged) is the end of the block reserved last, and event_id_block_live.hi
--   (UNLOGGED) a copy of it. A tick whose ids pass the live end, or that finds no live row, reserves
--   the next block (both rows, once per million ids) and raises its own transaction's
--   synchronous_commit to on (never lowers it: remote_apply stays), so its commit, and with it the new
--   end, is flushed before anyone sees those ids. Every other tick may commit asynchronously (when its
--   session says synchronous_commit = off, as subscribe()'s connection does; other callers keep
--   their flush): every id a reader ever saw is at most event_id_block.hi as it is on disk.
-- * PostgreSQL empties an unlogged table in crash recovery, and it is empty on a promoted standby and
--   in a restored base backup: a tick that finds no live row therefore first moves event_id_seq above
--   event_id_block.hi (the sequence itself may have come back lower: its WAL was not flushed either),
--   then reserves. On a promoted standby (a new WAL timeline) the sequence also moves above
--   _timeline_floor(): an asynchronous standby may lack the old primary's newest block end.
--   The events of the lost ticks are still in the inbox (their writers' commits were
--   flushed as usual) and get new, higher ids: a follower may see them twice, never miss one. (A
--   writer's own asynchronous commit may lose its transition, and with it its event, as before.)
-- * Order is unaffected: ticks still take turns under the lock, each after the previous one's commit
--   is visible; a tick after the crash starts above every id before it. maintain()'s passes commit with
--   a flush (the workers' sessions), and a flush covers every earlier commit: an inbox partition is
--   truncated only when the ticks that moved its rows are on disk.
--
-- WRITE AMPLIFICATION. One inbox row per transition call (a claim of 100 is one row, not 100), one
-- log row per inbox row written by the ticker off the hot path, one tick row per tick that found
-- events. The only updated rows are the two block ends, once per million ids: there is no hot single
-- row a held snapshot could turn into a long HOT chain (tick state, presence and rotation state are
-- all insert-only).
--
-- ROTATION (space comes back by TRUNCATE, never DELETE + VACUUM, so a held snapshot cannot stop it).
-- * event_inbox: 4 partitions picked by the writer's clock (15 s each). `maintain` takes an ACCESS
--   EXCLUSIVE lock (NOWAIT) on each non-current partition, ticks (in a new snapshot: every writer
--   into it has committed or will write after us), then TRUNCATEs it. A partition still locked by a
--   writer's open transaction is skipped until it commits: nothing uncommitted is ever truncated.
-- * event_log / event_ticks: 16 partitions; event_rotations says which one the ticker writes. Every
--   `rotate_every` (default 5 min) maintain moves on to the next partition, first TRUNCATEing it,
--   but only once the rotation that followed its last use started `retention` ago (default 1 hour):
--   an event stays readable at least `retention` after it was ticked. When the ring is too short
--   for the retention, rotation waits (the current partition grows) rather than drop retained
--   events. A reader holding the partition is waited for at most 200 ms (lock_timeout), then the
--   rotation is retried on the next pass.
-- * A cursor older than the oldest retained event reads from the oldest retained event
--   (stream_bounds() gives the oldest and newest ids, stream_head() the newest alone).
--
-- FILTERS. read_events' job_ids and batch_id select jobs (either matches); queue narrows further.
-- GIN indexes on the log's ids and batch_ids arrays find a watched job's rows without
-- scanning the events of other jobs; the unfiltered and queue-only reads walk event_log(last_id)
-- in order and stop after max_rows events.
--
-- THE HINT. `pgjobs_status` NOTIFY carries only {"event_id": N} (the newest id the sender knows;
-- "pending": true when sent by a writer whose own events get their ids at the next tick): any role
-- can LISTEN, so it says nothing about jobs, and a notification is never a fact (readers read
-- read_events). A notifying commit takes NOTIFY's cluster-wide lock and holds it through its WAL
-- flush, so every writer that notifies serialises its commit with all others: writers notify only
-- when a follower is WAITING for a hint. Each read_events call (in a transaction that may tick)
-- leaves a mark in stream_followers, insert-only and only when it changes or is 5 s from expiring:
-- armed when the read found nothing (the follower now waits for a hint), disarmed when it found
-- events (a follower reads again by itself after a read that returned events: subscribe() does so
-- at once, at most one read started every 4 ms, until a read comes back empty). A writer probes the
-- newest mark with one index descent per call. So with no follower, or a busy one (under load),
-- claim and complete_many send no NOTIFY and never take the lock; an idle follower is woken by the
-- first writer, and a writing transaction hints at most once (a transaction-local flag: NOTIFY
-- folds only identical texts, and a tick between two of its appends changes the text). A reader
-- that ticked events also hints (from its own transaction, off the hot path) so that other
-- followers, whose marks the busy one overwrote, hear of them. Marks last 10 s (a follower calls
-- read_events at least every few seconds). pgjobs_wake is not affected.
--
-- DELIVERY TIME (commit -> a follower's receipt). A busy follower reads back to back, so an event
-- waits for the read in progress, then a whole read: about 1.5 reads. A read ticks; subscribe()'s
-- connection says synchronous_commit = off, so only the tick that reserves a block of ids waits for
-- its WAL flush (IDS AND CRASHES), and the tick finds its inbox rows by index instead of scanning the
-- current inbox partition. `at` is the writer's now(), its transaction's start: receipt - at also
-- counts the writer's statement and commit, so bench/stream.py measures from a probe enqueue's commit.
-- What is left on a loaded machine is mostly CPU: each round trip waits for the follower's process and
-- its backend to be scheduled.
-- COST. One append is one INSERT and one index probe for a waiting follower; with no follower, or a
-- busy one, a writer sends no NOTIFY, so no commit is serialised through NOTIFY's cluster-wide lock.
-- A held snapshot leaves event_inbox, event_ticks and event_log without dead tuples: they are
-- insert-only and given back by TRUNCATE.
-- THE P99: GIN PENDING LISTS. A GIN index keeps new entries in a pending list, and the insert that
-- takes the list past gin_pending_list_limit (4 MB by default) merges all of it into the index: a
-- tick's INSERT into event_log would stall a read for hundreds of milliseconds, with every event
-- committed meanwhile arriving together behind it. Autovacuum would empty the lists, but it never runs
-- on an insert-only table and is off on some servers. The event_log baseline sets a 128 kB list on
-- every log partition's GIN index, so a merge is small; tests/sql/test_events.py holds the list to
-- its limit.
-- ONE PARTITION NEAR THE HEAD. Setting up a scan of every log partition is a large part of a short
-- read's cost, so the read takes only the current partition when the cursor is in it, the tick looks
-- for the newest tick there first, and a subscriber asks stream_head() (the newest id alone) rather
-- than stream_bounds().

-- The advisory lock of the ticker and of maintenance ("pgjobs" + 1).
CREATE OR REPLACE FUNCTION pgjobs._stream_lock()
RETURNS bigint
LANGUAGE sql
IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT 123712594846324::bigint;
$$;

-- The hot paths' one call per transition call: appends the events as one inbox row and, when
-- someone follows the stream, sends the hint. No filtering here (see _log_events). Only
-- search_path is pinned: each SET clause of a function costs a GUC save and restore per call,
-- a third of this function's cost with three of them (its one statement plans generically anyway).
CREATE OR REPLACE FUNCTION pgjobs._append_events(ids bigint[], states pgjobs.job_state[], queues text[], kinds text[],
                                                 attempts int[], batch_ids bigint[], progress jsonb[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF ids IS NULL OR cardinality(ids) = 0 THEN
        RETURN;
    END IF;
    -- The partition is chosen by the transaction's clock; a straggler whose transaction started in
    -- an older slot writes there, which is safe (maintain never truncates what it cannot lock).
    INSERT INTO event_inbox (slot, xid, at, ids, states, queues, kinds, attempts, batch_ids, progress)
    VALUES ((floor(extract(epoch FROM now()) / 15)::bigint % 4)::smallint, pg_current_xact_id(), now(),
            _append_events.ids, _append_events.states, _append_events.queues, _append_events.kinds,
            _append_events.attempts, _append_events.batch_ids, _append_events.progress);
    -- One index descent to the newest follower mark: no follower waiting, no NOTIFY (and no commit
    -- lock). A follower that is reading (it got events last time) comes back by itself.
    IF (SELECT f.armed FROM stream_followers AS f WHERE f.until > statement_timestamp()
         ORDER BY f.until DESC LIMIT 1) THEN
        -- At most one hint per transaction: its commit delivers all of its events at once. (NOTIFY
        -- folds only identical texts, and a tick between two appends changes the text. The flag is
        -- transaction-local; a rolled-back subtransaction takes it back together with its NOTIFY.)
        IF current_setting('pgjobs.status_hinted', true) IS DISTINCT FROM 'on' THEN
            PERFORM set_config('pgjobs.status_hinted', 'on', true);
            PERFORM pg_notify('pgjobs_status', '{"event_id": '
                              || coalesce(pg_sequence_last_value('pgjobs.event_id_seq'), 0) || ', "pending": true}');
        END IF;
    END IF;
END;
$$;

-- _append_events after each queue's status_events setting: 'all' (the default) logs every event,
-- 'terminal' only succeeded/failed/cancelled, 'none' nothing. Order is kept.
CREATE OR REPLACE FUNCTION pgjobs._log_events(ids bigint[], states pgjobs.job_state[], queues text[], kinds text[],
                                              attempts int[], batch_ids bigint[], progress jsonb[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_none     text[];
    v_terminal text[];
    v_ids      bigint[];
    v_states   job_state[];
    v_queues   text[];
    v_kinds    text[];
    v_attempts int[];
    v_batches  bigint[];
    v_progress jsonb[];
BEGIN
    IF ids IS NULL OR cardinality(ids) = 0 THEN
        RETURN;
    END IF;
    SELECT array_agg(q.queue) FILTER (WHERE q.status_events = 'none'),
           array_agg(q.queue) FILTER (WHERE q.status_events = 'terminal')
      INTO v_none, v_terminal
      FROM queues AS q
     WHERE q.status_events <> 'all' AND q.queue = ANY (_log_events.queues);
    IF v_none IS NULL AND v_terminal IS NULL AND array_position(ids, NULL) IS NULL THEN
        -- Usually: every queue logs everything.
        PERFORM _append_events(ids, states, queues, kinds, attempts, batch_ids, progress);
        RETURN;
    END IF;
    SELECT array_agg(u.id ORDER BY u.n), array_agg(u.state ORDER BY u.n), array_agg(u.queue ORDER BY u.n),
           array_agg(u.kind ORDER BY u.n), array_agg(u.attempt ORDER BY u.n), array_agg(u.batch_id ORDER BY u.n),
           CASE WHEN _log_events.progress IS NOT NULL THEN array_agg(u.progress ORDER BY u.n) END
      INTO v_ids, v_states, v_queues, v_kinds, v_attempts, v_batches, v_progress
      FROM unnest(ids, states, queues, kinds, attempts, batch_ids,
                  coalesce(_log_events.progress, array_fill(NULL::jsonb, ARRAY[cardinality(ids)])))
           WITH ORDINALITY AS u(id, state, queue, kind, attempt, batch_id, progress, n)
     WHERE u.id IS NOT NULL
       AND (v_none IS NULL OR u.queue <> ALL (v_none))
       AND (v_terminal IS NULL OR u.queue <> ALL (v_terminal) OR u.state IN ('succeeded', 'failed', 'cancelled'));
    PERFORM _append_events(v_ids, v_states, v_queues, v_kinds, v_attempts, v_batches, v_progress);
END;
$$;

-- One event (the single-job transitions).
CREATE OR REPLACE FUNCTION pgjobs._log_event(id bigint, state pgjobs.job_state, queue text, kind text, attempt int,
                                             batch_id bigint, progress jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_mode text;
BEGIN
    IF id IS NULL THEN
        RETURN;
    END IF;
    SELECT q.status_events INTO v_mode FROM queues AS q WHERE q.queue = _log_event.queue;
    IF v_mode IS NULL OR v_mode = 'all' OR (v_mode = 'terminal' AND state IN ('succeeded', 'failed', 'cancelled')) THEN
        PERFORM _append_events(ARRAY[id], ARRAY[state], ARRAY[queue], ARRAY[kind], ARRAY[attempt], ARRAY[batch_id],
                               CASE WHEN progress IS NOT NULL THEN ARRAY[progress] END);
    END IF;
END;
$$;

-- One tick (see the header). The caller holds the advisory xact lock _stream_lock() and runs
-- under READ COMMITTED. `force` records a tick even when no event became visible (maintain does,
-- so the newest tick is never in a partition that rotation truncates). Returns how many events
-- got ids and the newest id.
-- enable_seqscan off: the inbox partitions are TRUNCATEd every minute, so they never have statistics,
-- and with none the planner takes `xid >= $1` to match a third of the rows and scans the whole
-- current partition on every tick (up to 15 s of every writer's rows; its detoasted pg_snapshot on
-- each row): the largest CPU cost of a follower's read under load, growing with the load. The
-- index finds the few rows a tick takes; a seq scan stays possible where there is no index.
-- Generic plans: a custom plan of the one statement (two scans of the four inbox partitions and an insert
-- routed into the log's sixteen) was made anew on every call, and was two thirds of an empty tick's
-- 264 us (80 us now; a busy follower ticks up to 250 times a second).
CREATE OR REPLACE FUNCTION pgjobs._tick_events(force boolean DEFAULT false, OUT events bigint, OUT newest bigint)
RETURNS record
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET jit = off
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_prev pg_snapshot;
    v_xip  xid8[];
    v_slot smallint;
    v_own  xid8 := pg_current_xact_id_if_assigned();
    v_cur  pg_snapshot;
    v_base bigint;
    v_hi   bigint;
BEGIN
    SELECT r.slot INTO v_slot FROM event_rotations AS r ORDER BY r.rotation_id DESC LIMIT 1;
    -- The newest tick is in the current slot when that has one: ticks and rotations take turns under the
    -- stream lock, and a rotation empties its partition before the first tick into it. One partition's
    -- index, not a merge of sixteen (the set-up of fifteen empty or old scans on every read).
    SELECT t.snap, t.last_id INTO v_prev, newest FROM event_ticks AS t WHERE t.slot = v_slot
     ORDER BY t.tick_id DESC LIMIT 1;
    IF v_prev IS NULL THEN
        SELECT t.snap, t.last_id INTO v_prev, newest FROM event_ticks AS t ORDER BY t.tick_id DESC LIMIT 1;
    END IF;
    IF v_prev IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ003', MESSAGE = 'the status stream has no tick: run pgjobs migrate';
    END IF;
    -- The block this tick may hand ids from without a flush of its own (header, "IDS AND CRASHES").
    SELECT b.hi INTO v_hi FROM event_id_block_live AS b;
    IF v_hi IS NULL THEN
        -- No live block: a crash (or a failover, or a restored backup) emptied it, or none was reserved
        -- yet. Ticks whose commits the crash lost may have shown readers ids up to the last reserved end,
        -- and event_id_seq may have come back below them (its WAL was not flushed): start above that end.
        -- After a promotion (a new timeline), also above the timeline's own range: an asynchronous standby
        -- may lack the old primary's last block reservation, whose ids followers may have read.
        SELECT greatest(b.hi, _timeline_floor()) INTO v_base FROM event_id_block AS b;
        IF v_base > coalesce(pg_sequence_last_value('pgjobs.event_id_seq'), 0) THEN
            PERFORM setval('pgjobs.event_id_seq', v_base);
        END IF;
    END IF;
    v_xip := ARRAY(SELECT pg_snapshot_xip(v_prev));
    -- ONE statement: the snapshot recorded is the one the inbox is read with.
    WITH s AS MATERIALIZED (
        SELECT pg_current_snapshot() AS cur
    ), c AS MATERIALIZED (
        SELECT r.seq, r.at, r.ids, r.states, r.queues, r.kinds, r.attempts, r.batch_ids, r.progress,
               sum(cardinality(r.ids)) OVER (ORDER BY r.seq) AS upto
          FROM (SELECT i.* FROM event_inbox AS i WHERE i.xid = ANY (v_xip)
                UNION ALL
                SELECT i.* FROM event_inbox AS i WHERE i.xid >= pg_snapshot_xmax(v_prev)) AS r, s
         WHERE pg_visible_in_snapshot(r.xid, s.cur)
           AND r.xid IS DISTINCT FROM v_own
    ), b AS MATERIALIZED (
        SELECT CASE WHEN EXISTS (SELECT 1 FROM c) THEN nextval('pgjobs.event_id_seq') END AS base
    ), ins AS (
        INSERT INTO event_log (slot, first_id, last_id, at, ids, states, queues, kinds, attempts, batch_ids, progress)
        SELECT v_slot, b.base + c.upto - cardinality(c.ids), b.base + c.upto - 1, c.at, c.ids, c.states, c.queues,
               c.kinds, c.attempts, c.batch_ids, c.progress
          FROM c, b
    )
    SELECT s.cur, b.base, (SELECT max(c.upto) FROM c) INTO v_cur, v_base, events FROM s, b;
    events := coalesce(events, 0);
    IF events > 0 THEN
        newest := v_base + events - 1;
        -- The block base .. newest is ours: the next tick's nextval starts after it.
        PERFORM setval('pgjobs.event_id_seq', newest);
        IF v_hi IS NULL OR newest > v_hi THEN
            -- Reserve the next million ids, and make this commit wait for its WAL flush (stronger, never
            -- weaker, than the caller's setting): the new end is on disk before any id up to it is read.
            v_hi := newest + 1000000;
            INSERT INTO event_id_block AS b (hi) VALUES (v_hi)
                ON CONFLICT (singleton) DO UPDATE SET hi = excluded.hi;
            INSERT INTO event_id_block_live AS b (hi) VALUES (v_hi)
                ON CONFLICT (singleton) DO UPDATE SET hi = excluded.hi;
            IF current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
                PERFORM set_config('synchronous_commit', 'on', true);
            END IF;
        END IF;
    END IF;
    IF v_own IS NOT NULL AND pg_visible_in_snapshot(v_own, v_cur) THEN
        -- Our own rows were left out: record our transaction as in progress, so the tick after our
        -- commit takes them.
        v_cur := (least(pg_snapshot_xmin(v_cur), v_own)::text || ':' || pg_snapshot_xmax(v_cur)::text || ':'
                  || (SELECT string_agg(x::text, ',' ORDER BY x)
                        FROM (SELECT pg_snapshot_xip(v_cur) UNION SELECT v_own) AS u(x)))::pg_snapshot;
    END IF;
    IF events > 0 OR force THEN
        INSERT INTO event_ticks (slot, snap, last_id) VALUES (v_slot, v_cur, newest);
    END IF;
END;
$$;

-- The lowest event id of the server's WAL timeline: (timeline - 1) * 2^44. A standby's promotion starts a new
-- timeline, and with it event ids above anything the old primary could have handed out (17.6 trillion ids a
-- timeline), even when the old primary's last block reservation never reached that standby (asynchronous
-- replication). On timeline 1 (a server never promoted) it is 0.
CREATE OR REPLACE FUNCTION pgjobs._timeline_floor()
RETURNS bigint
LANGUAGE sql
VOLATILE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT (('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1) << 44;
$$;

-- Whether this call may tick: READ COMMITTED, writable, and its transaction began just now (the
-- call is its first statement: autocommit, or the first query after BEGIN). The ticker lock is
-- held to commit, so a reader deep in a long transaction must not take it. (PL/pgSQL: called twice
-- per read_events, and a SQL function with a SET clause is planned anew on every call.)
CREATE OR REPLACE FUNCTION pgjobs._may_tick()
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN current_setting('transaction_isolation') = 'read committed'
           AND current_setting('transaction_read_only') = 'off'
           AND statement_timestamp() - transaction_timestamp() < interval '50 milliseconds'
           AND NOT pg_is_in_recovery();
END;
$$;

-- The contract's reader. Ticks first when it may (so a follower sees what committed up to now),
-- renews the "someone follows" mark, then returns up to max_rows events after after_id in event_id
-- order. job_ids and batch_id select jobs (either matches); queue narrows.
-- (A SQL wrapper: PL/pgSQL refuses an output column named like a parameter, and the contract
-- names both queue and batch_id.)
CREATE OR REPLACE FUNCTION pgjobs.read_events(after_id bigint DEFAULT 0, max_rows int DEFAULT 1000,
                                              queue text DEFAULT NULL, job_ids bigint[] DEFAULT NULL,
                                              batch_id bigint DEFAULT NULL)
RETURNS TABLE (event_id bigint, at timestamptz, id bigint, state pgjobs.job_state, queue text, kind text,
               attempt int, batch_id bigint, progress jsonb)
LANGUAGE sql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT * FROM pgjobs._read_events($1, $2, $3, $4, $5);
$$;

CREATE OR REPLACE FUNCTION pgjobs._read_events(after_id bigint, max_rows int, in_queue text, job_ids bigint[],
                                               in_batch bigint)
RETURNS TABLE (o_event_id bigint, o_at timestamptz, o_id bigint, o_state pgjobs.job_state, o_queue text,
               o_kind text, o_attempt int, o_batch_id bigint, o_progress jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET jit = off
-- Generic plans: a custom plan of the ordered read over the 16 log partitions was planned anew on every
-- call (the planner was 20-38 % of a busy follower's backend, perf). An empty read 650 -> 470 us; reads of
-- 1,000 events 1.58 -> 1.35 ms from the start, by job ids 3.47 -> 3.35 ms, near the head the same.
SET plan_cache_mode = force_generic_plan
-- No sequential scan of a log partition: on a partition never analysed the generic plan read every row after
-- the cursor, unnested every event of them and sorted them all for one page, O(the backlog) a page (pages
-- of 1,000 through 150,000 events in rows of up to 5,000: 7.1-7.7 s of backend time, 0.54-0.55 s now).
-- The ordered walk of event_log(last_id) stops after the page's rows (1.3 ms a page instead of 60).
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_after bigint := _read_events.after_id;
    v_tick  record;
    v_n     bigint;
    v_lo    smallint := 0;   -- the log partitions read: all sixteen, or only the current one
    v_hi    smallint := 15;
BEGIN
    IF v_after IS NULL OR v_after < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('after_id must be 0 or an event_id, got %s', coalesce(v_after::text, 'NULL'));
    ELSIF max_rows IS NULL OR max_rows < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('max_rows must be at least 1, got %s', coalesce(max_rows::text, 'NULL'));
    ELSIF in_queue = '' THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = 'queue must not be empty (NULL reads every queue)';
    END IF;
    IF _may_tick() THEN
        IF pg_try_advisory_xact_lock(_stream_lock()) OR _wait_stream_lock() THEN
            v_tick := _tick_events(false);
            IF v_tick.events > 0 AND EXISTS (SELECT 1 FROM stream_followers AS f WHERE f.until > statement_timestamp()) THEN
                -- Tells the other followers (whose own try-lock failed while we ticked).
                PERFORM pg_notify('pgjobs_status', '{"event_id": ' || v_tick.newest || '}');
            END IF;
        END IF;
    END IF;

    -- Near the head (a live follower's every read) every event after the cursor is in the partition the
    -- ticker writes now: once its oldest row starts at most one past the cursor, nothing older can be
    -- after it (a rotation empties a partition before the first tick into it, and a partition is not
    -- emptied again before the ring comes round). Then only that partition is read: the generic plan
    -- prunes the other fifteen at start-up, sparing their index descents and executor set-up.
    SELECT r.slot INTO v_lo FROM event_rotations AS r ORDER BY r.rotation_id DESC LIMIT 1;
    -- (first_id - 1, not v_after + 1: a cursor at the largest bigint must not overflow)
    IF (SELECT l.first_id FROM event_log AS l WHERE l.slot = v_lo ORDER BY l.last_id LIMIT 1) - 1 <= v_after THEN
        v_hi := v_lo;
    ELSE
        v_lo := 0;
    END IF;

    IF job_ids IS NULL AND in_batch IS NULL THEN
        -- In order along event_log(last_id), stopping after max_rows events.
        RETURN QUERY
        SELECT l.first_id + u.o - 1, l.at, u.id, u.state, u.queue, u.kind, u.attempt, u.batch_id, u.progress
          FROM event_log AS l
         CROSS JOIN LATERAL unnest(l.ids, l.states, l.queues, l.kinds, l.attempts, l.batch_ids, l.progress)
               WITH ORDINALITY AS u(id, state, queue, kind, attempt, batch_id, progress, o)
         WHERE l.slot BETWEEN v_lo AND v_hi AND l.last_id > v_after AND l.first_id + u.o - 1 > v_after
           AND (in_queue IS NULL OR u.queue = in_queue)
         ORDER BY l.last_id, u.o
         LIMIT max_rows;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        PERFORM _mark_follower(v_n = 0);
        RETURN;
    END IF;
    -- Watched jobs or a batch: their rows by the GIN indexes, then their events.
    RETURN QUERY
    SELECT l.first_id + u.o - 1, l.at, u.id, u.state, u.queue, u.kind, u.attempt, u.batch_id, u.progress
      FROM event_log AS l
     CROSS JOIN LATERAL unnest(l.ids, l.states, l.queues, l.kinds, l.attempts, l.batch_ids, l.progress)
           WITH ORDINALITY AS u(id, state, queue, kind, attempt, batch_id, progress, o)
     WHERE l.slot BETWEEN v_lo AND v_hi AND l.last_id > v_after
       AND (l.ids && coalesce(job_ids, '{}') OR l.batch_ids @> ARRAY[coalesce(in_batch, 0)])
       AND l.first_id + u.o - 1 > v_after
       AND (u.id = ANY (job_ids) OR u.batch_id = in_batch)
       AND (in_queue IS NULL OR u.queue = in_queue)
     ORDER BY l.last_id, u.o
     LIMIT max_rows;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    PERFORM _mark_follower(v_n = 0);
END;
$$;

-- The stream lock, waited for at most 200 ms: another reader's tick is short, and after it ours
-- returns everything committed before this call. A holder that stays longer (a reader's open
-- transaction) is not waited out: the call then reads what is already ticked.
CREATE OR REPLACE FUNCTION pgjobs._wait_stream_lock()
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET jit = off
AS $$
DECLARE
    v_timeout text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout', '200ms', true);
    PERFORM pg_advisory_xact_lock(_stream_lock());
    PERFORM set_config('lock_timeout', v_timeout, true);
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    PERFORM set_config('lock_timeout', v_timeout, true);
    RETURN false;
END;
$$;

-- The follower mark (see the header): a read that found nothing means its caller now waits for a
-- hint (armed); one that found events means it reads again by itself (writers need not hint). A
-- mark lasts 10 s and is renewed when it has less than 5 s left; only a change or a renewal
-- inserts a row. Not in a transaction that may not tick (read-only, or not its first statement).
CREATE OR REPLACE FUNCTION pgjobs._mark_follower(armed boolean)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    v_mark stream_followers;
BEGIN
    IF NOT _may_tick() THEN
        RETURN;
    END IF;
    SELECT * INTO v_mark FROM stream_followers AS f ORDER BY f.until DESC LIMIT 1;
    IF v_mark.until IS NULL OR v_mark.until < clock_timestamp() + interval '5 seconds'
       OR v_mark.armed IS DISTINCT FROM _mark_follower.armed THEN
        INSERT INTO stream_followers (until, armed) VALUES (clock_timestamp() + interval '10 seconds', _mark_follower.armed);
    END IF;
END;
$$;

-- The newest event id (NULL when the log is empty): what a subscriber reads on every read (with
-- read_events, in the same statement: STABLE, so it sees that statement's snapshot, taken before
-- read_events ticks), so it is PL/pgSQL: its plans are kept, where a SQL function's are made again on
-- every call. One partition's index: the newest is in the partition the ticker writes now, unless
-- nothing was ticked since the last rotation (ticks and rotations take turns under the stream lock,
-- and a rotation empties its partition before the first tick into it, so every row there is newer
-- than the rest of the log).
CREATE OR REPLACE FUNCTION pgjobs.stream_head(OUT newest_id bigint)
RETURNS bigint
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pgjobs, pg_temp
SET jit = off
SET plan_cache_mode = force_generic_plan  -- as _read_events: a custom plan would be made on every call
AS $$
DECLARE
    v_slot smallint;
BEGIN
    SELECT r.slot INTO v_slot FROM event_rotations AS r ORDER BY r.rotation_id DESC LIMIT 1;
    SELECT l.last_id INTO newest_id FROM event_log AS l WHERE l.slot = v_slot ORDER BY l.last_id DESC LIMIT 1;
    IF newest_id IS NULL THEN
        SELECT l.last_id INTO newest_id FROM event_log AS l ORDER BY l.last_id DESC LIMIT 1;
    END IF;
END;
$$;

-- The oldest and newest retained event ids (NULL, NULL when the log is empty). A cursor below
-- oldest_id has lost the events in between to retention. (A follower needs only the newest:
-- stream_head, which spares the oldest's merge over the sixteen partitions.)
CREATE OR REPLACE FUNCTION pgjobs.stream_bounds(OUT oldest_id bigint, OUT newest_id bigint)
RETURNS record
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pgjobs, pg_temp
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    newest_id := stream_head();
    SELECT l.first_id INTO oldest_id FROM event_log AS l ORDER BY l.last_id LIMIT 1;
END;
$$;

-- Retention and rotation period of the event log; NULL leaves a setting as it is. Returns the
-- settings now in force, as {"retention": ..., "rotate_every": ...}.
CREATE OR REPLACE FUNCTION pgjobs.configure_stream(retention interval DEFAULT NULL, rotate_every interval DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_row jsonb;
BEGIN
    -- (upper bounds too: timestamps must stay computable from now() minus either)
    IF configure_stream.retention IS NOT NULL
       AND (configure_stream.retention < interval '1 minute' OR configure_stream.retention > interval '10 years') THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('retention must be between 1 minute and 10 years, got %s', configure_stream.retention);
    ELSIF configure_stream.rotate_every IS NOT NULL
          AND (configure_stream.rotate_every < interval '1 second' OR configure_stream.rotate_every > interval '1 year') THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('rotate_every must be between 1 second and 1 year, got %s', configure_stream.rotate_every);
    END IF;
    UPDATE stream_settings AS s
       SET retention = coalesce(configure_stream.retention, s.retention),
           rotate_every = coalesce(configure_stream.rotate_every, s.rotate_every)
    RETURNING jsonb_build_object('retention', s.retention, 'rotate_every', s.rotate_every) INTO v_row;
    RETURN v_row;
END;
$$;

-- The durable re-read of known jobs' current state (the subscriber's starting point).
-- Returns the jobs in job_ids, plus the members of batch in_batch (only the live ones when live_only).
CREATE OR REPLACE FUNCTION pgjobs.status_snapshot(job_ids bigint[] DEFAULT NULL, in_batch bigint DEFAULT NULL,
                                                  live_only boolean DEFAULT false)
RETURNS TABLE (id bigint, state pgjobs.job_state, queue text, kind text, attempt int, batch_id bigint,
               progress jsonb)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT j.id, j.state, j.queue, j.kind, j.attempt, j.batch_id, j.progress
      FROM jobs AS j
     WHERE j.id = ANY (status_snapshot.job_ids)
        OR (j.batch_id = status_snapshot.in_batch
            AND (NOT status_snapshot.live_only OR j.state IN ('waiting', 'scheduled', 'pending', 'active')))
     ORDER BY j.id;
$$;

-- The status events of the colder paths (cancel, retry, fail, graph and batch settlement), as a
-- JSON array of {"id","state","queue","kind","attempt","batch_id"[, "progress"]} objects: logged
-- in the order given, after each queue's status_events setting (see _log_events above).
CREATE OR REPLACE FUNCTION pgjobs._notify_status(events jsonb)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    v record;
BEGIN
    IF events IS NULL OR jsonb_array_length(events) = 0 THEN
        RETURN;
    END IF;
    SELECT array_agg((x.e ->> 'id')::bigint ORDER BY x.n) AS ids,
           array_agg((x.e ->> 'state')::job_state ORDER BY x.n) AS states,
           array_agg(x.e ->> 'queue' ORDER BY x.n) AS queues,
           array_agg(x.e ->> 'kind' ORDER BY x.n) AS kinds,
           array_agg(coalesce((x.e ->> 'attempt')::int, 0) ORDER BY x.n) AS attempts,
           array_agg((x.e ->> 'batch_id')::bigint ORDER BY x.n) AS batch_ids,
           CASE WHEN bool_or(x.e ? 'progress') THEN array_agg(x.e -> 'progress' ORDER BY x.n) END AS progress
      INTO v
      FROM jsonb_array_elements(events) WITH ORDINALITY AS x(e, n);
    PERFORM _log_events(v.ids, v.states, v.queues, v.kinds, v.attempts, v.batch_ids, v.progress);
END;
$$;

-- The same from parallel arrays (the columns a transition's RETURNING gives).
CREATE OR REPLACE FUNCTION pgjobs._notify_status_rows(ids bigint[], states pgjobs.job_state[], queues text[],
                                                      kinds text[], attempts int[], batch_ids bigint[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    PERFORM _log_events(ids, states, queues, kinds, attempts, batch_ids);
END;
$$;
