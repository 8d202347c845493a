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
BEGIN
    IF TG_OP = 'UPDATE' THEN
        INSERT INTO cap_ledger (queue, n)
        SELECT d.queue, d.n
          FROM (SELECT m.queue, sum(m.n)::int AS n
                  FROM (SELECT o.queue, -1 AS n FROM old_jobs AS o WHERE o.state = 'active'
                        UNION ALL
                        SELECT w.queue, 1 FROM new_jobs AS w WHERE w.state = 'active') AS m
                 GROUP BY m.queue) AS d
          JOIN queues AS c ON c.queue = d.queue AND c.max_active IS NOT NULL
         WHERE d.n <> 0;
    ELSE
        INSERT INTO cap_ledger (queue, n)
        SELECT d.queue, d.n
          FROM (SELECT o.queue, -count(*)::int AS n FROM old_jobs AS o WHERE o.state = 'active'
                 GROUP BY o.queue) AS d
          JOIN queues AS c ON c.queue = d.queue AND c.max_active IS NOT NULL;
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

-- The first checkpoint of a queue: its active jobs counted in one statement, less the ledger rows of this
-- transaction (they are read again past the checkpoint, as its own).
CREATE OR REPLACE FUNCTION pgjobs._cap_seed(queue text)
RETURNS int
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_n    int;
    v_mine int;
    v_snap pg_snapshot;
    v_me   xid8;
BEGIN
    SELECT (SELECT count(*)::int FROM jobs AS j WHERE j.state = 'active' AND j.queue = _cap_seed.queue),
           (SELECT coalesce(sum(l.n), 0)::int FROM cap_ledger AS l
             WHERE l.queue = _cap_seed.queue AND l.xid = pg_current_xact_id_if_assigned()),
           pg_current_snapshot(), pg_current_xact_id_if_assigned()
      INTO v_n, v_mine, v_snap, v_me;
    INSERT INTO cap_checkpoints (queue, seq, snap, own, active, cut, prev)
    VALUES (queue, nextval('pgjobs.cap_checkpoints_seq'), v_snap, v_me, v_n - v_mine, '0'::xid8, NULL);
    RETURN v_n;
END;
$$;

-- The active jobs of a capped queue, for a claim that holds the queue's lock: the newest checkpoint plus the
-- rows filed since its snapshot; 64 rows or more, and this claim writes the next checkpoint.
CREATE OR REPLACE FUNCTION pgjobs._cap_active(queue text)
RETURNS int
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_c    cap_checkpoints;
    v_all  int;
    v_mine int;
    v_rows int;
    v_snap pg_snapshot;
    v_me   xid8;
BEGIN
    SELECT * INTO v_c FROM cap_checkpoints AS c WHERE c.queue = _cap_active.queue ORDER BY c.seq DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN _cap_seed(queue);
    END IF;
    -- One statement: a new checkpoint records the snapshot its sum was read with.
    SELECT coalesce(sum(d.n), 0)::int,
           coalesce(sum(d.n) FILTER (WHERE d.xid = pg_current_xact_id_if_assigned()), 0)::int,
           count(*)::int, pg_current_snapshot(), pg_current_xact_id_if_assigned()
      INTO v_all, v_mine, v_rows, v_snap, v_me
      FROM (SELECT l.xid, l.n
              FROM (SELECT x.xid FROM pg_snapshot_xip(v_c.snap) AS x(xid)
                    UNION
                    SELECT v_c.own WHERE v_c.own < pg_snapshot_xmax(v_c.snap)) AS x
             CROSS JOIN LATERAL (
                   SELECT l.xid, l.n FROM cap_ledger AS l
                    WHERE l.queue = _cap_active.queue AND l.xid = x.xid
                   OFFSET 0) AS l
            UNION ALL
            SELECT l.xid, l.n FROM cap_ledger AS l
             WHERE l.queue = _cap_active.queue AND l.xid >= pg_snapshot_xmax(v_c.snap)) AS d;
    IF v_rows >= 64 THEN
        INSERT INTO cap_checkpoints (queue, seq, snap, own, active, cut, prev)
        VALUES (queue, nextval('pgjobs.cap_checkpoints_seq'), v_snap, v_me, v_c.active + v_all - v_mine,
                greatest(v_c.cut, pg_snapshot_xmin(v_c.snap)), v_c.seq);
        -- The rows below the previous checkpoint's xmin are in its sum (committed before its snapshot, and
        -- its own transaction is at least its xmin), so in this one's: gone, from the last cut up.
        DELETE FROM cap_ledger AS l
         WHERE l.queue = _cap_active.queue AND l.xid >= v_c.cut AND l.xid < pg_snapshot_xmin(v_c.snap);
        DELETE FROM cap_checkpoints AS c WHERE c.queue = _cap_active.queue AND c.seq = v_c.prev;
    END IF;
    RETURN v_c.active + v_all;
END;
$$;
