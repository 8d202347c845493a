-- Job history: live jobs apart from finished ones, finished jobs in time slices (the storage is made by
-- ../migrations/deploy/job_history.sql, whose header shows the partition tree).
--
-- THE PROBLEM. Every job is one INSERT and two in-place UPDATEs of pgjobs.jobs, and finished
-- rows stayed in that hot table until purge, a row-by-row DELETE (more dead tuples, O(rows)): in 2-minute
-- cells at 3.2k-6.9k jobs/s n_dead_tup peaked at ~2 per completed job, the table reached 243-459 MB and
-- jobs_pkey's leaf density fell from 86 % to 61 %.
--
-- THE LAYOUT. pgjobs.jobs is partitioned by state: jobs_live (waiting, scheduled, pending, active) and two
-- history trees, jobs_succeeded and jobs_failed (failed, cancelled: purge's failed_before covers both),
-- each partitioned by RANGE (completed_at) in slices of history_settings.slice (1 day) plus a DEFAULT
-- partition, so no insert ever fails. A terminal UPDATE moves the row (PostgreSQL deletes it from
-- jobs_live and inserts it into its slice): jobs_live holds live rows only, its indexes stay small, and
-- a slice is insert-only until it goes whole. Outside readers keep reading and updating pgjobs.jobs.
--
-- WHAT PARTITIONING TAKES AWAY, AND WHAT REPLACES IT.
-- * Unique keys: a unique index on a partitioned table must contain the partition key, so
--   jobs_unique_key_idx became the table job_keys (kind, unique_key) PRIMARY KEY -> job_id, written
--   only for jobs that carry a key. Its primary key decides enqueue races exactly as the index did
--   (the loser waits on the winner's uncommitted key, then finds it taken), across live and finished
--   jobs. A unique_live_only key is given back when its job ends (trigger jobs_release_key on both history
--   trees: it fires on the row's move, whichever function ended the job), retry takes it again, and every
--   key goes when its job is deleted or purged.
-- * Foreign keys to jobs(id) (edges both ends, continuation_holds both ends, ON DELETE CASCADE): gone;
--   every function that deletes jobs calls _forget_jobs (or _forget_slice) for what the cascade did.
-- * jobs_pkey stays on jobs_live; history slices have a plain index on id. Ids stay unique: the
--   identity sequence hands each out once.
--
-- ROW MOVEMENT. In READ COMMITTED a statement that locks a row which another transaction MOVED to
-- another partition (a terminal transition, or retry moving it back) gets SQLSTATE 40001 ("tuple to be
-- locked was already moved to another partition due to concurrent update") instead of re-checking the
-- row: when it waited on the mover's lock, and also under SKIP LOCKED when the move committed after its
-- snapshot. Every such statement handles it, in READ COMMITTED only (under REPEATABLE READ a 40001 is the
-- caller's to retry, as it always was), with an EXCEPTION WHEN serialization_failure block that asks
-- _lost_race (_lost_race_on_token for lease-token calls), the one retry policy, whether to run again:
--   * lease-token calls (complete, fail, dead_letter, release, ack_cancel, progress, checkpoint): when the
--     row left jobs_live the token no longer holds it: false/NULL; when it is still held (a 40001 of another
--     cause), the statement again. renew_lease and add_to_batch answer false/NULL;
--   * complete_many, renew_leases, claim (a wrapper here around claim.sql's _claim_once): the statement
--     again (the moved job is not active any more; claim's next try starts from the same floor);
--     renew_leases SKIPs LOCKED rows (a job being completed needs no renewal; it reports them busy:
--     renewed = false);
--   * complete_many also runs without sequential scans: on a small table without statistics its generic
--     plan read jobs_live as the join's outer side and locked rows out of id order (a deadlock with
--     cancel_batch, tests/runtime/test_lease_races.py);
--   * cancel_batch (its running members) and a fan-in enqueue (its parents) lock row by row in id order
--     after one lost race (_lock_jobs_in_turn, races.sql), each lock kept: the call gets through;
--   * admin paths and cascades (cancel, retry, delete, cancel_batch, reap_workers, deregister_worker,
--     _propagate's children, _graph_lock_parents, _graph_link's holders): the call or statement again.
-- Each block is a subtransaction (one per call, not per row); tests/sql/test_history.py races them.
--
-- PLANS. The hot statements by id (complete, complete_many, fail, renew, release, ...) carry
-- `state = ANY ('{waiting,scheduled,pending,active}')`, a constant that prunes them to jobs_live at plan
-- time under plan_cache_mode = force_generic_plan (a parameter could prune only at run time, after every
-- slice was locked). The claim's state predicates are constants already.
--
-- RETENTION costs O(slices), not O(rows): purge(succeeded_before, failed_before) (maintain.sql) drops each
-- slice whose whole range is older than its tree's cutoff (DROP TABLE: its space comes back at once, no dead
-- tuples), and deletes rows only in the boundary slice and the DEFAULT partition. Batch members go with
-- their batch (_purge_batches, first); a slice that still holds members of a batch that must stay is
-- emptied of everything else row by row and dropped later. The per-queue setting queues.retention
-- (configure_queue(retention => ...), NULL keeps) is applied by maintenance at slice granularity: the
-- rows of queue q in slice S go once S.upper + retention(q) has passed (a slice keeps its rows at most one
-- slice longer than asked); a slice all of whose queues are past their retention is dropped whole, else
-- the expired queues' rows are deleted from it. Which queues a slice holds is read once per slice and
-- settings change (history_partitions.checked_at, next_check_at).
--
-- MEASURED (this 2-core machine, shared with other work: same-run comparisons with main, alternating).
-- * purge of 200,000 succeeded jobs completed two days before (plus 1,000 live), purge(succeeded_before =>
--   '1 minute'): main 4.2-8.0 s, 65-177 MB of WAL, 200,000 dead tuples left and the table still 40 MB;
--   here 0.20-0.24 s, 1.7-3.7 MB of WAL, no dead tuple, 0.6 MB left (the slice is gone).
-- * bench soak, 3 minutes offered 3,000 jobs/s, one worker process at concurrency 50: jobs_live ended with
--   1.08 M dead tuples (2.0 per completed job: the claimed version and the moved one; autovacuum did not
--   get to it in those 3 minutes on this shared server, nor to main's table) and 1,650 live rows, while
--   history (jobs_succeeded, 539 k rows, 93 MB) had none. Dead tuples per job are not fewer (a move is a
--   delete): what changes is that jobs_live holds no finished row, so once vacuumed it is as small as the
--   backlog, and that history never needs a VACUUM nor a row-by-row DELETE.
-- * throughput, alternating with main on fresh databases, 7 rounds: worker (1 process, concurrency 50,
--   20,000 no-op jobs) median 15,420 vs 15,357 jobs/s (x1.00; rounds 0.73-1.65); claim 100 +
--   complete_many on one connection, 60,000 jobs, median 14,010 vs 11,268 jobs/s (x1.24; rounds
--   0.83-2.76); afterwards jobs_live is 24 MB against main's jobs 34 MB. The row moves, the prune
--   constants and the subtransactions of the 40001 handlers cost no measurable throughput here.
--
-- MAINTENANCE needs no scheduler: _maintain_history runs inside the status stream's maintenance pass
-- (maintain.sql _maintain: from the workers' heartbeats, one pass at a time under its advisory lock, at most
-- every 5 s; `pgjobs maintain` for operations), and maintain_history() alone. It makes the slices ahead
-- (history_settings.premake, 3) and applies queue retention. Its DDL waits at most 200 ms for a lock
-- (ATTACH takes SHARE UPDATE EXCLUSIVE on the tree, DROP an ACCESS EXCLUSIVE one: a completion routed
-- into that tree waits that long at worst), else it is retried on the next pass.

-- The trigger: a unique_live_only job that ends gives its key back (fires on the row's move into a
-- history tree; the WHEN clause keeps every job without such a key free of it).
CREATE OR REPLACE FUNCTION pgjobs._release_key()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    DELETE FROM job_keys AS k WHERE k.kind = NEW.kind AND k.unique_key = NEW.unique_key AND k.job_id = NEW.id;
    RETURN NULL;
END;
$$;
CREATE OR REPLACE TRIGGER jobs_release_key AFTER INSERT ON pgjobs.jobs_succeeded
    FOR EACH ROW WHEN (NEW.unique_live_only AND NEW.unique_key IS NOT NULL) EXECUTE FUNCTION pgjobs._release_key();
CREATE OR REPLACE TRIGGER jobs_release_key AFTER INSERT ON pgjobs.jobs_failed
    FOR EACH ROW WHEN (NEW.unique_live_only AND NEW.unique_key IS NOT NULL) EXECUTE FUNCTION pgjobs._release_key();

-- What ON DELETE CASCADE did for deleted jobs: their edges (as child or parent), continuation holds
-- (either end) and unique keys go.
CREATE OR REPLACE FUNCTION pgjobs._forget_jobs(ids bigint[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF ids IS NULL OR cardinality(ids) = 0 THEN
        RETURN;
    END IF;
    DELETE FROM edges AS e WHERE e.child_id = ANY (ids);
    DELETE FROM edges AS e WHERE e.parent_job_id = ANY (ids);
    DELETE FROM continuation_holds AS h WHERE h.job_id = ANY (ids);
    DELETE FROM continuation_holds AS h WHERE h.sibling_id = ANY (ids);
    DELETE FROM job_keys AS k WHERE k.job_id = ANY (ids);
    DELETE FROM job_steps AS s WHERE s.job_id = ANY (ids);  -- (sql/durable.sql)
    DELETE FROM job_waits AS w WHERE w.job_id = ANY (ids);
END;
$$;

-- The same for a whole slice about to be dropped (joins, not an array of every id).
CREATE OR REPLACE FUNCTION pgjobs._forget_slice(slice text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    EXECUTE format('DELETE FROM pgjobs.edges AS e WHERE EXISTS (SELECT 1 FROM pgjobs.%1$I AS s WHERE s.id = e.child_id)'
                   ' OR EXISTS (SELECT 1 FROM pgjobs.%1$I AS s WHERE s.id = e.parent_job_id)', slice);
    EXECUTE format('DELETE FROM pgjobs.continuation_holds AS h WHERE EXISTS (SELECT 1 FROM pgjobs.%1$I AS s WHERE s.id = h.job_id)'
                   ' OR EXISTS (SELECT 1 FROM pgjobs.%1$I AS s WHERE s.id = h.sibling_id)', slice);
    EXECUTE format('DELETE FROM pgjobs.job_keys AS k USING pgjobs.%I AS s'
                   ' WHERE s.unique_key IS NOT NULL AND k.kind = s.kind AND k.unique_key = s.unique_key AND k.job_id = s.id',
                   slice);
    EXECUTE format('DELETE FROM pgjobs.job_steps AS d USING pgjobs.%I AS s WHERE s.id = d.job_id', slice);  -- (sql/durable.sql)
    EXECUTE format('DELETE FROM pgjobs.job_waits AS d USING pgjobs.%I AS s WHERE s.id = d.job_id', slice);
END;
$$;

-- Deletes the rows of one slice (or DEFAULT partition) that completed before `cutoff`, batch members
-- excepted (they go with their batch); only `queues` when given. Returns how many.
CREATE OR REPLACE FUNCTION pgjobs._purge_slice_rows(slice text, cutoff timestamptz, queues text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_ids bigint[];
BEGIN
    EXECUTE format('WITH gone AS (DELETE FROM pgjobs.%I AS j WHERE j.batch_id IS NULL AND j.completed_at < $1'
                   ' AND ($2 IS NULL OR j.queue = ANY ($2)) RETURNING j.id) SELECT array_agg(gone.id) FROM gone', slice)
       INTO v_ids USING cutoff, queues;
    PERFORM _forget_jobs(v_ids);
    RETURN coalesce(cardinality(v_ids), 0);
END;
$$;

-- Drops one whole slice: forgets its jobs' edges, holds and keys, then DROP TABLE. Returns the rows it
-- held, or NULL when the slice holds a batch member (a batch's members go with their batch) or, with
-- lock_wait, when the locks did not come in time.
CREATE OR REPLACE FUNCTION pgjobs._drop_slice(slice text, lock_wait text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_tree    text := (SELECT p.tree FROM history_partitions AS p WHERE p.name = _drop_slice.slice);
    v_n       bigint;
    v_members boolean;
    v_timeout text := current_setting('lock_timeout');
BEGIN
    BEGIN
        IF lock_wait IS NOT NULL THEN
            PERFORM set_config('lock_timeout', lock_wait, true);
        END IF;
        -- DROP locks the tree and the slice: both taken first, under the timeout (a completion routed into
        -- the tree waits behind this lock request, so it must not wait long), and no completion lands in
        -- the slice after it was counted.
        EXECUTE format('LOCK TABLE pgjobs.%I, pgjobs.%I IN ACCESS EXCLUSIVE MODE', 'jobs_' || v_tree, slice);
        PERFORM set_config('lock_timeout', v_timeout, true);
    EXCEPTION WHEN lock_not_available THEN
        PERFORM set_config('lock_timeout', v_timeout, true);
        RETURN NULL;
    END;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM pgjobs.%I AS j WHERE j.batch_id IS NOT NULL)', slice) INTO v_members;
    IF v_members THEN
        RETURN NULL;
    END IF;
    EXECUTE format('SELECT count(*) FROM pgjobs.%I', slice) INTO v_n;
    PERFORM _forget_slice(slice);
    EXECUTE format('DROP TABLE pgjobs.%I', slice);
    DELETE FROM history_partitions AS p WHERE p.name = _drop_slice.slice;
    RETURN v_n;
END;
$$;

-- Makes the slices from the current one to `premake` ahead in both trees (ATTACH, not CREATE ...
-- PARTITION OF: that would lock the tree ACCESS EXCLUSIVE). A slice whose range already has rows in the
-- DEFAULT partition (maintenance did not run for a while) cannot be attached: skipped, its rows stay
-- in DEFAULT, which purge and retention handle row by row.
CREATE OR REPLACE FUNCTION pgjobs._premake_slices(lock_wait text DEFAULT NULL)
RETURNS TABLE (action text, target text, rows bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_set     history_settings;
    v_until   timestamptz;
    v_from    timestamptz;
    v_to      timestamptz;
    v_name    text;
    v_tree    text;
    v_timeout text := current_setting('lock_timeout');
BEGIN
    SELECT * INTO v_set FROM history_settings;
    v_until := date_bin(v_set.slice, now(), '2000-01-01 00:00:00+00') + (v_set.premake + 1) * v_set.slice;
    FOREACH v_tree IN ARRAY ARRAY['succeeded', 'failed'] LOOP
        LOOP
            v_from := greatest((SELECT max(p.upper) FROM history_partitions AS p WHERE p.tree = v_tree),
                               date_bin(v_set.slice, now(), '2000-01-01 00:00:00+00'));
            EXIT WHEN v_from >= v_until;
            v_to := date_bin(v_set.slice, v_from, '2000-01-01 00:00:00+00') + v_set.slice;
            v_name := 'jobs_' || v_tree || '_' || to_char(v_from AT TIME ZONE 'UTC', 'YYYYMMDD"t"HH24MI');
            BEGIN
                EXECUTE format('CREATE TABLE pgjobs.%I (LIKE pgjobs.jobs INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', v_name);
                IF lock_wait IS NOT NULL THEN
                    PERFORM set_config('lock_timeout', lock_wait, true);
                END IF;
                EXECUTE format('ALTER TABLE pgjobs.%I ATTACH PARTITION pgjobs.%I FOR VALUES FROM (%L) TO (%L)',
                               'jobs_' || v_tree, v_name, v_from, v_to);
                PERFORM set_config('lock_timeout', v_timeout, true);
                INSERT INTO history_partitions (name, tree, lower, upper) VALUES (v_name, v_tree, v_from, v_to);
                action := 'create'; target := v_name; rows := NULL;
                RETURN NEXT;
            EXCEPTION WHEN lock_not_available OR check_violation THEN
                PERFORM set_config('lock_timeout', v_timeout, true);
                action := 'skip'; target := v_name || ' (' || SQLERRM || ')'; rows := NULL;
                RETURN NEXT;
                EXIT;
            END;
        END LOOP;
    END LOOP;
END;
$$;

-- Per-queue retention (queues.retention), at slice granularity (see the header).
CREATE OR REPLACE FUNCTION pgjobs._apply_retention(lock_wait text DEFAULT NULL)
RETURNS TABLE (action text, target text, rows bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_min     interval := (SELECT min(q.retention) FROM queues AS q WHERE q.retention IS NOT NULL);
    v_changed timestamptz := (SELECT max(q.updated_at) FROM queues AS q);
    v_slice   record;
    v_queues  text[];
    v_expired text[];
    v_next    timestamptz;
    v_n       bigint;
    v_tree    text;
BEGIN
    IF v_min IS NULL THEN
        RETURN;
    END IF;
    FOR v_slice IN
        SELECT p.name, p.upper FROM history_partitions AS p
         WHERE p.upper <= now() - v_min
           AND (p.checked_at IS NULL OR p.checked_at < v_changed OR p.next_check_at <= now())
         ORDER BY p.upper
    LOOP
        -- Which queues the slice holds (one read of the slice per check, not per pass).
        EXECUTE format('SELECT array_agg(DISTINCT j.queue) FROM pgjobs.%I AS j', v_slice.name) INTO v_queues;
        SELECT array_agg(x.queue) FILTER (WHERE v_slice.upper + q.retention <= now()),
               min(v_slice.upper + q.retention) FILTER (WHERE v_slice.upper + q.retention > now())
          INTO v_expired, v_next
          FROM unnest(coalesce(v_queues, '{}')) AS x(queue) LEFT JOIN queues AS q ON q.queue = x.queue;
        v_n := NULL;
        IF v_queues IS NULL OR cardinality(v_expired) = cardinality(v_queues) THEN
            v_n := _drop_slice(v_slice.name, lock_wait);
            IF v_n IS NOT NULL THEN
                action := 'drop'; target := v_slice.name; rows := v_n;
                RETURN NEXT;
                CONTINUE;
            END IF;
        END IF;
        IF v_expired IS NOT NULL THEN
            v_n := _purge_slice_rows(v_slice.name, 'infinity', v_expired);
            action := 'retention'; target := v_slice.name || ' (' || array_to_string(v_expired, ', ') || ')';
            rows := v_n;
            RETURN NEXT;
        END IF;
        UPDATE history_partitions AS p SET checked_at = now(), next_check_at = coalesce(v_next, 'infinity')
         WHERE p.name = v_slice.name;
    END LOOP;
    -- The DEFAULT partitions row by row (they are small: only rows outside every slice land there).
    FOREACH v_tree IN ARRAY ARRAY['succeeded', 'failed'] LOOP
        EXECUTE format('WITH gone AS (DELETE FROM pgjobs.%I AS j USING pgjobs.queues AS q'
                       ' WHERE q.queue = j.queue AND j.batch_id IS NULL AND j.completed_at < now() - q.retention'
                       ' RETURNING j.id) SELECT array_agg(gone.id) FROM gone', 'jobs_' || v_tree || '_default')
           INTO v_queues;
        IF v_queues IS NOT NULL THEN
            PERFORM _forget_jobs(v_queues::bigint[]);
            action := 'retention'; target := 'jobs_' || v_tree || '_default'; rows := cardinality(v_queues);
            RETURN NEXT;
        END IF;
    END LOOP;
END;
$$;
