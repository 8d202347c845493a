-- Claiming work. One call leases up to max_jobs jobs to a worker: due pending/scheduled jobs
-- and active jobs whose lease expired (their worker is presumed dead), by priority, run_at, id.
-- FOR UPDATE SKIP LOCKED lets concurrent claimers pass each other instead of queueing on a
-- row lock, so no two claimers ever share a job and none waits on another.

-- Plans: the hot functions here run with plan_cache_mode = force_generic_plan (their statements'
-- shapes are fixed by index order and keys, and planning each call cost more than running it)
-- and jit = off (a generic plan cannot see that LIMIT max_jobs is small, so on a big table its
-- cost passes jit_above_cost, and JIT compiled every claim: 25 ms per claim at 1M pending jobs).
-- That setting would carry into the functions they call in other files (graph, fairness), so a call
-- into those first restores the planner's default choice for the rest of the function
-- (set_config(..., true) inside a function with a SET clause ends with the function).
-- _claim_once and _claim_plain also run with enable_seqscan = off, as complete_many does: a session
-- makes its generic plans at its first claim, often on a small or new jobs_live, and keeps them while no
-- ANALYZE comes (autovacuum off, or a held snapshot that stops VACUUM); the update of the picked rows was
-- then a sequential scan of the whole table, dead versions too, on every claim (2.5 -> 17 ms per claim in
-- 35 s under a held snapshot at 3,000 jobs/s; 1.6-2.1 ms flat without it; tests/sql/test_claim_plan.py).
-- And with enable_bitmapscan = off: the same plans, made when jobs_live held a job or none, estimate one
-- pending row, and for one row a bitmap of the queue's pending entries plus a sort looks cheaper than the
-- index read in claim order. Once a backlog builds that bitmap reads all of it, dead versions too, on
-- every claim, and never marks a dead entry for the next scan to skip: in bench/soak.py at 11,800 jobs/s,
-- 90 s into a held snapshot, one claim read 1.87 M entries of jobs_pending_idx and 870 k rows to take 50
-- (570 ms), the backlog grew faster than claims could take it, and completions fell from 11,779 to 28
-- jobs/s (tests/sql/test_claim_plan.py, the backlog test).
-- The functions they call inherit both; fairness.sql sets both itself, graph.sql enable_seqscan.

CREATE OR REPLACE FUNCTION pgjobs._check_claim_args(worker text, queues text[], max_jobs int, lease interval,
                                                    kind_limits jsonb)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    v_bad text;
BEGIN
    -- (limits: checks.sql)
    PERFORM _check_name('worker', worker);
    PERFORM _check_array('queues', queues);
    IF queues IS NULL OR cardinality(queues) = 0 OR array_position(queues, NULL) IS NOT NULL
          OR array_position(queues, '') IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('queues must be a non-empty array of non-empty names, got %s', _shown(queues::text));
    ELSIF max_jobs IS NULL OR max_jobs < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('max_jobs must be >= 1, got %s', coalesce(max_jobs::text, 'NULL'));
    ELSIF max_jobs > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = format('max_jobs must be at most 10000, got %s', max_jobs);
    ELSIF lease IS NULL OR lease <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('lease must be a positive interval, got %s', coalesce(lease::text, 'NULL'));
    ELSIF kind_limits IS NOT NULL AND jsonb_typeof(kind_limits) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('kind_limits must be a JSON object {"kind": n}, got %s', _shown(kind_limits::text));
    END IF;
    PERFORM _check_interval('lease', lease, positive => true);
    IF kind_limits IS NOT NULL THEN
        SELECT format('%s: %s', _shown(e.key), _shown(e.value::text)) INTO v_bad
          FROM jsonb_each(kind_limits) AS e
         WHERE jsonb_typeof(e.value) <> 'number' OR (e.value::text)::numeric < 0
            OR (e.value::text)::numeric % 1 <> 0
         LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'PJ002',
                MESSAGE = format('kind_limits values must be non-negative integers, got %s', v_bad);
        END IF;
    END IF;
END;
$$;

-- Scan floors (why: a snapshot held by any session keeps every claimed job's dead entry at the
-- front of jobs_pending_idx, and every completed job's old 'active' entry in jobs_active_idx
-- with a lease in the past; a claim that scans from the front visits all of them, one heap fetch
-- each: claim p50 2 -> 55 ms after 120 s at 600 jobs/s in bench/soak.py). A claimer session
-- remembers, in its own settings (set_config(..., false): no table write, so no dead tuple), where
-- its last claim found live work, and its next claim's index scans start there:
-- * pending, per queue and priority level: the key (priority, run_at, id) of the first job the
--   last claim took at that level, or (level, now() - 300 ms, 0) when that is lower or when the
--   claim took everything there was. The margin covers producers whose transaction began before
--   the claim and commit after it (run_at defaults to the producer's transaction start). One range
--   scan per known level, from its floor up to the next known level, and one for the levels below
--   the first: a more urgent job, or a level this session never took from, is still read in order.
-- * expired leases (the reclaim branch) and the settle probe: from the now() of the last claim
--   that found none, less the margin; and at most once per pgjobs.claim_lease_every (default 1 s:
--   a lease that runs out is reclaimed up to that much later; _claim_lease_due has why).
-- Rows that appear below a floor come from statements that move the sequence claim_floor_epoch
-- (_claim_floor_note/_claim_floor_bump): an enqueue, fail, release, retry or dependency release
-- that files a pending job with a run_at 150 ms old or more (an explicit past run_at, a transaction
-- that began a while ago), due scheduled jobs promoted late, leases moved into the past
-- (reap_workers, deregister_worker), a queue changing between plain and fair or capped selection.
-- A session that sees the epoch moved scans from the front (recording the epoch it read before
-- that scan), and once more a second later (for a signalling transaction that had not committed
-- when it looked). A safety net scans from the front once both pgjobs.claim_full_scan_every
-- (default 5 s; 20 times the last such scan's duration when that is longer, so that it costs at
-- most a twentieth of the session's time) and pgjobs.claim_full_scan_claims claims (default 500,
-- so that it stays out of claim p99: a worker claims 50-100 times a second) have passed: it
-- catches what no signal announces (a claim rolled back after others passed its locked rows, a
-- producer that commits more than 300 ms after its transaction began and after a claim passed the
-- place its job sorts to): late, never lost.
-- Floors engage only when they pay: a session scans from the front, exactly as without them, until
-- one such scan visits pgjobs.claim_floor_engage (default 500) index entries more than the jobs it
-- took (_claim_floor_visits: the backend's own index statistics, so the test is deterministic), and
-- drops them when a scan from the front (the safety net) wastes less again. A session that changes
-- its queues or kind set scans from the front (a floor taken for kinds A and B says nothing of C).
-- Measured (bench/soak.py --rate 600 --minutes 4 --idle-tx 120, snapshot held 120 s, two runs each
-- side, same machine): at the end of the held period main's claim p50/p99 was 51-68/93-134 ms and
-- one run fell behind (484 of 599 jobs/s); with floors 1.2-1.8/7.5-81 ms (81: a safety net every
-- 5 s, since spaced by claims too) and the offered rate done in every window. README.md,
-- "Sustained load and held snapshots", has the windows.

-- The plan of a claim of these queues with this key (queues and kind set, see _claim_floor_save):
-- st, the session's floor state; epoch, the signal's value now; why NULL when the floors may be
-- used, else why this claim scans from the front ('new' session, the 'epoch' moved, the safety
-- 'net' is due); from_front, also when the state was taken for another key. The index ranges the
-- claim reads pending jobs from: (queue, first key: priority, run_at, id; priority bound), one
-- unbounded range per queue from the front, else one range below the first known level and one
-- per known level (see "Scan floors" above). lf: per queue, the lower bound on lease_expires_at
-- for the expired-lease branch. (One call, with no SET clause but search_path, and none of its
-- statements run while floors are off: the claim of a session without floors pays a few µs.)
CREATE OR REPLACE FUNCTION pgjobs._claim_floor_plan(queues text[], key text,
                                                    OUT st jsonb, OUT epoch bigint, OUT why text, OUT from_front boolean,
                                                    OUT rq text[], OUT rp smallint[], OUT rt timestamptz[],
                                                    OUT ri bigint[], OUT rh int[], OUT lf timestamptz[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_n int := coalesce(cardinality(queues), 0);
BEGIN
    st := nullif(current_setting('pgjobs.claim_floor', true), '')::jsonb;
    -- The last value, not nextval: reading the sequence takes no lock and writes nothing (NULL
    -- before its first nextval). A function call, not a scan of the sequence: no executor start.
    -- (to_regclass: a schema rolled back below claim_floor under these functions still claims.)
    epoch := coalesce(pg_sequence_last_value(to_regclass('pgjobs.claim_floor_epoch')), 0);
    why := CASE WHEN st IS NULL OR NOT st ? 'e' THEN 'new'
                WHEN (st ->> 'e')::bigint IS DISTINCT FROM epoch THEN 'epoch'
                -- (The net waits for a number of claims too, so that however seldom a session claims, at
                -- most one claim in pgjobs.claim_full_scan_claims (default 500) pays for a full scan.)
                WHEN extract(epoch FROM clock_timestamp()) >= (st ->> 'n')::numeric
                     AND coalesce((st ->> 'c')::int, 0)
                         >= coalesce(nullif(current_setting('pgjobs.claim_full_scan_claims', true), '')::int, 500)
                THEN 'net' END;
    from_front := why IS NOT NULL OR (st ->> 'k') IS DISTINCT FROM key;
    IF from_front THEN
        rq := queues;
        rp := array_fill((-32768)::smallint, ARRAY[v_n]);
        rt := array_fill('-infinity'::timestamptz, ARRAY[v_n]);
        ri := array_fill(0::bigint, ARRAY[v_n]);
        rh := array_fill(32768, ARRAY[v_n]);
        lf := rt;
        -- A session with floors scans from the front after a signal or for the safety net, and under a
        -- held snapshot that is where the long walks are: walked by _claim_front_ranges first, so that
        -- the claim neither loses its race nor walks the old lease entries twice. (Not for a session
        -- without floors: its every claim is 'new', and a front scan costs it nothing to speak of.)
        -- (key NULL: the caller reads only st and why, and scans nothing with these ranges.)
        IF key IS NOT NULL AND (why IN ('epoch', 'net') OR current_setting('pgjobs.claim_lost_race', true) = 'on') THEN
            SELECT f.rq, f.rp, f.rt, f.ri, f.rh INTO rq, rp, rt, ri, rh FROM _claim_front_ranges(queues) AS f;
            lf := _claim_front_leases(queues);
        END IF;
        RETURN;
    END IF;
    -- (Times are kept as text: a float of epoch seconds loses the microsecond that separates a floor
    -- from the row it was taken at.)
    WITH q AS (
        SELECT q.name, q.ord, st -> 'q' -> q.name AS f FROM unnest(queues) WITH ORDINALITY AS q(name, ord)
    ), lv AS (
        SELECT q.name, q.ord, (e ->> 0)::smallint AS p, (e ->> 1)::timestamptz AS t, (e ->> 2)::bigint AS i
          FROM q CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof(q.f -> 'p') = 'array' THEN q.f -> 'p' ELSE '[]' END) AS e
    ), rng AS (
        SELECT q.name, q.ord, (-32768)::smallint AS lo, '-infinity'::timestamptz AS t, 0::bigint AS i,
               coalesce((SELECT min(lv.p) FROM lv WHERE lv.ord = q.ord)::int, 32768) AS hi
          FROM q
        UNION ALL
        SELECT lv.name, lv.ord, lv.p, lv.t, lv.i,
               coalesce(lead(lv.p) OVER (PARTITION BY lv.ord ORDER BY lv.p)::int, 32768)
          FROM lv
    )
    SELECT array_agg(r.name ORDER BY r.ord, r.lo), array_agg(r.lo ORDER BY r.ord, r.lo),
           array_agg(r.t ORDER BY r.ord, r.lo), array_agg(r.i ORDER BY r.ord, r.lo),
           array_agg(r.hi ORDER BY r.ord, r.lo)
      INTO rq, rp, rt, ri, rh
      FROM rng AS r;
    -- A lease floor looked at within pgjobs.claim_lease_every is not looked at again ('infinity': an
    -- empty range); _claim_floor_save keeps it where it was, so the next look starts there.
    SELECT array_agg(CASE WHEN _claim_lease_due(st -> 'q' -> q.name ->> 'r')
                          THEN coalesce((st -> 'q' -> q.name ->> 'r')::timestamptz, '-infinity')
                          ELSE 'infinity' END ORDER BY q.ord)
      INTO lf
      FROM unnest(queues) WITH ORDINALITY AS q(name, ord);
END;
$$;

-- The ranges of a scan from the front after a lost race (claim() in history.sql sets
-- pgjobs.claim_lost_race for its next try). Under a held snapshot a scan from the front (a new
-- session, a moved epoch, the safety net) walks every dead entry at the front of jobs_pending_idx
-- before it reaches live jobs: hundreds of ms, and its snapshot is that old when it locks. By then
-- the other claimers have claimed and completed the jobs it finds there, and locking a job moved to
-- history raises 40001: every try again lost (measured: a session failing 20 tries out of 20, over
-- and over, after 60 s of a held snapshot at 3,000 jobs/s). So the walk is done by a statement of
-- its own that locks nothing, and the claim's locking statement, in a new snapshot, starts at the
-- first pending job that walk saw, or at (its level, now() - 300 ms, 0) when that is lower (the
-- floors' margin, "Scan floors" above: a row that sorts lower and commits later moved the epoch or is
-- within the margin), plus the unbounded range of the more urgent levels below it.
-- The safety net and a moved epoch scan from the front this way too (_claim_floor_plan), and their
-- leases through _claim_front_leases, below.
CREATE OR REPLACE FUNCTION pgjobs._claim_front_ranges(queues text[],
                                                      OUT rq text[], OUT rp smallint[], OUT rt timestamptz[],
                                                      OUT ri bigint[], OUT rh int[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_low timestamptz := now() - interval '300 ms';
BEGIN
    WITH f AS (
        SELECT q.name, q.ord, x.priority AS p,
               CASE WHEN x.run_at < v_low THEN x.run_at ELSE v_low END AS t,
               CASE WHEN x.run_at < v_low THEN x.id ELSE 0 END AS i
          FROM unnest(queues) WITH ORDINALITY AS q(name, ord)
          LEFT JOIN LATERAL (SELECT j.priority, j.run_at, j.id FROM jobs AS j
                              WHERE j.state = 'pending' AND j.queue = q.name
                              ORDER BY j.priority, j.run_at, j.id
                              LIMIT 1) AS x ON true
    ), rng AS (
        SELECT f.name, f.ord, (-32768)::smallint AS lo, '-infinity'::timestamptz AS t, 0::bigint AS i,
               coalesce(f.p::int, 32768) AS hi
          FROM f
        UNION ALL
        SELECT f.name, f.ord, f.p, f.t, f.i, 32768 FROM f WHERE f.p IS NOT NULL
    )
    SELECT array_agg(r.name ORDER BY r.ord, r.lo), array_agg(r.lo ORDER BY r.ord, r.lo),
           array_agg(r.t ORDER BY r.ord, r.lo), array_agg(r.i ORDER BY r.ord, r.lo),
           array_agg(r.hi ORDER BY r.ord, r.lo)
      INTO rq, rp, rt, ri, rh
      FROM rng AS r;
END;
$$;

-- The lease floors of a scan from the front after a signal, for the safety net or after a lost race
-- (_claim_floor_plan): per queue, the first run-out lease a walk that locks nothing saw, or now() -
-- 300 ms when that is lower or when it saw none (the floors' margin, as _claim_floor_save moves a
-- lease floor after a look that found none). Under a held snapshot the settle probe and the claim's
-- reclaim branch each walked, from -infinity, the old 'active' entry of every job completed since:
-- one walk now serves both. (bench/soak.py at 9,400 jobs/s, 120 s into a held snapshot: 5.4 M entries
-- of jobs_active_idx and 9.9 M of jobs_pending_idx read in 10 s, most by such scans and by claims
-- that lost their race after one.)
CREATE OR REPLACE FUNCTION pgjobs._claim_front_leases(queues text[])
RETURNS timestamptz[]
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN (
        SELECT array_agg(CASE WHEN x.lease_expires_at < now() - interval '300 ms' THEN x.lease_expires_at
                              ELSE now() - interval '300 ms' END ORDER BY q.ord)
          FROM unnest(queues) WITH ORDINALITY AS q(name, ord)
          LEFT JOIN LATERAL (SELECT j.lease_expires_at FROM jobs AS j
                              WHERE j.state = 'active' AND j.queue = q.name AND j.lease_expires_at < now()
                              ORDER BY j.lease_expires_at
                              LIMIT 1) AS x ON true
    );
END;
$$;

-- Records where a claim found work (see "Scan floors" above). key: the queues and kind set the floor
-- is valid for (a floor taken with kinds A and B says nothing of kind C). from_front: the claim read
-- from the front; why/epoch/t0: from _claim_floor_plan and the clock before the scan. pq/pp/pt/pi:
-- queue, priority, run_at and id of each job it took from pending. exhausted: it took every pending
-- job its ranges held (fewer than it asked for, no per-kind cap binding). no_expired: it found no
-- expired lease. wasted: index entries its scans visited beyond the jobs it took.
-- A level's floor is the key of the first job taken there, or (level, now() - 300 ms, 0) when that
-- is lower: a producer whose transaction began before now() - 300 ms and commits after this claim's
-- snapshot is the one thing it cannot see (its run_at is its transaction's start), and one that
-- began 150 ms or more before its insert moved the epoch (enqueue.sql).
CREATE OR REPLACE FUNCTION pgjobs._claim_floor_save(key text, queues text[], from_front boolean, why text, epoch bigint,
                                                    t0 timestamptz, pq text[], pp smallint[], pt timestamptz[],
                                                    pi bigint[], exhausted boolean, no_expired boolean, wasted bigint)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_st    jsonb := coalesce(nullif(current_setting('pgjobs.claim_floor', true), ''), '{}')::jsonb;
    v_old   jsonb := CASE WHEN from_front THEN '{}' ELSE coalesce(v_st -> 'q', '{}') END;
    v_low   timestamptz := now() - interval '300 ms';
    v_clock numeric := extract(epoch FROM clock_timestamp());
    v_every numeric;
    v_q     jsonb;
BEGIN
    IF from_front AND wasted < coalesce(nullif(current_setting('pgjobs.claim_floor_engage', true), '')::int, 500) THEN
        -- Scanning from the front costs (nearly) nothing: no floors, the claims stay as they were.
        IF v_st <> '{}' THEN
            PERFORM set_config('pgjobs.claim_floor', '', false);
        END IF;
        RETURN false;
    END IF;
    SELECT jsonb_object_agg(q.name, jsonb_build_object(
               'p', coalesce(l.levels, CASE WHEN exhausted THEN jsonb_build_array(jsonb_build_array(0, v_low, 0)) END, '[]'),
               -- (not moved past entries a throttled claim did not look at: _claim_lease_due)
               'r', CASE WHEN no_expired AND _claim_lease_due(v_old -> q.name ->> 'r') THEN to_jsonb(v_low)
                         ELSE v_old -> q.name -> 'r' END))
      INTO v_q
      FROM unnest(queues) AS q(name)
     CROSS JOIN LATERAL (
           SELECT jsonb_agg(CASE WHEN exhausted OR x.t IS NULL OR x.t >= v_low
                                 THEN CASE WHEN x.t IS NULL AND NOT exhausted THEN x.old
                                           ELSE jsonb_build_array(x.p, v_low, 0) END
                                 ELSE jsonb_build_array(x.p, x.t, x.i) END ORDER BY x.p) AS levels
             FROM (SELECT coalesce(n.p, (o.e ->> 0)::smallint) AS p, n.t, n.i, o.e AS old
                     FROM jsonb_array_elements(CASE WHEN jsonb_typeof(v_old -> q.name -> 'p') = 'array' THEN v_old -> q.name -> 'p'
                                                       ELSE '[]' END) AS o(e)
                     FULL JOIN (SELECT DISTINCT ON (x.p) x.p, x.t, x.i
                                  FROM unnest(pq, pp, pt, pi) AS x(q, p, t, i)
                                 WHERE x.q = q.name
                                 ORDER BY x.p, x.t, x.i) AS n
                       ON n.p = (o.e ->> 0)::smallint) AS x) AS l;
    v_st := v_st || jsonb_build_object('k', key, 'q', coalesce(v_q, '{}'),
                                       'c', CASE WHEN why IS NULL THEN coalesce((v_st ->> 'c')::int, 0) + 1 ELSE 0 END);
    IF why IS NOT NULL THEN
        -- The epoch read before this scan; the next full scan a second from now after a signal (for a
        -- signalling transaction that had not committed when this one scanned), else the safety net's.
        v_every := coalesce(extract(epoch FROM nullif(current_setting('pgjobs.claim_full_scan_every', true), '')::interval),
                            5);
        v_st := v_st || jsonb_build_object('e', epoch, 'n',
                    v_clock + CASE WHEN why = 'epoch' THEN least(1, v_every)
                                   ELSE greatest(v_every, 20 * (v_clock - extract(epoch FROM t0))) END);
    END IF;
    PERFORM set_config('pgjobs.claim_floor', v_st::text, false);
    RETURN true;
END;
$$;

-- Whether a claim with floors looks for expired leases from this lease floor (a floor's 'r', or the
-- settle probe's 's': the now() of the last look that found none, less the 300 ms margin). Under a
-- held snapshot every job completed since leaves its old 'active' entry in jobs_active_idx, and the
-- entries between a floor and now() are the jobs whose (30 s) lease would have run out since the last
-- look, whether they are done or not: a look per claim read them all, twice (the settle probe and the
-- reclaim branch), and a session's claims overlap by the margin. Measured in bench/soak.py at 9,500
-- jobs/s with a snapshot held for minutes: 6,500 entries of jobs_active_idx visited per claim of 50,
-- against 700 of jobs_pending_idx, and the worker fell to 5,000-8,000 jobs/s done. So a session with
-- floors looks at most once per pgjobs.claim_lease_every (default 1 s; 0 looks on every claim): a
-- lease that runs out is reclaimed (or settled) up to that much later, never lost (the floor stays
-- where the last look left it). Leases moved into the past move the epoch (a scan from the front,
-- which always looks). A session without floors looks on every claim, as before.
CREATE OR REPLACE FUNCTION pgjobs._claim_lease_due(floor text)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN floor IS NULL
        OR floor::timestamptz <= now() - interval '300 ms'
                                 - coalesce(nullif(current_setting('pgjobs.claim_lease_every', true), '')::interval,
                                            interval '1 second');
END;
$$;

-- Index entries this backend's scans of the claim indexes have visited (live or dead): the
-- difference across a claim, less the jobs it took, is what the dead versions cost it.
CREATE OR REPLACE FUNCTION pgjobs._claim_floor_visits()
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    -- (to_regclass: an index renamed or gone leaves 0, floors never engage, and claims work as before.)
    RETURN coalesce(pg_stat_get_xact_tuples_returned(to_regclass('pgjobs.jobs_pending_idx')), 0)
         + coalesce(pg_stat_get_xact_tuples_returned(to_regclass('pgjobs.jobs_active_idx')), 0);
END;
$$;

-- A statement made jobs claimable with run_at: if that is older than 150 ms (an explicit past
-- run_at, a dependency released, a scheduled job promoted late, a producer transaction that began
-- a while ago), it may sort below a claimer's floor: tell the claimers (see "Scan floors").
CREATE OR REPLACE FUNCTION pgjobs._claim_floor_note(run_at timestamptz)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF _claim_floor_note.run_at < clock_timestamp() - interval '150 ms'
       AND to_regclass('pgjobs.claim_floor_epoch') IS NOT NULL THEN  -- (see _claim_floor_plan)
        PERFORM nextval('pgjobs.claim_floor_epoch');
        RETURN true;
    END IF;
    RETURN false;
END;
$$;

-- Leases moved into the past, or rows made claimable by another path (see "Scan floors").
CREATE OR REPLACE FUNCTION pgjobs._claim_floor_bump()
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF to_regclass('pgjobs.claim_floor_epoch') IS NOT NULL THEN  -- (see _claim_floor_plan)
        PERFORM nextval('pgjobs.claim_floor_epoch');
    END IF;
    RETURN true;
END;
$$;

-- (called by claim(), history.sql: it retries this when a row it locks moved to another partition)
CREATE OR REPLACE FUNCTION pgjobs._claim_once(
    worker      text,
    queues      text[] DEFAULT '{default}',
    max_jobs    int DEFAULT 1,
    lease       interval DEFAULT '30 seconds',
    kind_limits jsonb DEFAULT NULL)
RETURNS SETOF pgjobs.claimed_job
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off SET enable_bitmapscan = off  -- (Plans, at the top of this file)
AS $$
#variable_conflict use_column
DECLARE
    v_plain      text[];
    v_controlled text[];
    v_limits     jsonb;
    v_expired    boolean;
    v_fair1      boolean := false;   -- one queue, fair: its claim's count settles expired leases
    v_due        boolean;
    v_quiet      text[];   -- queues that hear nothing of a claim (status_events 'none' or 'terminal')
    v_all        text[];
    v_st         jsonb;    -- the session's scan floors ("Scan floors" above)
    v_epoch      bigint;
    v_why        text;
    v_full       boolean;
    v_sf         timestamptz;
    v_t0         timestamptz;
    -- the ranges of the pending scans and the lease floors (_claim_floor_plan)
    v_rq text[]; v_rp smallint[]; v_rt timestamptz[]; v_ri bigint[]; v_rh int[]; v_lf timestamptz[];
    v_n          bigint;
    v_v0         bigint;
    v_kinds      text[];   -- kind_limits that bind no cap: the fast path's kind filter (sorted)
    v_key        text;     -- the floors' key: these queues and this kind set (_claim_floor_save)
    v_fast       boolean;  -- the one-statement path below takes this call
BEGIN
    -- The common arguments pass these inline tests; only the rest pay for the helper's checks.
    IF worker IS NULL OR worker = '' OR queues IS NULL OR cardinality(queues) = 0
       -- (limits: checks.sql; array_position raises on a multidimensional array, so its test goes first)
       OR array_ndims(queues) > 1
       OR array_position(queues, NULL) IS NOT NULL OR array_position(queues, '') IS NOT NULL
       OR max_jobs IS NULL OR max_jobs < 1 OR lease IS NULL OR lease <= interval '0'
       OR max_jobs > 10000 OR lease > interval '100 years' OR octet_length(worker) > 1000
       OR kind_limits IS NOT NULL THEN
        PERFORM _check_claim_args(worker, queues, max_jobs, lease, kind_limits);
    END IF;
    -- Normalised to integer caps (JSON 2.0 and 1e9 are valid limits too); '{}' stays '{}'
    -- (no kind may be taken), it must not become NULL (any kind).
    -- And in the same statement, v_kinds: a worker lists every kind it handles at its free capacity
    -- (runtime/claimer.py), so no cap can bind, the kinds are only a filter and the fast path below
    -- takes the call (through _claim_plain it cost 15-25 % more per claim and complete_many of 28: an
    -- array of rows built, then unnested again for the events). Any binding cap leaves v_kinds NULL.
    IF kind_limits IS NOT NULL THEN
        SELECT coalesce(jsonb_object_agg(e.key, c.cap), '{}'),
               CASE WHEN bool_and(c.cap >= max_jobs) FILTER (WHERE c.cap >= 1)
                    THEN array_agg(e.key ORDER BY e.key) FILTER (WHERE c.cap >= 1) END
          INTO v_limits, v_kinds
          FROM jsonb_each(kind_limits) AS e
         CROSS JOIN LATERAL (SELECT least((e.value::text)::numeric, max_jobs)::int AS cap) AS c;
    END IF;
    -- Paused queues give nothing. Queues with fairness or concurrency caps take the
    -- controlled path (fairness.sql); every other queue takes the plain fast path.
    IF cardinality(queues) = 1 THEN
        -- One queue (the usual worker): one probe of its settings row, if it has one.
        SELECT CASE WHEN NOT coalesce(c.fair OR c.max_active IS NOT NULL OR c.max_active_per_group IS NOT NULL, false)
                    THEN queues END,
               CASE WHEN coalesce(c.fair OR c.max_active IS NOT NULL OR c.max_active_per_group IS NOT NULL, false)
                    THEN queues END,
               CASE WHEN c.status_events <> 'all' THEN queues ELSE '{}' END, coalesce(c.fair, false)
          INTO v_plain, v_controlled, v_quiet, v_fair1
          FROM (SELECT 1) AS one
          LEFT JOIN queues AS c ON c.queue = queues[1]
         WHERE NOT coalesce(c.paused, false);
    ELSE
        SELECT array_agg(u.q ORDER BY u.ord) FILTER (WHERE NOT coalesce(c.fair OR c.max_active IS NOT NULL
                                                                      OR c.max_active_per_group IS NOT NULL, false)),
               array_agg(u.q ORDER BY u.ord) FILTER (WHERE coalesce(c.fair OR c.max_active IS NOT NULL
                                                                  OR c.max_active_per_group IS NOT NULL, false)),
               coalesce(array_agg(u.q) FILTER (WHERE c.status_events <> 'all'), '{}')
          INTO v_plain, v_controlled, v_quiet
          FROM (SELECT DISTINCT ON (x.q) x.q, x.ord FROM unnest(queues) WITH ORDINALITY AS x(q, ord)
                 ORDER BY x.q, x.ord) AS u
          LEFT JOIN queues AS c ON c.queue = u.q
         WHERE NOT coalesce(c.paused, false);
    END IF;

    IF v_plain IS NULL AND v_controlled IS NULL THEN
        RETURN;
    END IF;

    -- Jobs whose lease expired on their last allowed attempt, or whose cancellation was
    -- requested, are settled here instead of being handed out again; due scheduled jobs of
    -- plain queues become pending. Both are usually absent: one statement probes for both, and
    -- only what it finds costs a call (two calls per claim were a tenth of a claim of 10). A job
    -- that expires or falls due just after the probe is handled by the next claim.
    -- The first probe reads leases from the settle floor on (the now() of this session's last probe of
    -- these queues that found none, less the margin: "Scan floors" above; with floors at most once per
    -- pgjobs.claim_lease_every), not from the front of jobs_active_idx (each completed job's old version).
    v_all := coalesce(v_plain, '{}') || coalesce(v_controlled, '{}');
    v_v0 := _claim_floor_visits();
    v_fast := v_controlled IS NULL AND (v_limits IS NULL OR v_kinds IS NOT NULL)
              -- (a session can turn this path off: tests/sql/test_claim_paths.py runs the same workload
              -- through both and compares what they pick, the rows they leave and the events they send)
              AND current_setting('pgjobs.claim_fast_path', true) IS DISTINCT FROM 'off';
    -- (The same key as _claim_plain's, so that a session taking both paths keeps its floors; NULL when
    -- _claim_plain takes the call: it plans with its own key, and this plan walks nothing.)
    v_key := CASE WHEN v_fast THEN v_plain::text || '|' || coalesce(v_kinds::text, '*') END;
    -- (before the plan: a scan from the front walks there first, and the net is spaced by its whole cost)
    v_t0 := clock_timestamp();
    SELECT f.* INTO v_st, v_epoch, v_why, v_full, v_rq, v_rp, v_rt, v_ri, v_rh, v_lf
      FROM _claim_floor_plan(v_plain, v_key) AS f;
    v_sf := CASE WHEN v_why IN ('epoch', 'net') AND v_fast   -- (the plan's walk gave the lease floors)
                 THEN coalesce((SELECT min(l) FROM unnest(v_lf) AS l), '-infinity')
                 WHEN v_why IS NOT NULL OR v_st ->> 'sk' IS DISTINCT FROM v_all::text THEN '-infinity'
                 WHEN _claim_lease_due(v_st ->> 's') THEN (v_st ->> 's')::timestamptz ELSE 'infinity' END;
    -- (A fair-only claim whose session keeps the queues' active counts skips it: the count it kept,
    -- under a held snapshot, saw no lease run out; fairness.sql, "Reads a claim skips for a while". So does
    -- a claim of one fair queue: the count, when it runs, settles them in its pass over jobs_active_idx.
    -- Under a held snapshot this probe passed every dead entry there too: half of the soak's probe's
    -- slowest claims, about 300 ms each 7 minutes into the hold.)
    SELECT NOT (v_plain IS NULL AND (v_fair1 OR (coalesce(current_setting('pgjobs.fair_kept', true), '') NOT IN ('', '{}')
                AND _fair_counts_fresh(v_controlled))))
           AND EXISTS (SELECT 1 FROM jobs AS j
                        WHERE j.state = 'active' AND j.queue = ANY (v_all)
                          AND j.lease_expires_at < now() AND j.lease_expires_at >= v_sf
                          AND (j.attempt >= j.max_attempts OR j.cancel_requested)),
           v_plain IS NOT NULL
           AND EXISTS (SELECT 1 FROM jobs AS j
                        WHERE j.state = 'scheduled' AND j.queue = ANY (v_plain) AND j.run_at <= now())
      INTO v_expired, v_due;
    IF v_expired THEN
        PERFORM _settle_expired(v_all);
    ELSIF v_st IS NOT NULL AND v_sf < 'infinity' THEN
        PERFORM set_config('pgjobs.claim_floor', (coalesce(v_st, '{}') || jsonb_build_object(
                               'sk', v_all::text, 's', now() - interval '300 ms'))::text, false);
    END IF;
    IF v_due THEN
        -- Twice the claim (at least 100, at most 1000): a backlog drains ahead of the claims
        -- without making one call pay for all of it.
        PERFORM _promote_scheduled(v_plain, least(1000, greatest(100, 2 * max_jobs)));
        -- It may have moved the epoch (jobs filed below this session's floors): plan again.
        SELECT f.* INTO v_st, v_epoch, v_why, v_full, v_rq, v_rp, v_rt, v_ri, v_rh, v_lf
          FROM _claim_floor_plan(v_plain, v_key) AS f;
    END IF;

    IF v_fast THEN
        -- The usual call (plain queues, any kind or kinds that bind no cap): one statement leases
        -- the jobs, sends their status events, starts their batches and returns them, with no
        -- array of rows in between. The same statement as _claim_plain's (less the scheduled
        -- jobs, promoted to pending above); kept in step by test_claim_paths.py.
        -- Pending jobs are read from the session's floors on, expired leases from its lease floor
        -- (_claim_floor_plan; from the front when it has none), and where this claim found work
        -- is recorded for the next one (_claim_floor_save, in done; below when it took nothing).
        RETURN QUERY
        WITH cand AS (
            SELECT 'p'::text AS src, r.name AS queue, p.id, p.priority, p.run_at
              FROM unnest(v_rq, v_rp, v_rt, v_ri, v_rh) AS r(name, lo, t, i, hi)
             CROSS JOIN LATERAL (
                   SELECT j.id, j.priority, j.run_at FROM jobs AS j
                    WHERE j.state = 'pending' AND j.queue = r.name
                      AND (j.priority, j.run_at, j.id) >= (r.lo, r.t, r.i) AND j.priority < r.hi
                      AND (v_kinds IS NULL OR j.kind = ANY (v_kinds))
                    ORDER BY j.priority, j.run_at, j.id
                    LIMIT max_jobs
                      FOR UPDATE SKIP LOCKED) AS p
            -- (Due scheduled jobs were made pending just before, by _promote_scheduled.)
            UNION ALL
            SELECT 'e'::text, q.name, e.id, e.priority, e.run_at
              FROM unnest(v_plain, v_lf) AS q(name, lf)
             CROSS JOIN LATERAL (
                   SELECT j.id, j.priority, j.run_at FROM jobs AS j
                    WHERE j.state = 'active' AND j.queue = q.name AND j.lease_expires_at < now()
                      AND j.lease_expires_at >= q.lf
                      AND j.attempt < j.max_attempts AND NOT j.cancel_requested
                      AND (v_kinds IS NULL OR j.kind = ANY (v_kinds))
                    ORDER BY j.priority, j.run_at, j.id
                    LIMIT max_jobs
                      FOR UPDATE SKIP LOCKED) AS e
        ), picked AS (
            SELECT c.id, c.src, c.queue, c.priority, c.run_at FROM cand AS c
             ORDER BY c.priority, c.run_at, c.id
             LIMIT max_jobs
        ), upd AS (
            UPDATE jobs AS j
               SET state = 'active',
                   attempt = j.attempt + 1,
                   lease_token = gen_random_uuid(),
                   leased_by = worker,
                   lease_expires_at = now() + lease,
                   first_started_at = coalesce(j.first_started_at, now()),
                   -- A reclaim records why the previous attempt ended.
                   errors = CASE WHEN j.state = 'active'
                                 THEN j.errors || jsonb_build_array(jsonb_build_object(
                                          'attempt', j.attempt, 'at', now(), 'worker', j.leased_by,
                                          'error', 'lease expired'))
                                 ELSE j.errors END,
                   last_error = CASE WHEN j.state = 'active' THEN 'lease expired' ELSE j.last_error END
             -- By key, from the picked ids: a plan that joins instead may read the whole primary
             -- key (a generic plan cannot know that LIMIT max_jobs is small).
             WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked)) AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])  -- jobs_live only
            RETURNING j.id, j.kind, j.queue, j.payload, j.meta, j.attempt, j.max_attempts, j.lease_token,
                      j.lease_expires_at, j.checkpoint, j.group_key, j.batch_id, j.first_started_at,
                      j.priority, j.run_at
        ), done AS MATERIALIZED (
            -- Runs once, after the update (it reads all of upd): the status events, one append to the
            -- event log (stream.sql; queues whose status_events is not 'all' log no claim), and the
            -- start of any batch whose first member this is.
            SELECT (SELECT _append_events(array_agg(u.id), array_fill('active'::job_state, ARRAY[count(*)::int]),
                                          array_agg(u.queue), array_agg(u.kind), array_agg(u.attempt),
                                          array_agg(u.batch_id))
                      FROM upd AS u
                     WHERE u.queue <> ALL (v_quiet)) AS sent,
                   (SELECT CASE WHEN bool_or(u.batch_id IS NOT NULL)
                                THEN _start_batches(array_agg(u.batch_id) FILTER (WHERE u.batch_id IS NOT NULL)) END
                      FROM upd AS u) AS started,
                   (SELECT _claim_floor_save(v_key, v_plain, v_full, v_why, v_epoch, v_t0,
                                             array_agg(p.queue) FILTER (WHERE p.src = 'p'),
                                             array_agg(p.priority) FILTER (WHERE p.src = 'p'),
                                             array_agg(p.run_at) FILTER (WHERE p.src = 'p'),
                                             array_agg(p.id) FILTER (WHERE p.src = 'p'),
                                             count(*) < max_jobs, NOT EXISTS (SELECT 1 FROM cand AS c WHERE c.src = 'e'),
                                             _claim_floor_visits() - v_v0 - count(*))
                      FROM picked AS p) AS floored
        )
        SELECT u.id, u.kind, u.queue, u.payload, u.meta, u.attempt, u.max_attempts, u.lease_token,
               u.lease_expires_at, u.checkpoint, u.group_key, u.batch_id, u.first_started_at
          FROM upd AS u
         CROSS JOIN done
         ORDER BY u.priority, u.run_at, u.id;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        IF v_n = 0 THEN
            -- Nothing taken (done did not run): every range and the lease branch came up empty.
            PERFORM _claim_floor_save(v_key, v_plain, v_full, v_why, v_epoch, v_t0,
                                      NULL, NULL, NULL, NULL, true, true, _claim_floor_visits() - v_v0);
        END IF;
        RETURN;
    END IF;

    RETURN QUERY SELECT * FROM _claim_routed(worker, v_plain, v_controlled, max_jobs, lease, v_limits);
END;
$$;

-- A claim the one-statement path does not take (a binding kind limit, controlled queues, the switch
-- off): the plain queues through _claim_plain, then the controlled ones (fairness.sql) for what is
-- left, then one statement for the status events and the batches started. (Runs with _claim_once's
-- settings: it sets none but its search_path.)
CREATE OR REPLACE FUNCTION pgjobs._claim_routed(worker text, plain_queues text[], controlled_queues text[],
                                                max_jobs int, lease interval, limits jsonb)
RETURNS SETOF pgjobs.claimed_job
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_rows claimed_job[];
    v_more claimed_job[];
BEGIN
    IF plain_queues IS NOT NULL THEN
        v_rows := _claim_plain(worker, plain_queues, max_jobs, lease, limits);
    END IF;
    IF controlled_queues IS NOT NULL AND coalesce(cardinality(v_rows), 0) < max_jobs THEN
        IF limits IS NOT NULL AND v_rows IS NOT NULL THEN
            -- What the plain path took counts against the per-call kind limits.
            SELECT jsonb_object_agg(l.key, (l.value::text)::int - coalesce(t.taken, 0)) INTO limits
              FROM jsonb_each(limits) AS l
              LEFT JOIN (SELECT r.kind, count(*)::int AS taken FROM unnest(v_rows) AS r GROUP BY r.kind) AS t
                ON t.kind = l.key;
        END IF;
        PERFORM set_config('plan_cache_mode', 'auto', true);  -- see the note at the top of this file
        v_more := _claim_controlled(worker, controlled_queues, max_jobs - coalesce(cardinality(v_rows), 0), lease, limits);
        v_rows := coalesce(v_rows, '{}') || coalesce(v_more, '{}');
    END IF;

    IF v_rows IS NULL OR cardinality(v_rows) = 0 THEN
        RETURN;
    END IF;

    -- One statement: the status events, the start of any batch whose first member this is, and
    -- the rows (the subquery runs once, before them, and is never NULL).
    RETURN QUERY
    WITH told AS (
        SELECT _notify_status_rows(array_agg(r.id), array_agg('active'::job_state), array_agg(r.queue),
                                   array_agg(r.kind), array_agg(r.attempt), array_agg(r.batch_id)) AS sent,
               CASE WHEN bool_or(r.batch_id IS NOT NULL)
                    THEN _start_batches(array_agg(r.batch_id) FILTER (WHERE r.batch_id IS NOT NULL)) END AS started
          FROM unnest(v_rows) AS r
    )
    SELECT * FROM unnest(v_rows) WHERE (SELECT count(*) FROM told) IS NOT NULL;
END;
$$;

-- A batch starts when its first member is claimed.
CREATE OR REPLACE FUNCTION pgjobs._start_batches(ids bigint[])
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    UPDATE batches AS b SET started_at = now()
     WHERE b.id = ANY (_start_batches.ids) AND b.started_at IS NULL;
    RETURN FOUND;
END;
$$;

-- The fast path: plain (unfair, uncapped) queues. One statement locks candidates from the
-- three partial indexes per queue (pending in claim order; due scheduled; expired leases),
-- keeps the best max_jobs within kind limits, and leases them.
CREATE OR REPLACE FUNCTION pgjobs._claim_plain(worker text, queues text[], max_jobs int, lease interval,
                                               kind_limits jsonb)
RETURNS pgjobs.claimed_job[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off SET enable_bitmapscan = off  -- (Plans, at the top of this file)
AS $$
#variable_conflict use_column
DECLARE
    -- What each candidate scan may take: one row (NULL kind, max_jobs) when any kind goes,
    -- else one row per listed kind with its own cap, so a kind that comes first in claim order
    -- cannot crowd out the candidates of another listed kind (the call still fills up).
    v_kinds text[] := ARRAY[NULL::text];
    v_caps  int[] := ARRAY[max_jobs];
    v_any   text[];   -- set when no listed cap is below max_jobs: one scan for all listed kinds
    v_rows  claimed_job[];
    -- The session's scan floors ("Scan floors" above): valid for these queues and this kind set.
    v_st    jsonb;
    v_epoch bigint;
    v_why   text;
    v_key   text;
    v_full  boolean;
    v_t0    timestamptz;
    v_rq    text[];
    v_rp    smallint[];
    v_rt    timestamptz[];
    v_ri    bigint[];
    v_rh    int[];
    v_lf    timestamptz[];
    v_pq    text[];
    v_pp    smallint[];
    v_pt    timestamptz[];
    v_pi    bigint[];
    v_np    int;
    v_ne    int;
    v_v0    bigint := _claim_floor_visits();
BEGIN
    IF kind_limits IS NOT NULL THEN
        SELECT array_agg(e.key), array_agg(least((e.value::text)::numeric, max_jobs)::int)
          INTO v_kinds, v_caps
          FROM jsonb_each(kind_limits) AS e
         WHERE (e.value::text)::numeric >= 1;
        IF v_kinds IS NULL THEN
            RETURN NULL;   -- only listed kinds may be taken, and none may
        END IF;
        -- No cap binds (a worker lists every kind it handles at its free capacity): no kind can
        -- crowd out another, so one scan with kind = ANY gives the same rows. Per-kind scans
        -- would each walk the queue's whole pending index when their kind has no job there
        -- (kind is not in the index): O(pending) per listed kind and per claim.
        IF cardinality(v_kinds) > 1 AND (SELECT min(c) FROM unnest(v_caps) AS c) >= max_jobs THEN
            v_any := v_kinds;
            v_kinds := ARRAY[NULL::text];
            v_caps := ARRAY[max_jobs];
        END IF;
    END IF;
    v_key := queues::text || '|' || CASE WHEN kind_limits IS NULL THEN '*'
                                         ELSE ARRAY(SELECT k FROM unnest(coalesce(v_any, v_kinds)) AS k ORDER BY k)::text END;
    v_t0 := clock_timestamp();   -- (before the plan, as in _claim_once)
    SELECT f.* INTO v_st, v_epoch, v_why, v_full, v_rq, v_rp, v_rt, v_ri, v_rh, v_lf
      FROM _claim_floor_plan(queues, v_key) AS f;
    IF kind_limits IS NULL THEN
        -- Any kind (the usual call): the statement below without the per-kind caps, which cost a
        -- window pass over the candidates.
        WITH cand AS (
            SELECT 'p'::text AS src, r.name AS queue, p.id, p.priority, p.run_at
              FROM unnest(v_rq, v_rp, v_rt, v_ri, v_rh) AS r(name, lo, t, i, hi)
             CROSS JOIN LATERAL (
                   SELECT j.id, j.priority, j.run_at FROM jobs AS j
                    WHERE j.state = 'pending' AND j.queue = r.name
                      AND (j.priority, j.run_at, j.id) >= (r.lo, r.t, r.i) AND j.priority < r.hi
                    ORDER BY j.priority, j.run_at, j.id
                    LIMIT max_jobs
                      FOR UPDATE SKIP LOCKED) AS p
            UNION ALL
            SELECT 's'::text, q.name, s.id, s.priority, s.run_at
              FROM unnest(queues) AS q(name)
             CROSS JOIN LATERAL (
                   SELECT j.id, j.priority, j.run_at FROM jobs AS j
                    WHERE j.state = 'scheduled' AND j.queue = q.name AND j.run_at <= now()
                    ORDER BY j.priority, j.run_at, j.id
                    LIMIT max_jobs
                      FOR UPDATE SKIP LOCKED) AS s
            UNION ALL
            SELECT 'e'::text, q.name, e.id, e.priority, e.run_at
              FROM unnest(queues, v_lf) AS q(name, lf)
             CROSS JOIN LATERAL (
                   SELECT j.id, j.priority, j.run_at FROM jobs AS j
                    WHERE j.state = 'active' AND j.queue = q.name AND j.lease_expires_at < now()
                      AND j.lease_expires_at >= q.lf
                      AND j.attempt < j.max_attempts AND NOT j.cancel_requested
                    ORDER BY j.priority, j.run_at, j.id
                    LIMIT max_jobs
                      FOR UPDATE SKIP LOCKED) AS e
        ), picked AS (
            SELECT c.id, c.src, c.queue, c.priority, c.run_at FROM cand AS c
             ORDER BY c.priority, c.run_at, c.id
             LIMIT max_jobs
        ), upd AS (
            UPDATE jobs AS j
               SET state = 'active',
                   attempt = j.attempt + 1,
                   lease_token = gen_random_uuid(),
                   leased_by = worker,
                   lease_expires_at = now() + lease,
                   first_started_at = coalesce(j.first_started_at, now()),
                   -- A reclaim records why the previous attempt ended.
                   errors = CASE WHEN j.state = 'active'
                                 THEN j.errors || jsonb_build_array(jsonb_build_object(
                                          'attempt', j.attempt, 'at', now(), 'worker', j.leased_by,
                                          'error', 'lease expired'))
                                 ELSE j.errors END,
                   last_error = CASE WHEN j.state = 'active' THEN 'lease expired' ELSE j.last_error END
             -- By key, from the picked ids: a plan that joins instead may read the whole primary
             -- key (a generic plan cannot know that LIMIT max_jobs is small).
             WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked)) AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])  -- jobs_live only
            RETURNING j.id, j.kind, j.queue, j.payload, j.meta, j.attempt, j.max_attempts, j.lease_token,
                      j.lease_expires_at, j.checkpoint, j.group_key, j.batch_id, j.first_started_at,
                      j.priority, j.run_at
        )
        SELECT array_agg(ROW(u.id, u.kind, u.queue, u.payload, u.meta, u.attempt, u.max_attempts, u.lease_token,
                             u.lease_expires_at, u.checkpoint, u.group_key, u.batch_id,
                             u.first_started_at)::claimed_job
                         ORDER BY u.priority, u.run_at, u.id),
               (SELECT array_agg(p.queue) FROM picked AS p WHERE p.src = 'p'),
               (SELECT array_agg(p.priority) FROM picked AS p WHERE p.src = 'p'),
               (SELECT array_agg(p.run_at) FROM picked AS p WHERE p.src = 'p'),
               (SELECT array_agg(p.id) FROM picked AS p WHERE p.src = 'p'),
               (SELECT count(*) FROM picked), (SELECT count(*) FROM cand AS c WHERE c.src = 'e')
          INTO v_rows, v_pq, v_pp, v_pt, v_pi, v_np, v_ne
          FROM upd AS u;
        v_v0 := _claim_floor_visits() - v_v0 - v_np;   -- what the scans wasted
        IF v_st IS NOT NULL OR v_v0 >= coalesce(nullif(current_setting('pgjobs.claim_floor_engage', true), '')::int, 500) THEN
            PERFORM _claim_floor_save(v_key, queues, v_full, v_why, v_epoch, v_t0, v_pq, v_pp, v_pt, v_pi,
                                      v_np < max_jobs, v_ne = 0, v_v0);
        END IF;
        RETURN v_rows;
    END IF;

    -- Every source is read in claim order (priority, run_at, id): due scheduled jobs and
    -- expired leases too, so a due job of better priority is never passed over.
    WITH k AS (
        SELECT k.kind, k.cap FROM unnest(v_kinds, v_caps) AS k(kind, cap)
    ), cand AS (
        SELECT 'p'::text AS src, r.name AS queue, p.id, p.priority, p.run_at, p.kind
          FROM unnest(v_rq, v_rp, v_rt, v_ri, v_rh) AS r(name, lo, t, i, hi)
         CROSS JOIN k
         CROSS JOIN LATERAL (
               SELECT j.id, j.priority, j.run_at, j.kind FROM jobs AS j
                WHERE j.state = 'pending' AND j.queue = r.name
                  AND (j.priority, j.run_at, j.id) >= (r.lo, r.t, r.i) AND j.priority < r.hi
                  AND (k.kind IS NULL OR j.kind = k.kind) AND (v_any IS NULL OR j.kind = ANY (v_any))
                ORDER BY j.priority, j.run_at, j.id
                LIMIT k.cap
                  FOR UPDATE SKIP LOCKED) AS p
        UNION ALL
        SELECT 's'::text, q.name, s.id, s.priority, s.run_at, s.kind
          FROM unnest(queues) AS q(name)
         CROSS JOIN k
         CROSS JOIN LATERAL (
               SELECT j.id, j.priority, j.run_at, j.kind FROM jobs AS j
                WHERE j.state = 'scheduled' AND j.queue = q.name AND j.run_at <= now()
                  AND (k.kind IS NULL OR j.kind = k.kind) AND (v_any IS NULL OR j.kind = ANY (v_any))
                ORDER BY j.priority, j.run_at, j.id
                LIMIT k.cap
                  FOR UPDATE SKIP LOCKED) AS s
        UNION ALL
        SELECT 'e'::text, q.name, e.id, e.priority, e.run_at, e.kind
          FROM unnest(queues, v_lf) AS q(name, lf)
         CROSS JOIN k
         CROSS JOIN LATERAL (
               SELECT j.id, j.priority, j.run_at, j.kind FROM jobs AS j
                WHERE j.state = 'active' AND j.queue = q.name AND j.lease_expires_at < now()
                  AND j.lease_expires_at >= q.lf
                  AND j.attempt < j.max_attempts AND NOT j.cancel_requested
                  AND (k.kind IS NULL OR j.kind = k.kind) AND (v_any IS NULL OR j.kind = ANY (v_any))
                ORDER BY j.priority, j.run_at, j.id
                LIMIT k.cap
                  FOR UPDATE SKIP LOCKED) AS e
    ), picked AS (
        SELECT r.id, r.src, r.queue, r.priority, r.run_at FROM (
            SELECT c.id, c.src, c.queue, c.priority, c.run_at,
                   row_number() OVER (PARTITION BY c.kind ORDER BY c.priority, c.run_at, c.id) AS kind_rank,
                   c.kind
              FROM cand AS c) AS r
         WHERE kind_limits IS NULL OR r.kind_rank <= (kind_limits ->> r.kind)::numeric
         ORDER BY r.priority, r.run_at, r.id
         LIMIT max_jobs
    ), upd AS (
        UPDATE jobs AS j
           SET state = 'active',
               attempt = j.attempt + 1,
               lease_token = gen_random_uuid(),
               leased_by = worker,
               lease_expires_at = now() + lease,
               first_started_at = coalesce(j.first_started_at, now()),
               -- A reclaim records why the previous attempt ended.
               errors = CASE WHEN j.state = 'active'
                             THEN j.errors || jsonb_build_array(jsonb_build_object(
                                      'attempt', j.attempt, 'at', now(), 'worker', j.leased_by,
                                      'error', 'lease expired'))
                             ELSE j.errors END,
               last_error = CASE WHEN j.state = 'active' THEN 'lease expired' ELSE j.last_error END
         -- By key, from the picked ids: a plan that joins instead may read the whole primary key.
         WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked)) AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])  -- jobs_live only
        RETURNING j.id, j.kind, j.queue, j.payload, j.meta, j.attempt, j.max_attempts, j.lease_token,
                  j.lease_expires_at, j.checkpoint, j.group_key, j.batch_id, j.first_started_at,
                  j.priority, j.run_at
    )
    SELECT array_agg(ROW(u.id, u.kind, u.queue, u.payload, u.meta, u.attempt, u.max_attempts, u.lease_token,
                         u.lease_expires_at, u.checkpoint, u.group_key, u.batch_id,
                         u.first_started_at)::claimed_job
                     ORDER BY u.priority, u.run_at, u.id),
           (SELECT array_agg(p.queue) FROM picked AS p WHERE p.src = 'p'),
           (SELECT array_agg(p.priority) FROM picked AS p WHERE p.src = 'p'),
           (SELECT array_agg(p.run_at) FROM picked AS p WHERE p.src = 'p'),
           (SELECT array_agg(p.id) FROM picked AS p WHERE p.src = 'p'),
           (SELECT count(*) FROM picked), (SELECT count(*) FROM cand AS c WHERE c.src = 'e')
      INTO v_rows, v_pq, v_pp, v_pt, v_pi, v_np, v_ne
      FROM upd AS u;
    -- Took everything only if no per-kind cap stopped a scan early (a capped kind may have more).
    -- (No floors, and none to take: no call. A session that has floors always saves.)
    v_v0 := _claim_floor_visits() - v_v0 - v_np;   -- what the scans wasted
    IF v_st IS NOT NULL OR v_v0 >= coalesce(nullif(current_setting('pgjobs.claim_floor_engage', true), '')::int, 500) THEN
        PERFORM _claim_floor_save(v_key, queues, v_full, v_why, v_epoch, v_t0, v_pq, v_pp, v_pt, v_pi,
                                  v_np < max_jobs AND (SELECT min(c) FROM unnest(v_caps) AS c) >= max_jobs, v_ne = 0,
                                  v_v0);
    END IF;
    RETURN v_rows;
END;
$$;

-- Due scheduled jobs of plain queues are filed as pending (oldest first, `how_many` per queue
-- and call), so that claims read them from the pending index in claim order. Read where they
-- were, they had to be sorted by priority on every claim: a backlog of due retries, or of jobs
-- scheduled for one instant, made each claim cost O(due jobs) (80 ms per claim at 50,000 due).
-- While no more than `how_many` are due the order is exact; beyond, what was filed first goes
-- first for a few calls. This is bookkeeping, not a transition: a due scheduled job is claimable
-- already (claim takes it), so no status event and no wake is sent; a subscriber sees the job go
-- from scheduled to active, as before.
CREATE OR REPLACE FUNCTION pgjobs._promote_scheduled(queues text[], how_many int)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_oldest timestamptz;
BEGIN
    -- (Called only when claim()'s probe found a due job: usually none is, and the UPDATE's
    -- executor start alone costs more than the probe.)
    WITH due AS (
        SELECT d.id
          FROM unnest(queues) AS q(name)
         CROSS JOIN LATERAL (
               SELECT j.id FROM jobs AS j
                WHERE j.state = 'scheduled' AND j.queue = q.name AND j.run_at <= now()
                ORDER BY j.run_at
                LIMIT how_many
                  FOR UPDATE SKIP LOCKED) AS d
    ), upd AS (
        UPDATE jobs AS j SET state = 'pending'
         WHERE j.id = ANY (ARRAY(SELECT due.id FROM due)) AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
        RETURNING j.run_at
    )
    SELECT min(upd.run_at) INTO v_oldest FROM upd;
    -- Filed with the run_at they had, which may sort below a claimer's floor ("Scan floors" above).
    PERFORM _claim_floor_note(v_oldest);
END;
$$;

-- Settles active jobs whose lease expired but that must not run again: out of attempts
-- (-> failed) or cancellation requested (-> cancelled). Bounded per call; SKIP LOCKED so two
-- claimers never settle the same job.
CREATE OR REPLACE FUNCTION pgjobs._settle_expired(queues text[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_events jsonb;
    v_follow bigint[];
BEGIN
    -- (Called only when claim()'s probe found such a job: almost always there is none, and the
    -- UPDATE's executor start alone, eight indexes to open, costs more than the probe.)
    WITH dead AS (
        SELECT d.id
          FROM unnest(queues) AS q(name)
         CROSS JOIN LATERAL (
               SELECT j.id FROM jobs AS j
                WHERE j.state = 'active' AND j.queue = q.name AND j.lease_expires_at < now()
                  AND (j.attempt >= j.max_attempts OR j.cancel_requested)
                LIMIT 100
                  FOR UPDATE SKIP LOCKED) AS d
    ), upd AS (
        UPDATE jobs AS j
           SET state = CASE WHEN j.cancel_requested THEN 'cancelled'::job_state ELSE 'failed' END,
               completed_at = now(),
               lease_token = NULL,
               lease_expires_at = NULL,
               last_error = CASE WHEN j.cancel_requested THEN j.last_error ELSE 'lease expired' END,
               errors = CASE WHEN j.cancel_requested THEN j.errors
                             ELSE j.errors || jsonb_build_array(jsonb_build_object(
                                      'attempt', j.attempt, 'at', now(), 'worker', j.leased_by,
                                      'error', 'lease expired')) END
         WHERE j.id = ANY (ARRAY(SELECT dead.id FROM dead)) AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
        RETURNING j.id, j.state, j.queue, j.kind, j.attempt, j.batch_id, j.has_dependents
    )
    SELECT jsonb_agg(jsonb_build_object('id', u.id, 'state', u.state, 'queue', u.queue, 'kind', u.kind,
                                        'attempt', u.attempt, 'batch_id', u.batch_id)),
           array_agg(u.id) FILTER (WHERE u.batch_id IS NOT NULL OR u.has_dependents)
      INTO v_events, v_follow
      FROM upd AS u;
    IF v_events IS NOT NULL THEN
        PERFORM _notify_status(v_events);
        IF v_follow IS NOT NULL THEN
            PERFORM set_config('plan_cache_mode', 'auto', true);  -- see the note at the top of this file
            PERFORM _propagate(v_follow);
        END IF;
    END IF;
END;
$$;

-- The earliest run_at of a scheduled job or lease expiry of an active job of these queues in
-- [lo, hi] (NULL: none). One body for next_due_at and next_due_within. PL/pgSQL, not SQL: a SQL
-- function with SET clauses is planned again on every call (0.3 ms, ten times its run), a PL/pgSQL
-- one keeps its plan.
CREATE OR REPLACE FUNCTION pgjobs._next_due(queues text[], lo timestamptz, hi timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    RETURN (
        SELECT min(s.t) FROM (
            SELECT (SELECT min(j.run_at) FROM jobs AS j
                     WHERE j.state = 'scheduled' AND j.queue = q.name AND j.run_at BETWEEN lo AND hi) AS t
              FROM unnest(_next_due.queues) AS q(name)
            UNION ALL
            SELECT (SELECT min(j.lease_expires_at) FROM jobs AS j
                     WHERE j.state = 'active' AND j.queue = q.name AND j.lease_expires_at BETWEEN lo AND hi)
              FROM unnest(_next_due.queues) AS q(name)
            UNION ALL
            SELECT _rate_next_due(_next_due.queues, lo, hi)   -- a limited queue's next token (rate_limits.sql)
        ) AS s);
END;
$$;

-- When the next job of these queues becomes due (NULL if none is scheduled or leased), overdue ones
-- included.
CREATE OR REPLACE FUNCTION pgjobs.next_due_at(queues text[] DEFAULT '{default}')
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN _next_due(queues, '-infinity', 'infinity');
END;
$$;

-- What the worker's poller asks (pgjobs/runtime/listener.py): the next due time from now to `within`
-- later (NULL: none). The poller sleeps until then, or its poll interval (`within`), whichever is first.
-- next_due_at's min() reads jobs_active_idx from its front: under a held snapshot that is the old
-- 'active' entry of every job completed since (millions after minutes at thousands of jobs/s, each a
-- heap fetch), and the poller asked every few seconds: in bench/soak.py at 9,500 jobs/s, 10-17
-- million entries of jobs_active_idx visited per 10 s. Bounded to the window, a call visits only the
-- entries whose lease would run out in it (the jobs claimed a lease ago, over `within`). What is
-- overdue is not its business: a claim takes it, and the poller wakes every `within` anyway.
CREATE OR REPLACE FUNCTION pgjobs.next_due_within(queues text[], within interval)
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    -- (an upper bound too: now() + within must stay a timestamp)
    IF within IS NULL OR within <= interval '0' OR within > interval '100 years' THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('within must be a positive interval of at most 100 years, got %s',
                             coalesce(within::text, 'NULL'));
    END IF;
    RETURN _next_due(queues, v_now, v_now + within);
END;
$$;
