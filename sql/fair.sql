-- Fair queues and per-group caps (docs/design/claim.md, "Fair queues as built"), on the plain claim's
-- model: every input of a claim is a table row or an argument, and what a claim reads does not grow with
-- the jobs done since a snapshot someone holds.
--
-- Claims of one fair or group-capped queue run one at a time, under the queue's advisory xact lock (the
-- key the capped plain claim takes). That makes the counts exact, and it lets each claim write the whole
-- state of the ring for the next one: one insert-only row of fair_rings per claim, the newest of a queue
-- found by one backward index descent, old rows gone by TRUNCATE of the other slot.
--
-- One claim (_claim_fair):
--  1. the lock; the settings read again; the queue's newest ring row: its snapshot S, the groups with
--     work (virtual time, last serve, head floor), the scheduled and lease starts;
--  2. from those starts, due scheduled jobs promoted and expired leases settled or put back to pending;
--  3. the jobs filed since S (claim.sql, "Floors"): groups that got work and floors lowered, in the
--     statement whose snapshot the new row records;
--  4. the active jobs, in all and per group, from the ledger (caps.sql);
--  5. picks, each one as if the groups were ranked again (DESIGN.md): a group at its cap is passed;
--     non-noisy groups first (noisy: at least noisy_min_active active and more than noisy_share of the
--     queue's; among the noisy, fewer active first); then the lowest virtual time; then the least recently
--     served; then the head's priority, run_at, id. In rounds: one sort into an order of picks, the jobs of
--     its groups read from their floors (jobs_group_idx; ungrouped jobs, one more group, on
--     jobs_pending_idx) and locked SKIP LOCKED in one statement, a walk of the order; a group with no pending
--     job leaves the ring until a filing brings it back;
--  6. the picks leased in one statement, and the new ring row.
-- Virtual time: serving a group moves its time to max(its time, the ring's) + 1 / weight, and the ring's
-- time to the served group's start. A group back from idle starts at the ring's time: it neither starves
-- nor floods. With every weight 1 this is round robin, least recently served first.
-- Bounded: the ring row is one descent; the filings read are those since the previous claim; a head read
-- passes only the jobs its group lost since the previous claim (at most a claim's room); the counts read
-- the ledger since a checkpoint. A group at its cap is passed by its count, never by a read limit, so no
-- number of capped groups hides a claimable one.
-- Known costs: a ring row holds every group with work (about 40 bytes a group), so a claim is linear in
-- those groups in memory; the ungrouped jobs of a mostly grouped queue are read on jobs_pending_idx past
-- the grouped ones.

-- The newest ring row of a fair queue (all NULL: none yet).
CREATE OR REPLACE FUNCTION pgjobs._fair_ring(queue text)
RETURNS pgjobs.fair_rings
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v fair_rings;
BEGIN
    SELECT * INTO v FROM fair_rings AS r WHERE r.queue = _fair_ring.queue ORDER BY r.seq DESC LIMIT 1;
    RETURN v;
END;
$$;

-- The groups in a fair queue's ring (those with pending work at its last claim): when each was last served,
-- its place in the serving order (the ring's serve count then; 0: never) and its weight. For the dashboard
-- and `pgjobs status`.
CREATE OR REPLACE FUNCTION pgjobs.fair_ring_groups(queue text)
RETURNS TABLE (group_key text, last_served_at timestamptz, served bigint, weight real)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v fair_rings;
BEGIN
    PERFORM _check_name('queue', queue);
    v := _fair_ring(queue);
    RETURN QUERY
    SELECT r.g, nullif(r.at, '-infinity'), r.served, coalesce(w.weight, 1)   -- (never served: NULL)
      FROM unnest(v.g, v.g_at, v.g_served) AS r(g, at, served)
      LEFT JOIN fair_weights AS w ON w.queue = fair_ring_groups.queue AND w.group_key = r.g;
END;
$$;

-- A queue without a ring row (its first fair claim, or the settings just changed): every group with a
-- pending job, by a skip scan of jobs_group_idx, and the ungrouped head. Read once; later claims read filings.
CREATE OR REPLACE FUNCTION pgjobs._fair_groups_now(queue text)
RETURNS pgjobs.fair_group[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN ARRAY(
        WITH RECURSIVE gs(g) AS (
            (SELECT j.group_key FROM jobs AS j
              WHERE j.state = 'pending' AND j.queue = _fair_groups_now.queue AND j.group_key IS NOT NULL
              ORDER BY j.group_key LIMIT 1)
            UNION ALL
            SELECT (SELECT j.group_key FROM jobs AS j
                     WHERE j.state = 'pending' AND j.queue = _fair_groups_now.queue AND j.group_key > gs.g
                     ORDER BY j.group_key LIMIT 1)
              FROM gs WHERE gs.g IS NOT NULL
        )
        SELECT ROW(h.g, NULL, 0, '-infinity', h.p, h.t, h.i, 1, 0, 'new', NULL, NULL, NULL)::fair_group
          FROM (SELECT gs.g, x.priority AS p, x.run_at AS t, x.id AS i FROM gs
                 CROSS JOIN LATERAL (
                       SELECT j.priority, j.run_at, j.id FROM jobs AS j
                        WHERE j.state = 'pending' AND j.queue = _fair_groups_now.queue AND j.group_key = gs.g
                        ORDER BY j.priority, j.run_at, j.id LIMIT 1) AS x
                 WHERE gs.g IS NOT NULL
                UNION ALL
                (SELECT NULL, j.priority, j.run_at, j.id FROM jobs AS j
                  WHERE j.state = 'pending' AND j.queue = _fair_groups_now.queue AND j.group_key IS NULL
                  ORDER BY j.priority, j.run_at, j.id LIMIT 1)) AS h);
END;
$$;

-- Groups with pending jobs found (heads g, p, t, i: the first of each group) merged into a ring's groups: a
-- group not in it joins (never served, at the ring's time), a floor above a head is lowered to it.
CREATE OR REPLACE FUNCTION pgjobs._fair_merge(c pgjobs.fair_group[], g text[], p smallint[], t timestamptz[],
                                              i bigint[])
RETURNS pgjobs.fair_group[]
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF g IS NULL OR cardinality(g) = 0 THEN
        RETURN c;
    END IF;
    RETURN ARRAY(
        SELECT ROW(coalesce(o.g, h.g), o.vt, coalesce(o.served, 0), coalesce(o.at, '-infinity'),
                   m.p, m.t, m.i, 1, 0, 'new', NULL, NULL, NULL)::fair_group
          FROM unnest(c) AS o
          FULL JOIN (SELECT DISTINCT ON (x.g) x.* FROM unnest(g, p, t, i) AS x(g, p, t, i)
                      ORDER BY x.g, x.p, x.t, x.i) AS h
            ON (o.g IS NULL, coalesce(o.g, '')) = (h.g IS NULL, coalesce(h.g, ''))
         CROSS JOIN LATERAL (
               SELECT CASE WHEN o.p IS NULL OR (h.p, h.t, h.i) < (o.p, o.t, o.i) THEN h.p ELSE o.p END AS p,
                      CASE WHEN o.p IS NULL OR (h.p, h.t, h.i) < (o.p, o.t, o.i) THEN h.t ELSE o.t END AS t,
                      CASE WHEN o.p IS NULL OR (h.p, h.t, h.i) < (o.p, o.t, o.i) THEN h.i ELSE o.i END AS i) AS m);
END;
$$;

-- Step 3: the ring row's groups with the jobs filed since its snapshot merged in (_fair_merge), the
-- scheduled and lease starts lowered to the filings; snap is the snapshot this read was made with, which
-- the claim's ring row records.
CREATE OR REPLACE FUNCTION pgjobs._fair_start(queue text, ring pgjobs.fair_rings,
                                              OUT snap pg_snapshot, OUT own xid8, OUT groups pgjobs.fair_group[],
                                              OUT sched timestamptz, OUT lease timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off SET enable_bitmapscan = off  -- (claim.sql, "Plans")
AS $$
#variable_conflict use_column
DECLARE
    v_g text[];
    v_p smallint[];
    v_t timestamptz[];
    v_i bigint[];
BEGIN
    IF ring.seq IS NULL THEN
        SELECT pg_current_snapshot(), pg_current_xact_id_if_assigned(), _fair_groups_now(queue), '-infinity', '-infinity'
          INTO snap, own, groups, sched, lease;
        RETURN;
    END IF;
    WITH z AS MATERIALIZED (
        SELECT y.* FROM (SELECT x.xid FROM pg_snapshot_xip(ring.snap) AS x(xid)
                         UNION
                         SELECT ring.own WHERE ring.own < pg_snapshot_xmax(ring.snap)) AS x
         CROSS JOIN LATERAL (
               SELECT j.state, j.group_key, j.priority, j.run_at, j.id, j.lease_expires_at FROM jobs AS j
                WHERE j.state = ANY ('{pending,scheduled,active}'::job_state[]) AND j.queue = _fair_start.queue
                  AND j.filed_xid = x.xid
               OFFSET 0) AS y
        UNION ALL
        SELECT j.state, j.group_key, j.priority, j.run_at, j.id, j.lease_expires_at FROM jobs AS j
         WHERE j.state = ANY ('{pending,scheduled,active}'::job_state[]) AND j.queue = _fair_start.queue
           AND j.filed_xid >= pg_snapshot_xmax(ring.snap)
    )
    SELECT pg_current_snapshot(), pg_current_xact_id_if_assigned(),
           (SELECT array_agg(z.group_key) FROM z WHERE z.state = 'pending'),
           (SELECT array_agg(z.priority) FROM z WHERE z.state = 'pending'),
           (SELECT array_agg(z.run_at) FROM z WHERE z.state = 'pending'),
           (SELECT array_agg(z.id) FROM z WHERE z.state = 'pending'),
           least(ring.sched, (SELECT min(z.run_at) FROM z WHERE z.state = 'scheduled')),
           least(ring.lease, (SELECT min(z.lease_expires_at) FROM z WHERE z.state = 'active'))
      INTO snap, own, v_g, v_p, v_t, v_i, sched, lease;
    groups := _fair_merge(
        ARRAY(SELECT ROW(o.g, o.vt, o.served, o.at, o.p, o.t, o.i, 1, 0, 'new', NULL, NULL, NULL)::fair_group
                FROM unnest(ring.g, ring.g_vt, ring.g_served, ring.g_at, ring.g_p, ring.g_t, ring.g_i)
                     AS o(g, vt, served, at, p, t, i)),
        v_g, v_p, v_t, v_i);
END;
$$;

-- Step 2, after 3: due scheduled jobs promoted and expired leases settled or put back to pending, from the
-- starts the filings lowered; the jobs this made pending (this transaction's filings) merged into the groups.
CREATE OR REPLACE FUNCTION pgjobs._fair_due(queue text, groups pgjobs.fair_group[], sched timestamptz,
                                            lease timestamptz, how_many int)
RETURNS pgjobs.fair_group[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off SET enable_bitmapscan = off  -- (claim.sql, "Plans")
AS $$
#variable_conflict use_column
DECLARE
    v_n int := 0;
    v_g text[];
    v_p smallint[];
    v_t timestamptz[];
    v_i bigint[];
BEGIN
    IF sched <= now() THEN
        SELECT count(*) INTO v_n FROM _promote_scheduled(ARRAY[queue], how_many, ARRAY[sched]);
    END IF;
    IF lease < now() THEN
        PERFORM _settle_expired(ARRAY[queue], ARRAY[lease]);
        v_n := v_n + (SELECT count(r.i) FROM _requeue_expired(queue, lease) AS r);
    END IF;
    IF v_n = 0 THEN
        RETURN groups;
    END IF;
    SELECT array_agg(j.group_key), array_agg(j.priority), array_agg(j.run_at), array_agg(j.id)
      INTO v_g, v_p, v_t, v_i
      FROM jobs AS j
     WHERE j.state = 'pending' AND j.queue = _fair_due.queue AND j.filed_xid = pg_current_xact_id_if_assigned();
    RETURN _fair_merge(groups, v_g, v_p, v_t, v_i);
END;
$$;

-- Step 5's order without the noisy rule: the next picks, best first, each as its group's index in c.
-- Serving a group moves its virtual time by 1 / weight, so its successive picks start at
-- max(its time, the ring's) + n / weight; ties go to the pick whose group was served at the lower virtual
-- time before (a group never served first), then to the fewer picks this claim, the older serve, the head's
-- (priority, run_at, id). The picks of `room` jobs come from the first `room` groups by their next start, so
-- a few more than that are read, whatever the number of groups; a group at its cap has no pick.
CREATE OR REPLACE FUNCTION pgjobs._fair_order(c pgjobs.fair_group[], vt float8, room int, cap int)
RETURNS int[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN (
    SELECT array_agg(o.k ORDER BY o.s, o.before NULLS FIRST, o.j, o.served, o.p, o.t, o.i, o.g)
      FROM (SELECT x.k, n.j, x.served, x.p, x.t, x.i, x.g, greatest(x.vt, _fair_order.vt) + n.j / x.w AS s,
                   CASE WHEN n.j = 0 THEN x.vt - 1.0 / x.w ELSE greatest(x.vt, _fair_order.vt) + (n.j - 1) / x.w END
                       AS before
              FROM (SELECT x.*, sum(x.w) OVER () AS wsum
                      FROM (SELECT x.*
                              FROM unnest(c) WITH ORDINALITY AS x(g, vt, served, at, p, t, i, w, active, state, lp, lt, li, k)
                             WHERE x.state IN ('new', 'read') AND (x.g IS NULL OR cap IS NULL OR x.active < cap)
                             ORDER BY greatest(x.vt, _fair_order.vt), x.vt - 1.0 / x.w NULLS FIRST, x.served, x.p, x.t,
                                      x.i, x.g
                             LIMIT room + 4) AS x) AS x
             -- (about its weight's share of the room, and two more: a round that falls short is followed by another)
             CROSS JOIN LATERAL generate_series(
                   0, least(room, ceil(room * x.w / x.wsum)::int + 2,
                            CASE WHEN x.g IS NULL OR cap IS NULL THEN room ELSE cap - x.active END) - 1) AS n(j)
             ORDER BY s, before NULLS FIRST, j, served, p, t, i, g
             LIMIT 2 * room + 4) AS o);
END;
$$;

-- The groups' reads for a round of picks, in two statements for all of them: the floor of each group read
-- first in this claim (its first pending job of any kind at or above the old floor, taken or not; none: the
-- group is 'gone'), then up to ns[n] pending jobs of the kinds (NULL: any) of group ks[n], after the last one
-- this claim locked, locked SKIP LOCKED. Returns the groups and the jobs, in group then claim order.
CREATE OR REPLACE FUNCTION pgjobs._fair_reads(queue text, INOUT c pgjobs.fair_group[], ks int[], ns int[],
                                              kinds text[], OUT jk int[], OUT jid bigint[], OUT jkind text[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off SET enable_bitmapscan = off  -- (claim.sql, "Plans")
AS $$
#variable_conflict use_column
DECLARE
    v    record;
    v_lk int[];         -- per group read, its last job locked
    v_lp smallint[];
    v_lt timestamptz[];
    v_li bigint[];
BEGIN
    -- (the groups as a relation: an element of an array of rows is found by walking the array from its start)
    FOR v IN
        SELECT x.k, coalesce(a.priority, b.priority) AS p, coalesce(a.run_at, b.run_at) AS t, coalesce(a.id, b.id) AS i
          FROM unnest(c) WITH ORDINALITY AS x(g, vt, served, at, p, t, i, w, active, state, lp, lt, li, k)
          LEFT JOIN LATERAL (
                SELECT j.priority, j.run_at, j.id FROM jobs AS j
                 WHERE x.g IS NOT NULL   -- (a gate here, not in ON: ON would still run the scan)
                   AND j.state = 'pending' AND j.queue = _fair_reads.queue AND j.group_key = x.g
                   AND (j.priority, j.run_at, j.id) >= (x.p, x.t, x.i)
                 ORDER BY j.priority, j.run_at, j.id LIMIT 1) AS a ON true
          LEFT JOIN LATERAL (
                SELECT j.priority, j.run_at, j.id FROM jobs AS j
                 WHERE x.g IS NULL
                   AND j.state = 'pending' AND j.queue = _fair_reads.queue AND j.group_key IS NULL
                   AND (j.priority, j.run_at, j.id) >= (x.p, x.t, x.i)
                 ORDER BY j.priority, j.run_at, j.id LIMIT 1) AS b ON true
         WHERE x.state = 'new' AND x.k = ANY (ks)
    LOOP
        c[v.k].p := v.p;
        c[v.k].t := v.t;
        c[v.k].i := v.i;
        c[v.k].state := CASE WHEN v.i IS NULL THEN 'gone' ELSE 'read' END;
    END LOOP;
    WITH x AS (
        SELECT x.*, r.n
          FROM unnest(c) WITH ORDINALITY AS x(g, vt, served, at, p, t, i, w, active, state, lp, lt, li, k)
          JOIN unnest(ks, ns) AS r(k, n) ON r.k = x.k
         WHERE x.state = 'read'
    ), l AS MATERIALIZED (
        SELECT x.k, y.* FROM x
         CROSS JOIN LATERAL (
               SELECT j.id, j.kind, j.priority, j.run_at FROM jobs AS j
                WHERE x.g IS NOT NULL
                  AND j.state = 'pending' AND j.queue = _fair_reads.queue AND j.group_key = x.g
                  AND (j.priority, j.run_at, j.id) >= (coalesce(x.lp, x.p), coalesce(x.lt, x.t), coalesce(x.li, x.i))
                  AND j.id IS DISTINCT FROM x.li AND (kinds IS NULL OR j.kind = ANY (kinds))
                ORDER BY j.priority, j.run_at, j.id LIMIT x.n
                  FOR UPDATE SKIP LOCKED) AS y
        UNION ALL
        SELECT x.k, y.* FROM x
         CROSS JOIN LATERAL (
               SELECT j.id, j.kind, j.priority, j.run_at FROM jobs AS j
                WHERE x.g IS NULL
                  AND j.state = 'pending' AND j.queue = _fair_reads.queue AND j.group_key IS NULL
                  AND (j.priority, j.run_at, j.id) >= (coalesce(x.lp, x.p), coalesce(x.lt, x.t), coalesce(x.li, x.i))
                  AND j.id IS DISTINCT FROM x.li AND (kinds IS NULL OR j.kind = ANY (kinds))
                ORDER BY j.priority, j.run_at, j.id LIMIT x.n
                  FOR UPDATE SKIP LOCKED) AS y
    )
    SELECT (SELECT array_agg(l.k ORDER BY l.k, l.priority, l.run_at, l.id) FROM l),
           (SELECT array_agg(l.id ORDER BY l.k, l.priority, l.run_at, l.id) FROM l),
           (SELECT array_agg(l.kind ORDER BY l.k, l.priority, l.run_at, l.id) FROM l),
           m.k, m.p, m.t, m.i
      INTO jk, jid, jkind, v_lk, v_lp, v_lt, v_li
      FROM (SELECT array_agg(m.k) AS k, array_agg(m.priority) AS p, array_agg(m.run_at) AS t, array_agg(m.id) AS i
              FROM (SELECT DISTINCT ON (l.k) l.k, l.priority, l.run_at, l.id FROM l
                     ORDER BY l.k, l.priority DESC, l.run_at DESC, l.id DESC) AS m) AS m;
    -- Each group read: where its next read starts (its last job locked), or 'dry' (none of the kinds now).
    FOR n IN 1 .. cardinality(ks) LOOP
        CONTINUE WHEN (c[ks[n]]).state <> 'read';
        IF ks[n] = ANY (coalesce(v_lk, '{}')) THEN
            c[ks[n]].lp := v_lp[array_position(v_lk, ks[n])];
            c[ks[n]].lt := v_lt[array_position(v_lk, ks[n])];
            c[ks[n]].li := v_li[array_position(v_lk, ks[n])];
        ELSE
            c[ks[n]].state := 'dry';
        END IF;
    END LOOP;
END;
$$;

-- Whether group x is noisy now (DESIGN.md; a weighted group only past its weighted share too).
CREATE OR REPLACE FUNCTION pgjobs._fair_noisy(x pgjobs.fair_group, total int, cfg pgjobs.queues, wsum float8)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN x.g IS NOT NULL AND x.active >= cfg.noisy_min_active AND x.active > cfg.noisy_share * total
       AND x.active * wsum > x.w * total;
END;
$$;

-- Step 5: the picks, in rounds. Each round takes the order (_fair_order), reads its groups (_fair_reads) and
-- walks the order: a pick of a group that is noisy now waits (a noisy group's turn comes back as soon as the
-- picks before make it quiet, and the noisy are served last, fewer active first); a group with no job of a
-- kind still open is passed. A round that filled nothing new ends the picks. Returns the groups as they end
-- (floors, virtual times, serves), the ids in pick order, the ring's virtual time and serve count.
CREATE OR REPLACE FUNCTION pgjobs._fair_picks(queue text, c pgjobs.fair_group[], room int, limits jsonb,
                                              cfg pgjobs.queues, total int,
                                              INOUT vt float8, INOUT served bigint,
                                              OUT groups pgjobs.fair_group[], OUT ids bigint[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_ks   int[];    -- the round's order of picks (_fair_order)
    v_r    record;
    v_wsum float8 := (SELECT sum(x.w) FROM unnest(c) AS x);
    v_next int[];     -- per group, where its next job read is in the round's jobs
    v_wait int[];     -- groups whose pick waits: noisy when their turn came
    v_n    int;
    v_k    int;
    v_x    int;
    v_took int;
BEGIN
    ids := '{}';
    LOOP
        EXIT WHEN room <= 0 OR (limits IS NOT NULL
                                AND NOT EXISTS (SELECT 1 FROM jsonb_each_text(limits) AS e WHERE e.value::int > 0));
        v_ks := _fair_order(c, vt, room, cfg.max_active_per_group);
        EXIT WHEN v_ks IS NULL;
        v_r := _fair_reads(queue, c, ARRAY(SELECT DISTINCT k FROM unnest(v_ks) AS k),
                           ARRAY(SELECT count(*)::int FROM unnest(v_ks) AS k GROUP BY k ORDER BY k),
                           CASE WHEN limits IS NOT NULL THEN ARRAY(SELECT e.key FROM jsonb_each_text(limits) AS e
                                                                   WHERE e.value::int > 0) END);
        c := v_r.c;
        v_next := array_fill(1, ARRAY[cardinality(c)]);
        v_wait := '{}';
        v_took := 0;
        v_n := 1;
        WHILE room > 0 AND (v_n <= cardinality(v_ks) OR cardinality(v_wait) > 0) LOOP
            -- The turn: a waiting group that is quiet now, else the next in order, else the least busy noisy one.
            v_k := NULL;
            IF cardinality(v_wait) > 0 THEN
                v_k := (SELECT w FROM unnest(v_wait) AS w WHERE NOT _fair_noisy(c[w], total, cfg, v_wsum) LIMIT 1);
            END IF;
            IF v_k IS NULL AND v_n <= cardinality(v_ks) THEN
                v_k := v_ks[v_n];
                v_n := v_n + 1;
                CONTINUE WHEN (c[v_k]).state <> 'read' OR v_k = ANY (v_wait);
                IF _fair_noisy(c[v_k], total, cfg, v_wsum) THEN
                    v_wait := v_wait || v_k;
                    CONTINUE;
                END IF;
            ELSIF v_k IS NULL THEN
                v_k := (SELECT w FROM unnest(v_wait) AS w ORDER BY (c[w]).active LIMIT 1);
            END IF;
            -- Its next job of a kind still open.
            LOOP
                v_x := array_position(v_r.jk, v_k, v_next[v_k]);
                EXIT WHEN v_x IS NULL OR limits IS NULL OR (limits ->> v_r.jkind[v_x])::int > 0;
                v_next[v_k] := v_x + 1;
            END LOOP;
            IF v_x IS NULL OR (cfg.max_active_per_group IS NOT NULL AND (c[v_k]).g IS NOT NULL
                               AND (c[v_k]).active >= cfg.max_active_per_group) THEN
                v_wait := array_remove(v_wait, v_k);
                CONTINUE;
            END IF;
            v_next[v_k] := v_x + 1;
            ids := ids || v_r.jid[v_x];
            IF limits IS NOT NULL THEN
                limits := jsonb_set(limits, ARRAY[v_r.jkind[v_x]], to_jsonb((limits ->> v_r.jkind[v_x])::int - 1));
            END IF;
            vt := greatest((c[v_k]).vt, vt);
            c[v_k].vt := vt + 1.0 / (c[v_k]).w;
            served := served + 1;
            c[v_k].served := served;
            c[v_k].at := now();
            c[v_k].active := (c[v_k]).active + 1;
            total := total + 1;
            room := room - 1;
            v_took := v_took + 1;
        END LOOP;
        -- A round that took nothing and left every group of its order readable would find the same again (a
        -- group read with nothing to lock is 'dry' or 'gone' by now, and the next order passes it).
        EXIT WHEN v_took = 0 AND NOT EXISTS (SELECT 1 FROM unnest(v_ks) AS k WHERE (c[k]).state <> 'read');
    END LOOP;
    groups := c;
END;
$$;

-- Step 6a: the picked jobs leased, in pick order (the status events and batches: the caller, claim.sql).
CREATE OR REPLACE FUNCTION pgjobs._fair_lease(worker text, ids bigint[], lease interval)
RETURNS pgjobs.claimed_job[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off SET enable_bitmapscan = off  -- (claim.sql, "Plans")
AS $$
DECLARE
    v_rows claimed_job[];
BEGIN
    IF ids IS NULL OR cardinality(ids) = 0 THEN
        RETURN '{}';
    END IF;
    WITH upd AS (
        UPDATE jobs AS j
           SET state = 'active',
               attempt = j.attempt + 1,
               lease_token = gen_random_uuid(),
               leased_by = worker,
               lease_expires_at = now() + lease,
               filed_xid = pg_current_xact_id(),   -- (set here, the trigger jobs_filed passes the row)
               first_started_at = coalesce(j.first_started_at, now())
         -- The picks are pending rows this claim locked (_fair_reads). The state list keeps the update on
         -- jobs_live and on the primary key: `state = 'pending'` would let a generic plan take
         -- jobs_pending_idx with the ids as a filter, a pass over every pending entry, dead ones included.
         WHERE j.id = ANY (ids) AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
        RETURNING j.id, j.kind, j.queue, j.payload, j.meta, j.attempt, j.max_attempts, j.lease_token,
                  j.lease_expires_at, j.checkpoint, j.group_key, j.batch_id, j.first_started_at
    )
    SELECT array_agg(ROW(u.*)::claimed_job ORDER BY array_position(ids, u.id)) INTO v_rows FROM upd AS u;
    RETURN coalesce(v_rows, '{}');
END;
$$;

-- Step 6b: the claim's ring row. The scheduled start is read again from the old one (the jobs it promoted
-- are passed once); the lease start once it has passed and by every 8th claim (claim.sql, _claim_take, has
-- why). The groups gone leave the ring.
CREATE OR REPLACE FUNCTION pgjobs._fair_save(queue text, snap pg_snapshot, own xid8, groups pgjobs.fair_group[],
                                             vt float8, served bigint, sched timestamptz, lease timestamptz)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off SET enable_bitmapscan = off  -- (claim.sql, "Plans")
AS $$
#variable_conflict use_column
DECLARE
    v_seq bigint := nextval('pgjobs.fair_rings_seq');
BEGIN
    INSERT INTO fair_rings (slot, seq, queue, snap, own, vt, served, sched, lease,
                            g, g_vt, g_served, g_at, g_p, g_t, g_i)
    SELECT (v_seq / 1024 % 2)::smallint, v_seq, _fair_save.queue, _fair_save.snap,
           coalesce(_fair_save.own, pg_current_xact_id()), _fair_save.vt, _fair_save.served,
           (SELECT j.run_at FROM jobs AS j
             WHERE j.state = 'scheduled' AND j.queue = _fair_save.queue AND j.run_at >= _fair_save.sched
             ORDER BY j.run_at LIMIT 1),
           CASE WHEN _fair_save.lease < now() OR v_seq % 8 = 0
                THEN (SELECT j.lease_expires_at FROM jobs AS j
                       WHERE j.state = 'active' AND j.queue = _fair_save.queue AND j.lease_expires_at >= _fair_save.lease
                       ORDER BY j.lease_expires_at LIMIT 1)
                ELSE _fair_save.lease END,
           coalesce(array_agg(x.g), '{}'), coalesce(array_agg(x.vt), '{}'), coalesce(array_agg(x.served), '{}'),
           coalesce(array_agg(x.at), '{}'), coalesce(array_agg(x.p), '{}'), coalesce(array_agg(x.t), '{}'),
           coalesce(array_agg(x.i), '{}')
      FROM unnest(groups) AS x
     WHERE x.state <> 'gone';
    IF v_seq % 64 = 0 AND v_seq / 512 % 2 = 1 THEN
        PERFORM _slots_rotate('fair_rings', '{queue}', (v_seq / 1024 % 2)::smallint);
    END IF;
END;
$$;

-- The claim of one fair or group-capped queue for up to max_jobs jobs (kind_limits: claim's, NULL any kind):
-- the steps of the header. Returns the jobs leased, in pick order; the caller sends their status events.
CREATE OR REPLACE FUNCTION pgjobs._claim_fair(worker text, queue text, max_jobs int, lease interval,
                                              kind_limits jsonb)
RETURNS pgjobs.claimed_job[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_cfg   queues;
    v_ring  fair_rings;
    v_start record;
    v_count record;
    v_room  int;
    v_vt    float8;
    v_srv   bigint;
    v_grps  fair_group[];
    v_ids   bigint[];
BEGIN
    PERFORM _cap_lock(queue);
    -- The settings as of now: a configure_queue may have committed while this claim waited (a queue that
    -- stopped being fair gives nothing to this call; the next claim takes the path its settings give).
    SELECT * INTO v_cfg FROM queues AS c WHERE c.queue = _claim_fair.queue;
    IF NOT FOUND OR v_cfg.paused OR NOT (v_cfg.fair OR v_cfg.max_active_per_group IS NOT NULL) THEN
        RETURN '{}';
    END IF;
    v_ring := _fair_ring(queue);
    v_start := _fair_start(queue, v_ring);
    v_grps := _fair_due(queue, v_start.groups, v_start.sched, v_start.lease, least(1000, greatest(100, 2 * max_jobs)));
    v_count := _cap_counts(queue);
    v_room := least(max_jobs, v_cfg.max_active - v_count.active);
    IF v_room IS NULL THEN
        v_room := max_jobs;
    END IF;
    v_vt := coalesce(v_ring.vt, 0);
    v_srv := coalesce(v_ring.served, 0);
    IF v_room > 0 AND cardinality(v_grps) > 0 THEN
        SELECT * INTO v_vt, v_srv, v_grps, v_ids FROM _fair_picks(
            queue,
            ARRAY(SELECT ROW(x.g, x.vt, x.served, x.at, x.p, x.t, x.i, coalesce(w.weight, 1),
                             coalesce((v_count.groups ->> x.g)::int, 0), 'new', NULL, NULL, NULL)::fair_group
                    FROM unnest(v_grps) AS x
                    LEFT JOIN fair_weights AS w ON w.queue = _claim_fair.queue AND w.group_key = x.g),
            v_room, kind_limits, v_cfg, v_count.active, v_vt, v_srv);
    END IF;
    PERFORM _fair_save(queue, v_start.snap, v_start.own, v_grps, v_vt, v_srv, v_start.sched, v_start.lease);
    RETURN _fair_lease(worker, v_ids, lease);
END;
$$;
