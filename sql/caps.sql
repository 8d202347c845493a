-- The active ledger of capped queues (docs/design/claim.md, "Caps as built"). A claim of a queue with
-- max_active reads how many of its jobs are active without a pass over jobs_active_idx (whose dead entries a
-- held snapshot keeps: every job completed since it was taken) and without a row rewritten per claim.
--
-- * cap_ledger: insert-only rows (queue, xid, n). The statement trigger below writes one per statement and
--   queue with max_active whose jobs entering 'active' minus those leaving it is not zero: a claim (+n), a
--   completion, failure, release, cancellation, park, sleep, reap, settle or delete of an active job (-n). A
--   reclaim of an expired lease and a renewal are active to active: nothing. Written by a trigger, not by the
--   paths, so no path that ends an attempt can forget it, and in the statement that moves the jobs: the row
--   commits, or vanishes, with the move.
-- * cap_checkpoints: `active` is the sum of the rows visible in `snap`, those of `own` (the writer) aside.
--   The rows a checkpoint's sum leaves out are exactly those whose transaction is in its snapshot's list,
--   at or past its xmax, or its own: a row committed before the snapshot is visible in it, whatever its
--   place in the index. So newest checkpoint + those rows (probed xid by xid, and one range from xmax) is the
--   sum of every committed row, each once.
-- * Exactness: a claim reads the count under its queue's advisory lock (claim.sql, _claim_capped_plain), in a
--   statement after the lock, so every claim before it has committed; an end path's row commits with its
--   move, so the count is the number of active jobs in the claim's snapshot. A job whose lease expired
--   counts until it is reclaimed or settled.
-- * Bounded: a claim reads the rows filed since the newest checkpoint's snapshot, and writes a new checkpoint
--   once those are 64 or more; that checkpoint deletes the rows its predecessor had summed (the range below
--   the predecessor's xmin) and the checkpoint before. The ranges a claim reads start at a snapshot's xmax
--   or at one xid, above every deleted row, so dead rows kept by a held snapshot are never passed.
-- * Seed: a queue with no checkpoint (the first capped claim, or after configure_queue set or lifted its
--   max_active) is counted once over jobs_active_idx.

CREATE OR REPLACE FUNCTION pgjobs._cap_moved()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_counted text[];   -- the statement's queues with a ledger
    v_grouped text[];   -- those counted per group (fair, or a per-group cap); elsewhere one row a statement
BEGIN
    -- The queues first, one probe each: a statement on queues without a ledger (plain ones) ends here.
    IF TG_OP = 'UPDATE' THEN
        SELECT array_agg(c.queue), array_agg(c.queue) FILTER (WHERE c.fair OR c.max_active_per_group IS NOT NULL)
          INTO v_counted, v_grouped
          FROM queues AS c
         WHERE c.queue IN (SELECT o.queue FROM old_jobs AS o WHERE o.state = 'active'
                           UNION SELECT w.queue FROM new_jobs AS w WHERE w.state = 'active')
           AND (c.max_active IS NOT NULL OR c.fair OR c.max_active_per_group IS NOT NULL);
        IF v_counted IS NOT NULL THEN
            INSERT INTO cap_ledger (queue, group_key, n)
            SELECT m.queue, CASE WHEN m.queue = ANY (v_grouped) THEN m.group_key END, sum(m.n)::int
              FROM (SELECT o.queue, o.group_key, -1 AS n FROM old_jobs AS o WHERE o.state = 'active'
                    UNION ALL
                    SELECT w.queue, w.group_key, 1 FROM new_jobs AS w WHERE w.state = 'active') AS m
             WHERE m.queue = ANY (v_counted)
             GROUP BY 1, 2
            HAVING sum(m.n) <> 0;
        END IF;
    ELSE
        SELECT array_agg(c.queue), array_agg(c.queue) FILTER (WHERE c.fair OR c.max_active_per_group IS NOT NULL)
          INTO v_counted, v_grouped
          FROM queues AS c
         WHERE c.queue IN (SELECT o.queue FROM old_jobs AS o WHERE o.state = 'active')
           AND (c.max_active IS NOT NULL OR c.fair OR c.max_active_per_group IS NOT NULL);
        IF v_counted IS NOT NULL THEN
            INSERT INTO cap_ledger (queue, group_key, n)
            SELECT o.queue, CASE WHEN o.queue = ANY (v_grouped) THEN o.group_key END, -count(*)::int
              FROM old_jobs AS o
             WHERE o.state = 'active' AND o.queue = ANY (v_counted)
             GROUP BY 1, 2;
        END IF;
    END IF;
    RETURN NULL;
END;
$$;
CREATE OR REPLACE TRIGGER jobs_cap_moved AFTER UPDATE ON pgjobs.jobs
    REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION pgjobs._cap_moved();
CREATE OR REPLACE TRIGGER jobs_cap_deleted AFTER DELETE ON pgjobs.jobs
    REFERENCING OLD TABLE AS old_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION pgjobs._cap_moved();

-- The claim lock of a capped or fair queue, to the end of the transaction: its claims run one at a time, and
-- under READ COMMITTED every statement after the lock sees every job the claims before it leased (a holder lets
-- go only once its commit is visible), so the counts read under it are exact. A snapshot older than the lock
-- (REPEATABLE READ, SERIALIZABLE) could miss them: refused.
CREATE OR REPLACE FUNCTION pgjobs._cap_lock(queue text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('claim on queue %L (it is fair or capped) needs READ COMMITTED, not %s',
                             queue, current_setting('transaction_isolation'));
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('pgjobs.claim:' || queue, 0));
END;
$$;

-- Per-group counts as a map {group: n}, zeros left out: the sum of a map and of ledger rows.
CREATE OR REPLACE FUNCTION pgjobs._cap_sum_groups(base jsonb, keys text[], deltas int[])
RETURNS jsonb
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(s.k, s.n) FILTER (WHERE s.n <> 0), '{}')
              FROM (SELECT u.k, sum(u.n)::int AS n
                      FROM (SELECT b.key AS k, b.value::int AS n FROM jsonb_each_text(base) AS b
                            UNION ALL
                            SELECT d.k, d.n FROM unnest(keys, deltas) AS d(k, n) WHERE d.k IS NOT NULL) AS u
                     GROUP BY u.k) AS s);
END;
$$;

-- The first checkpoint of a queue: its active jobs (and per group) counted in one statement, less the ledger
-- rows of this transaction (they are read again past the checkpoint, as its own).
CREATE OR REPLACE FUNCTION pgjobs._cap_seed(queue text)
RETURNS pgjobs.cap_checkpoints
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_c cap_checkpoints;
BEGIN
    WITH act AS (
        SELECT j.group_key, count(*)::int AS n FROM jobs AS j
         WHERE j.state = 'active' AND j.queue = _cap_seed.queue GROUP BY j.group_key
    ), mine AS (
        SELECT l.group_key, -l.n AS n FROM cap_ledger AS l
         WHERE l.queue = _cap_seed.queue AND l.xid = pg_current_xact_id_if_assigned()
    )
    SELECT queue, nextval('pgjobs.cap_checkpoints_seq'), pg_current_snapshot(), pg_current_xact_id_if_assigned(),
           (SELECT coalesce(sum(a.n), 0) FROM act AS a) + (SELECT coalesce(sum(m.n), 0) FROM mine AS m),
           '0'::xid8, NULL,
           _cap_sum_groups('{}', ARRAY(SELECT a.group_key FROM act AS a UNION ALL SELECT m.group_key FROM mine AS m),
                           ARRAY(SELECT a.n FROM act AS a UNION ALL SELECT m.n FROM mine AS m))
      INTO v_c;
    INSERT INTO cap_checkpoints (queue, seq, snap, own, active, cut, prev, groups)
    VALUES (v_c.queue, v_c.seq, v_c.snap, v_c.own, v_c.active, v_c.cut, v_c.prev, v_c.groups);
    -- What the caller reads is the count with this transaction's rows in.
    SELECT v_c.active - coalesce(sum(m.n), 0)::int,
           _cap_sum_groups(v_c.groups, array_agg(m.group_key), array_agg(-m.n))
      INTO v_c.active, v_c.groups
      FROM (SELECT l.group_key, -l.n AS n FROM cap_ledger AS l
             WHERE l.queue = _cap_seed.queue AND l.xid = pg_current_xact_id_if_assigned()) AS m;
    RETURN v_c;
END;
$$;

-- The active jobs of a capped or fair queue, for a claim that holds the queue's lock: the newest checkpoint
-- plus the rows filed since its snapshot, in all and per group ({group: n}, grouped queues only); 64 rows or
-- more, and this claim writes the next checkpoint.
CREATE OR REPLACE FUNCTION pgjobs._cap_counts(queue text, OUT active int, OUT groups jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_c    cap_checkpoints;
    v_rows int;
    v_snap pg_snapshot;
    v_me   xid8;
    v_keys text[];
    v_n    int[];
    v_mine boolean[];
BEGIN
    SELECT * INTO v_c FROM cap_checkpoints AS c WHERE c.queue = _cap_counts.queue ORDER BY c.seq DESC LIMIT 1;
    IF NOT FOUND THEN
        v_c := _cap_seed(queue);
        active := v_c.active;
        groups := v_c.groups;
        RETURN;
    END IF;
    -- One statement: a new checkpoint records the snapshot its sum was read with.
    SELECT array_agg(d.group_key), array_agg(d.n), array_agg(coalesce(d.xid = pg_current_xact_id_if_assigned(), false)),
           count(*)::int, pg_current_snapshot(), pg_current_xact_id_if_assigned()
      INTO v_keys, v_n, v_mine, v_rows, v_snap, v_me
      FROM (SELECT l.xid, l.n, l.group_key
              FROM (SELECT x.xid FROM pg_snapshot_xip(v_c.snap) AS x(xid)
                    UNION
                    SELECT v_c.own WHERE v_c.own < pg_snapshot_xmax(v_c.snap)) AS x
             CROSS JOIN LATERAL (
                   SELECT l.xid, l.n, l.group_key FROM cap_ledger AS l
                    WHERE l.queue = _cap_counts.queue AND l.xid = x.xid
                   OFFSET 0) AS l
            UNION ALL
            SELECT l.xid, l.n, l.group_key FROM cap_ledger AS l
             WHERE l.queue = _cap_counts.queue AND l.xid >= pg_snapshot_xmax(v_c.snap)) AS d;
    active := v_c.active + coalesce((SELECT sum(n) FROM unnest(v_n) AS n), 0)::int;
    groups := _cap_sum_groups(v_c.groups, v_keys, v_n);
    IF v_rows >= 64 THEN
        -- The new checkpoint leaves this transaction's own rows out: they stay past it.
        INSERT INTO cap_checkpoints (queue, seq, snap, own, active, cut, prev, groups)
        SELECT queue, nextval('pgjobs.cap_checkpoints_seq'), v_snap, v_me,
               v_c.active + coalesce(sum(d.n) FILTER (WHERE NOT d.mine), 0)::int,
               greatest(v_c.cut, pg_snapshot_xmin(v_c.snap)), v_c.seq,
               _cap_sum_groups(v_c.groups, array_agg(d.k) FILTER (WHERE NOT d.mine),
                               array_agg(d.n) FILTER (WHERE NOT d.mine))
          FROM unnest(v_keys, v_n, v_mine) AS d(k, n, mine);
        -- The rows below the previous checkpoint's xmin are in its sum (committed before its snapshot, and
        -- its own transaction is at least its xmin), so in this one's: gone, from the last cut up.
        DELETE FROM cap_ledger AS l
         WHERE l.queue = _cap_counts.queue AND l.xid >= v_c.cut AND l.xid < pg_snapshot_xmin(v_c.snap);
        DELETE FROM cap_checkpoints AS c WHERE c.queue = _cap_counts.queue AND c.seq = v_c.prev;
    END IF;
END;
$$;

-- The active jobs of a queue capped by max_active (_cap_counts' total).
CREATE OR REPLACE FUNCTION pgjobs._cap_active(queue text)
RETURNS int
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN (_cap_counts(queue)).active;
END;
$$;
