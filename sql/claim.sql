-- Claiming work. One call leases up to max_jobs jobs to a worker: due pending/scheduled jobs
-- and active jobs whose lease expired (their worker is presumed dead), by priority, run_at, id.
-- FOR UPDATE SKIP LOCKED lets concurrent claimers pass each other instead of queueing on a
-- row lock, so no two claimers ever share a job and none waits on another.

-- Plans: the hot functions here run with plan_cache_mode = force_generic_plan (their statements' shapes are
-- fixed by index order and keys; planning each call cost more than running it) and jit = off (a generic plan
-- cannot see that LIMIT max_jobs is small, and JIT compiled every claim on a big table). They also run with
-- enable_seqscan = off and enable_bitmapscan = off: a session makes its generic plans at its first claim,
-- often on a small jobs_live, and keeps them while no ANALYZE comes (a held snapshot stops VACUUM); a
-- sequential scan or a bitmap of the queue's pending entries then reads every dead version on every claim
-- (measured in docs/design/claim.md, "Plans"; tests/sql/test_claim_plan.py). The functions they call inherit
-- these; a call into another file's functions that plan for themselves restores plan_cache_mode first.

-- Floors (docs/design/claim.md). A snapshot held by any session keeps the dead entry of every job
-- claimed since at the front of jobs_pending_idx, and the old 'active' entry of every job completed
-- since in jobs_active_idx: a claim that reads either from its front visits all of them. So a claim of a
-- plain queue reads from a floor, proven from snapshots, not from time:
-- * claim_floors holds, per queue and kind set, one row per claim: the snapshot it read with, and the
--   first pending job (priority, run_at, id), the earliest scheduled run_at and the earliest lease it saw.
-- * Every write that makes a job claimable, changes its claim key or moves its lease earlier stamps
--   jobs.filed_xid with its transaction: a column default on insert, the trigger jobs_filed on update, so
--   no write path can forget it.
-- A claim reads the newest floor row of its key, then the jobs filed since that row's snapshot S (one
-- probe of jobs_filed_idx per transaction S saw in progress and for the row's own transaction, one range
-- from S's xmax), and starts each scan at the lower of the floor and the filings. A job that S saw
-- pending sorts at or above the floor: the claim that wrote the floor scanned from below it, and a scan
-- passes a job only by taking it (the floor is the first pending job the claim saw, taken or locked by a
-- concurrent claim, so a rollback strands nothing). A job filed after S is among the filings, however long
-- its transaction was open. So whatever snapshot is held, a scan passes only the jobs taken since the
-- previous claim, and the filings read passes only what was filed since then. Every input of a claim is
-- a table row or an argument: what a claim takes never depends on its session or on a clock margin.

-- The trigger: a job made claimable, its claim key changed or its lease moved earlier is filed by the
-- transaction that did it (a lease moved later keeps every floor below it, so renewals file nothing). A
-- statement that sets filed_xid itself (the claim's lease) skips the call.
CREATE OR REPLACE FUNCTION pgjobs._job_filed()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    NEW.filed_xid := pg_current_xact_id();
    RETURN NEW;
END;
$$;
CREATE OR REPLACE TRIGGER jobs_filed BEFORE UPDATE ON pgjobs.jobs FOR EACH ROW
    WHEN (NEW.state OPERATOR(pg_catalog.=) ANY ('{pending,scheduled,active}')
          AND (NEW.state OPERATOR(pg_catalog.<>) OLD.state OR NEW.priority <> OLD.priority
               OR NEW.run_at <> OLD.run_at OR NEW.queue <> OLD.queue OR NEW.kind <> OLD.kind
               OR NEW.lease_expires_at < OLD.lease_expires_at
               OR (NEW.lease_expires_at IS NULL) <> (OLD.lease_expires_at IS NULL))
          AND NEW.filed_xid IS NOT DISTINCT FROM OLD.filed_xid)
    EXECUTE FUNCTION pgjobs._job_filed();

-- (called by _claim_unrated, below: it retries this when a row it locks moved to another partition)
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
    v_quiet      text[];   -- queues that hear nothing of a claim (status_events 'none' or 'terminal')
    v_plan       claim_plan;
    v_ledger     boolean := false;   -- one queue, capped by max_active alone: the plain path under its cap
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
    IF kind_limits IS NOT NULL THEN
        SELECT coalesce(jsonb_object_agg(e.key, least((e.value::text)::numeric, max_jobs)::int), '{}')
          INTO v_limits
          FROM jsonb_each(kind_limits) AS e;
    END IF;
    -- Paused queues give nothing. Fair queues and per-group caps take the fair claim (fair.sql);
    -- a queue capped by max_active alone takes the plain path under its cap (_claim_capped_plain); every
    -- other queue takes the plain path.
    IF cardinality(queues) = 1 THEN
        -- One queue (the usual worker): one probe of its settings row, if it has one.
        SELECT CASE WHEN NOT coalesce(c.fair OR c.max_active IS NOT NULL OR c.max_active_per_group IS NOT NULL, false)
                    THEN queues END,
               CASE WHEN coalesce(c.fair OR c.max_active IS NOT NULL OR c.max_active_per_group IS NOT NULL, false)
                    THEN queues END,
               CASE WHEN c.status_events <> 'all' THEN queues ELSE '{}' END,
               c.max_active IS NOT NULL AND NOT c.fair AND c.max_active_per_group IS NULL
          INTO v_plain, v_controlled, v_quiet, v_ledger
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

    IF v_controlled IS NULL THEN
        IF v_plain IS NOT NULL THEN
            v_plan := _claim_plan(v_plain, max_jobs, v_limits);
            IF v_plan.seq IS NOT NULL THEN  -- (NULL: no kind may be taken)
                RETURN QUERY SELECT * FROM _claim_take(worker, v_plain, max_jobs, lease, v_limits, v_quiet, v_plan);
            END IF;
        END IF;
        RETURN;
    END IF;
    IF v_ledger THEN
        RETURN QUERY SELECT * FROM _claim_capped_plain(worker, queues[1], max_jobs, lease, v_limits, v_quiet);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM _claim_routed(worker, v_plain, v_controlled, max_jobs, lease, v_limits, v_quiet);
END;
$$;

-- A claim that names controlled queues: the plain queues through _claim_take (which tells and starts what
-- it takes), then the capped and fair ones (fair.sql) for what is left, then one statement for the status
-- events and the batches started by those. (Runs with _claim_once's settings: it sets none but its
-- search_path.)
CREATE OR REPLACE FUNCTION pgjobs._claim_routed(worker text, plain_queues text[], controlled_queues text[],
                                                max_jobs int, lease interval, limits jsonb,
                                                quiet text[])
RETURNS SETOF pgjobs.claimed_job
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_rows   claimed_job[];
    v_more   claimed_job[];
    v_plan   claim_plan;
    v_ledger text[];
    v_q      text;
    v_left   jsonb := limits;
BEGIN
    IF plain_queues IS NOT NULL THEN
        v_plan := _claim_plan(plain_queues, max_jobs, limits);
        IF v_plan.seq IS NOT NULL THEN  -- (NULL: no kind may be taken)
            SELECT array_agg(c) INTO v_rows FROM _claim_take(worker, plain_queues, max_jobs, lease, limits, quiet, v_plan) AS c;
        END IF;
    END IF;
    -- Queues capped by max_active alone: the plain path under each one's cap, in name order (the locks).
    SELECT array_agg(c.queue ORDER BY c.queue) INTO v_ledger
      FROM queues AS c
     WHERE c.queue = ANY (controlled_queues) AND c.max_active IS NOT NULL AND NOT c.fair
       AND c.max_active_per_group IS NULL;
    FOREACH v_q IN ARRAY coalesce(v_ledger, '{}') LOOP
        EXIT WHEN coalesce(cardinality(v_rows), 0) >= max_jobs;
        v_left := _claim_limits_left(limits, v_rows);
        v_rows := coalesce(v_rows, '{}') || ARRAY(SELECT c FROM _claim_capped_plain(worker, v_q, max_jobs - coalesce(cardinality(v_rows), 0),
                                                                                   lease, v_left, quiet) AS c);
    END LOOP;
    -- Fair and group-capped queues, in name order (the locks), for what is left (fair.sql).
    FOREACH v_q IN ARRAY ARRAY(SELECT q FROM unnest(controlled_queues) AS q
                                WHERE q <> ALL (coalesce(v_ledger, '{}')) ORDER BY q) LOOP
        EXIT WHEN coalesce(cardinality(v_rows), 0) + coalesce(cardinality(v_more), 0) >= max_jobs;
        v_left := _claim_limits_left(limits, coalesce(v_rows, '{}') || coalesce(v_more, '{}'));
        PERFORM set_config('plan_cache_mode', 'auto', true);  -- ("Plans", at the top of this file)
        v_more := coalesce(v_more, '{}') || _claim_fair(worker, v_q, max_jobs - coalesce(cardinality(v_rows), 0)
                                                                  - coalesce(cardinality(v_more), 0), lease, v_left);
    END LOOP;
    IF v_more IS NULL OR cardinality(v_more) = 0 THEN
        RETURN QUERY SELECT * FROM unnest(v_rows);
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
          FROM unnest(v_more) AS r
    )
    SELECT * FROM unnest(coalesce(v_rows, '{}') || v_more) WHERE (SELECT count(*) FROM told) IS NOT NULL;
END;
$$;

-- The per-call kind limits less what the claim took so far (NULL: any kind).
CREATE OR REPLACE FUNCTION pgjobs._claim_limits_left(limits jsonb, taken pgjobs.claimed_job[])
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF limits IS NULL OR taken IS NULL OR cardinality(taken) = 0 THEN
        RETURN limits;
    END IF;
    RETURN (SELECT coalesce(jsonb_object_agg(l.key, (l.value::text)::int - coalesce(t.taken, 0)), '{}')
              FROM jsonb_each(limits) AS l
              LEFT JOIN (SELECT r.kind, count(*)::int AS taken FROM unnest(taken) AS r GROUP BY r.kind) AS t
                ON t.kind = l.key);
END;
$$;

-- A claim of one queue capped by max_active alone (not fair, no per-group cap): the plain claim's plan and
-- take, under the queue's advisory lock, for at most max_active less its active jobs, read from the ledger
-- (caps.sql). The lock serialises its claimers: under READ COMMITTED each statement after it sees every job
-- leased by the claims before, so the cap is never overshot; it lasts to the end of the claim's transaction.
CREATE OR REPLACE FUNCTION pgjobs._claim_capped_plain(worker text, queue text, max_jobs int, lease interval,
                                                      kind_limits jsonb, quiet text[])
RETURNS SETOF pgjobs.claimed_job
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off SET enable_bitmapscan = off  -- (Plans, at the top of this file)
AS $$
#variable_conflict use_column
DECLARE
    v_cfg  queues;
    v_plan claim_plan;
    v_low  record;
    v_room int;
BEGIN
    PERFORM _cap_lock(queue);
    -- The settings as of now: a configure_queue may have committed while this claim waited.
    SELECT * INTO v_cfg FROM queues AS c WHERE c.queue = _claim_capped_plain.queue;
    IF NOT FOUND OR v_cfg.paused THEN
        RETURN;
    ELSIF v_cfg.max_active IS NULL OR v_cfg.fair OR v_cfg.max_active_per_group IS NOT NULL THEN
        RETURN QUERY SELECT * FROM _claim_routed(
            worker, CASE WHEN v_cfg.max_active IS NULL AND NOT v_cfg.fair AND v_cfg.max_active_per_group IS NULL
                         THEN ARRAY[queue] END,
            CASE WHEN v_cfg.max_active IS NOT NULL OR v_cfg.fair OR v_cfg.max_active_per_group IS NOT NULL
                 THEN ARRAY[queue] ELSE '{}' END,
            max_jobs, lease, kind_limits, quiet);
        RETURN;
    END IF;
    v_plan := _claim_plan(ARRAY[queue], max_jobs, kind_limits);
    IF v_plan.seq IS NULL THEN
        RETURN;  -- no kind may be taken
    END IF;
    IF v_plan.l[1] < now() THEN
        SELECT * INTO v_low FROM _requeue_expired(queue, v_plan.l[1]);
        -- They keep their place in claim order, which may sort below the pending start: lowered to them.
        IF v_low.i IS NOT NULL AND (v_plan.p[1] IS NULL OR (v_low.p, v_low.t, v_low.i) < (v_plan.p[1], v_plan.t[1], v_plan.i[1])) THEN
            v_plan.p[1] := v_low.p;
            v_plan.t[1] := v_low.t;
            v_plan.i[1] := v_low.i;
        END IF;
    END IF;
    v_room := v_cfg.max_active - _cap_active(queue);
    IF v_room <= 0 THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM _claim_take(worker, ARRAY[queue], least(max_jobs, v_room), lease, kind_limits, quiet, v_plan);
END;
$$;

-- The plan of a claim of plain queues (neither fair nor capped), NULL when kind_limits let no kind be taken:
-- * the candidate scans: one (any kind, or no listed cap binds: one scan for all listed kinds) or one per
--   listed kind with its own cap, so that a kind that comes first in claim order cannot crowd out another;
-- * where each scan starts (see "Floors"), per queue in the order given: the lower of the newest floor row
--   of the key (the queue and the kind set, '*' for any kind) and the jobs filed since its snapshot; no floor
--   yet, from the front. p NULL: no pending job to read; s NULL: no scheduled job; l NULL: no active job.
--   snap is the snapshot of the statement that read the filings, which the claim's floor row records.
-- Then, from those starts, due scheduled jobs are promoted to pending (they keep their run_at, which may sort
-- below a pending start: it is lowered to them), and expired leases that must not run again are settled.
CREATE OR REPLACE FUNCTION pgjobs._claim_plan(queues text[], max_jobs int, kind_limits jsonb)
RETURNS pgjobs.claim_plan
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off SET enable_bitmapscan = off  -- (Plans, at the top of this file)
AS $$
#variable_conflict use_column
DECLARE
    v       claim_plan := ROW(ARRAY[NULL::text], ARRAY[max_jobs], NULL, '*', nextval('pgjobs.claim_floors_seq'),
                              NULL, NULL, NULL, NULL, NULL, NULL)::claim_plan;
    v_f     text[];   -- the pending jobs' kind filter (NULL: any)
    v_due   boolean;  -- a scheduled start is due
    v_lapse boolean;  -- a lease start has passed
BEGIN
    IF kind_limits IS NOT NULL THEN
        SELECT array_agg(e.key ORDER BY e.key), array_agg(least((e.value::text)::numeric, max_jobs)::int ORDER BY e.key)
          INTO v.kinds, v.caps
          FROM jsonb_each(kind_limits) AS e
         WHERE (e.value::text)::numeric >= 1;
        IF v.kinds IS NULL THEN
            RETURN NULL;   -- only listed kinds may be taken, and none may
        END IF;
        v.key := v.kinds::text;
        v_f := v.kinds;
        IF (SELECT min(c) FROM unnest(v.caps) AS c) >= max_jobs THEN
            v.any_kinds := v.kinds;
            v.kinds := ARRAY[NULL::text];
            v.caps := ARRAY[max_jobs];
        END IF;
    END IF;
    -- One statement: the snapshot recorded is the one the filings are read with.
    SELECT pg_current_snapshot(),
           array_agg(CASE WHEN f.seq IS NULL THEN -32768 WHEN c.lo THEN m.p ELSE f.p END ORDER BY q.ord),
           array_agg(CASE WHEN f.seq IS NULL THEN '-infinity' WHEN c.lo THEN m.t ELSE f.t END ORDER BY q.ord),
           array_agg(CASE WHEN f.seq IS NULL THEN 0 WHEN c.lo THEN m.i ELSE f.i END ORDER BY q.ord),
           array_agg(c.s ORDER BY q.ord), array_agg(c.l ORDER BY q.ord), bool_or(c.s <= now()), bool_or(c.l < now())
      INTO v.snap, v.p, v.t, v.i, v.s, v.l, v_due, v_lapse
      FROM unnest(queues) WITH ORDINALITY AS q(name, ord)
      LEFT JOIN LATERAL (
            SELECT f.seq, f.snap, f.own, f.p, f.t, f.i, f.sched, f.lease FROM claim_floors AS f
             WHERE f.queue = q.name AND f.kinds = v.key
             ORDER BY f.seq DESC
             LIMIT 1) AS f ON true
      LEFT JOIN LATERAL (
            SELECT (array_agg(z.priority ORDER BY z.priority, z.run_at, z.id) FILTER (WHERE z.pend))[1] AS p,
                   (array_agg(z.run_at ORDER BY z.priority, z.run_at, z.id) FILTER (WHERE z.pend))[1] AS t,
                   (array_agg(z.id ORDER BY z.priority, z.run_at, z.id) FILTER (WHERE z.pend))[1] AS i,
                   min(z.run_at) FILTER (WHERE z.state = 'scheduled') AS sched,
                   min(z.lease_expires_at) FILTER (WHERE z.state = 'active') AS lease
              FROM (SELECT y.state, y.run_at, y.priority, y.id, y.lease_expires_at,
                           y.state = 'pending' AND (v_f IS NULL OR y.kind = ANY (v_f)) AS pend
                      FROM (-- The transactions in progress at the floor's snapshot, and the floor's own
                            -- (its later writes are in neither), probed one by one: a session that holds an
                            -- xid sits in every snapshot's list and costs one probe, not a range from xmin.
                            SELECT x.xid FROM pg_snapshot_xip(f.snap) AS x(xid)
                            UNION
                            SELECT f.own WHERE f.own < pg_snapshot_xmax(f.snap)) AS x
                     CROSS JOIN LATERAL (
                           SELECT j.state, j.kind, j.run_at, j.priority, j.id, j.lease_expires_at FROM jobs AS j
                            WHERE j.state = ANY ('{pending,scheduled,active}'::job_state[]) AND j.queue = q.name
                              AND j.filed_xid = x.xid
                           OFFSET 0) AS y
                    UNION ALL
                    SELECT j.state, j.run_at, j.priority, j.id, j.lease_expires_at,
                           j.state = 'pending' AND (v_f IS NULL OR j.kind = ANY (v_f))
                      FROM jobs AS j
                     WHERE j.state = ANY ('{pending,scheduled,active}'::job_state[]) AND j.queue = q.name
                       AND j.filed_xid >= pg_snapshot_xmax(f.snap)) AS z) AS m ON f.seq IS NOT NULL
     CROSS JOIN LATERAL (
           SELECT f.p IS NULL OR (m.p, m.t, m.i) < (f.p, f.t, f.i) AS lo,
                  CASE WHEN f.seq IS NULL THEN '-infinity' ELSE least(f.sched, m.sched) END AS s,
                  CASE WHEN f.seq IS NULL THEN '-infinity' ELSE least(f.lease, m.lease) END AS l) AS c;
    IF v_due THEN
        SELECT array_agg(CASE WHEN m.lo THEN m.priority ELSE r.p END ORDER BY r.ord),
               array_agg(CASE WHEN m.lo THEN m.run_at ELSE r.t END ORDER BY r.ord),
               array_agg(CASE WHEN m.lo THEN m.id ELSE r.i END ORDER BY r.ord)
          INTO v.p, v.t, v.i
          FROM unnest(queues, v.p, v.t, v.i) WITH ORDINALITY AS r(name, p, t, i, ord)
          LEFT JOIN (SELECT d.*, true AS lo
                       FROM _promote_scheduled(queues, least(1000, greatest(100, 2 * max_jobs)), v.s) AS d) AS m
            ON m.queue = r.name AND (r.p IS NULL OR (m.priority, m.run_at, m.id) < (r.p, r.t, r.i));
    END IF;
    IF v_lapse THEN
        PERFORM _settle_expired(queues, v.l);
    END IF;
    IF v.seq % 512 = 0 AND v.seq / 4096 % 2 = 1 THEN
        PERFORM _slots_rotate('claim_floors', '{queue,kinds}', (v.seq / 8192 % 2)::smallint);
    END IF;
    RETURN v;
END;
$$;

-- The claim of plain queues, from its plan (_claim_plan): one statement locks the candidates (pending jobs
-- from the floor in claim order, expired leases from the lease floor), keeps the best max_jobs within the
-- kind limits, leases them, sends their status events (none for quiet queues), starts their batches, and
-- appends the floor rows: the first pending job, scheduled run_at and lease this claim saw from its starts.
CREATE OR REPLACE FUNCTION pgjobs._claim_take(worker text, queues text[], max_jobs int, lease interval,
                                              kind_limits jsonb, quiet text[], plan pgjobs.claim_plan)
RETURNS SETOF pgjobs.claimed_job
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off SET enable_bitmapscan = off  -- (Plans, at the top of this file)
AS $$
#variable_conflict use_column
DECLARE
    v_any    text[] := plan.any_kinds;
    v_filter text[] := CASE WHEN plan.key <> '*' THEN coalesce(plan.any_kinds, plan.kinds) END;
BEGIN
    RETURN QUERY
    WITH k AS (
        SELECT k.kind, k.cap FROM unnest(plan.kinds, plan.caps) AS k(kind, cap)
    ), r AS (
        SELECT r.* FROM unnest(queues, plan.p, plan.t, plan.i, plan.s, plan.l) AS r(name, p, t, i, s, l)
    ), cand AS (
        SELECT 'p'::text AS src, r.name AS queue, c.id, c.priority, c.run_at, c.kind
          FROM r
         CROSS JOIN k
         CROSS JOIN LATERAL (
               SELECT j.id, j.priority, j.run_at, j.kind FROM jobs AS j
                WHERE j.state = 'pending' AND j.queue = r.name AND (j.priority, j.run_at, j.id) >= (r.p, r.t, r.i)
                  AND (k.kind IS NULL OR j.kind = k.kind) AND (v_any IS NULL OR j.kind = ANY (v_any))
                ORDER BY j.priority, j.run_at, j.id
                LIMIT k.cap
                  FOR UPDATE SKIP LOCKED) AS c
         WHERE r.p IS NOT NULL
        UNION ALL
        SELECT 'e'::text, r.name, e.id, e.priority, e.run_at, e.kind
          FROM r
         CROSS JOIN k
         CROSS JOIN LATERAL (
               SELECT j.id, j.priority, j.run_at, j.kind FROM jobs AS j
                WHERE j.state = 'active' AND j.queue = r.name AND j.lease_expires_at >= r.l
                  AND j.lease_expires_at < now() AND j.attempt < j.max_attempts AND NOT j.cancel_requested
                  AND (k.kind IS NULL OR j.kind = k.kind) AND (v_any IS NULL OR j.kind = ANY (v_any))
                ORDER BY j.priority, j.run_at, j.id
                LIMIT k.cap
                  FOR UPDATE SKIP LOCKED) AS e
         WHERE r.l < now()
    ), picked AS (
        SELECT c.id FROM (
            SELECT c.id, c.priority, c.run_at, c.kind,
                   row_number() OVER (PARTITION BY c.kind ORDER BY c.priority, c.run_at, c.id) AS kind_rank
              FROM cand AS c) AS c
         WHERE v_filter IS NULL OR v_any IS NOT NULL OR c.kind_rank <= (kind_limits ->> c.kind)::numeric
         ORDER BY c.priority, c.run_at, c.id
         LIMIT max_jobs
    ), upd AS (
        UPDATE jobs AS j
           SET state = 'active',
               attempt = j.attempt + 1,
               lease_token = gen_random_uuid(),
               leased_by = worker,
               lease_expires_at = now() + lease,
               filed_xid = pg_current_xact_id(),   -- (set here, the trigger jobs_filed passes the row)
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
    ), floor AS (
        -- In this statement's snapshot, where the jobs this claim takes are pending still: the first pending
        -- job from the start, taken or locked or not. The lease start stays a lower bound while it lies ahead
        -- (leases move later unfiled): read again once passed, and by every 8th claim (eight claims' worth).
        INSERT INTO claim_floors (slot, seq, queue, kinds, snap, own, p, t, i, sched, lease)
        SELECT (plan.seq / 8192 % 2)::smallint, plan.seq, r.name, plan.key, plan.snap, pg_current_xact_id(),
               h.priority, h.run_at, h.id, s.run_at,
               CASE WHEN r.l < now() OR plan.seq % 8 = 0 THEN a.lease_expires_at ELSE r.l END
          FROM r
          LEFT JOIN LATERAL (
                SELECT j.priority, j.run_at, j.id FROM jobs AS j
                 WHERE j.state = 'pending' AND j.queue = r.name AND (j.priority, j.run_at, j.id) >= (r.p, r.t, r.i)
                   AND (v_filter IS NULL OR j.kind = ANY (v_filter))
                 ORDER BY j.priority, j.run_at, j.id
                 LIMIT 1) AS h ON r.p IS NOT NULL
          LEFT JOIN LATERAL (
                SELECT j.run_at FROM jobs AS j
                 WHERE j.state = 'scheduled' AND j.queue = r.name AND j.run_at >= r.s
                 ORDER BY j.run_at
                 LIMIT 1) AS s ON r.s IS NOT NULL
          LEFT JOIN LATERAL (
                SELECT j.lease_expires_at FROM jobs AS j
                 WHERE j.state = 'active' AND j.queue = r.name AND j.lease_expires_at >= r.l
                 ORDER BY j.lease_expires_at
                 LIMIT 1) AS a ON r.l < now() OR plan.seq % 8 = 0
        RETURNING 1
    ), done AS MATERIALIZED (
        -- Runs once, after the update (it reads all of upd): the status events, one append to the
        -- event log (stream.sql; queues whose status_events is not 'all' log no claim), and the
        -- start of any batch whose first member this is.
        SELECT (SELECT _append_events(array_agg(u.id), array_fill('active'::job_state, ARRAY[count(*)::int]),
                                      array_agg(u.queue), array_agg(u.kind), array_agg(u.attempt),
                                      array_agg(u.batch_id))
                  FROM upd AS u
                 WHERE u.queue <> ALL (quiet)) AS sent,
               (SELECT CASE WHEN bool_or(u.batch_id IS NOT NULL)
                            THEN _start_batches(array_agg(u.batch_id) FILTER (WHERE u.batch_id IS NOT NULL)) END
                  FROM upd AS u) AS started
    )
    SELECT u.id, u.kind, u.queue, u.payload, u.meta, u.attempt, u.max_attempts, u.lease_token,
           u.lease_expires_at, u.checkpoint, u.group_key, u.batch_id, u.first_started_at
      FROM upd AS u
     CROSS JOIN done
     ORDER BY u.priority, u.run_at, u.id;
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

-- _claim_once in a retry loop: the claim of queues without a rate limit. FOR UPDATE SKIP LOCKED skips a
-- row that is locked, but a row that was moved to history after the claim's snapshot (its holder completed
-- it, or a cancel ended it) is not locked any more: locking it raises 40001 "tuple to be locked was already moved to
-- another partition" in READ COMMITTED, where a plain table would have re-checked it and skipped it.
-- The claim runs again (its subtransaction undone), in a snapshot where that job is history.
-- _claim_once returns its rows only when it has them all, so a failed turn returned nothing.
CREATE OR REPLACE FUNCTION pgjobs._claim_unrated(worker text, queues text[], max_jobs int, lease interval,
                                                 kind_limits jsonb)
RETURNS SETOF pgjobs.claimed_job
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    FOR i IN 1..20 LOOP
        BEGIN
            RETURN QUERY SELECT * FROM _claim_once(worker, queues, max_jobs, lease, kind_limits);
            RETURN;
        EXCEPTION WHEN serialization_failure THEN
            PERFORM _lost_race(i, SQLERRM);  -- (sql/races.sql)
        END;
    END LOOP;
END;
$$;

-- A claim of queues under a limit (pgjobs.claim sends it here when _rate_applies). Queue limits: their
-- locks are taken first, in queue order, and held to the end; a queue without a token is not claimed, one
-- with fewer tokens than the call's room is claimed alone, for its tokens. Key limits: _rate_admit checks
-- what the claim took; a key that ran short has its backlog held back (_rate_hold) and the claim runs
-- again, in a subtransaction that undid the first, so it returns the other claimable jobs (at most 8
-- turns; each holds back at least one job, or another claim took the tokens meanwhile; a claim whose 8th
-- turn still finds a key short returns nothing, and the next claim goes on from the jobs held back).
CREATE OR REPLACE FUNCTION pgjobs._claim_rated(worker text, queues text[], max_jobs int, lease interval,
                                               kind_limits jsonb)
RETURNS SETOF pgjobs.claimed_job
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_free  text[];    -- queues without a limit, claimed together
    v_lq    text[];    -- limited queues with tokens, in queue order
    v_lt    int[];     -- their tokens
    v_rows  claimed_job[];
    v_more  claimed_job[];
    v_kinds jsonb;
    v_short jsonb;
    v_tok   int;
    r       record;
BEGIN
    FOR r IN SELECT DISTINCT q.name, (l.key IS NOT NULL) AS limited
               FROM unnest(queues) AS q(name)
               LEFT JOIN rate_limits AS l ON l.scope = 'queue' AND l.key = q.name
              ORDER BY q.name LOOP
        IF NOT r.limited THEN
            v_free := array_append(v_free, r.name);
            CONTINUE;
        END IF;
        PERFORM _rate_lock('queue', r.name);
        v_tok := (_rate_window('queue', r.name, now(), max_jobs)).tokens;
        IF v_tok > 0 THEN
            v_lq := array_append(v_lq, r.name);
            v_lt := array_append(v_lt, v_tok);
        END IF;
    END LOOP;
    -- (the unlimited queues in the caller's order: it is their claim order)
    v_free := ARRAY(SELECT q FROM unnest(queues) WITH ORDINALITY AS x(q, o) WHERE q = ANY (v_free) ORDER BY o);
    FOR turn IN 1..8 LOOP
        BEGIN
            v_rows := '{}';
            v_kinds := kind_limits;
            -- The limited queues first, each for its tokens, then the others together for the rest.
            FOR i IN 1..coalesce(cardinality(v_lq), 0) + 1 LOOP
                EXIT WHEN cardinality(v_rows) >= max_jobs;
                CONTINUE WHEN i > coalesce(cardinality(v_lq), 0) AND cardinality(v_free) = 0;
                IF v_kinds IS NOT NULL AND cardinality(v_rows) > 0 THEN   -- what was taken counts against them
                    SELECT jsonb_object_agg(l.key, (l.value::text)::numeric - coalesce(t.n, 0)) INTO v_kinds
                      FROM jsonb_each(kind_limits) AS l
                      LEFT JOIN (SELECT c.kind, count(*) AS n FROM unnest(v_rows) AS c GROUP BY c.kind) AS t
                        ON t.kind = l.key;
                END IF;
                IF i <= coalesce(cardinality(v_lq), 0) THEN
                    v_more := ARRAY(SELECT c FROM _claim_unrated(worker, ARRAY[v_lq[i]], least(v_lt[i], max_jobs - cardinality(v_rows)),
                                                        lease, v_kinds) AS c);
                    PERFORM _rate_take('queue', v_lq[i], cardinality(v_more), now());
                ELSE
                    v_more := ARRAY(SELECT c FROM _claim_unrated(worker, v_free, max_jobs - cardinality(v_rows), lease, v_kinds) AS c);
                END IF;
                v_rows := v_rows || v_more;
            END LOOP;
            v_short := CASE WHEN cardinality(v_rows) > 0 THEN _rate_admit(v_rows) END;
            IF v_short IS NOT NULL THEN
                RAISE EXCEPTION USING ERRCODE = 'PJ901', MESSAGE = 'a key ran short of tokens: hold back, claim again';
            END IF;
            RETURN QUERY SELECT * FROM unnest(v_rows);
            RETURN;
        EXCEPTION WHEN SQLSTATE 'PJ901' THEN
            -- (twice as many each turn: a backlog of a key in front of the other jobs, 255,000 deep at
            -- most, is held back within the turns)
            PERFORM _rate_hold(v_short, queues, greatest(1000, 4 * max_jobs) * (2 ^ (turn - 1))::int);
        END;
    END LOOP;
END;
$$;

-- The claim: through _claim_rated when a rate limit may apply (its tokens are taken with the jobs), else
-- _claim_unrated.
CREATE OR REPLACE FUNCTION pgjobs.claim(
    worker      text,
    queues      text[] DEFAULT '{default}',
    max_jobs    int DEFAULT 1,
    lease       interval DEFAULT '30 seconds',
    kind_limits jsonb DEFAULT NULL)
RETURNS SETOF pgjobs.claimed_job
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF _rate_applies(queues) THEN   -- (rate_limits.sql)
        RETURN QUERY SELECT * FROM _claim_rated(worker, queues, max_jobs, lease, kind_limits);
    ELSE
        RETURN QUERY SELECT * FROM _claim_unrated(worker, queues, max_jobs, lease, kind_limits);
    END IF;
END;
$$;
