-- Controlled claim path: queues with fair selection (queues.fair) or concurrency caps
-- (max_active, max_active_per_group). claim() (claim.sql) sends every other queue down the plain
-- fast path and only these here.
--
-- Caps. Claimers of a capped queue are serialised by a transaction-scoped advisory lock taken
-- before anything is read. Under READ COMMITTED every statement after the lock takes a fresh
-- snapshot, and a lock holder releases the lock only after its commit is visible, so the active
-- counts read after the lock include every job leased by the claims before: a cap is never
-- overshot, not even briefly, however many workers claim at once. The lock lasts to the end of
-- the claim's transaction: call claim in a short transaction (autocommit, as the worker does);
-- under REPEATABLE READ or SERIALIZABLE (a snapshot older than the lock) a capped claim refuses
-- with PJ002. Queues are locked in name order, so claims over the same queues cannot deadlock.
--
-- Fair selection (one pick at a time; each pick re-ranks the groups):
--   1. non-noisy groups before noisy ones; a group is noisy when its active jobs are at least
--      noisy_min_active and more than noisy_share of the queue's active jobs;
--   2. among the noisy, fewer active jobs first;
--   3. least recently served first: group_cursors.served_seq, stamped from the sequence
--      served_seq_seq whenever the group is served (0 = never served, so new groups go first);
--   4. then the head job's priority, run_at, id (this decides between never-served groups).
-- The ungrouped jobs take turns as one more member of the ring (never noisy, no per-group cap);
-- their place is fair_queues.ungrouped_seq.
--
-- A fair queue without caps is claimed without the queue lock, side by side like the plain path:
-- SKIP LOCKED keeps claimers off each other's jobs, and a group's cursor is row-locked by the claim
-- serving it, so a concurrent claim, finding it held, serves that group only after the others.
-- Concurrent claims thus spread over the groups although neither sees the other's picks.
--
-- Language: every routine here is PL/pgSQL, the one-statement helpers too. A LANGUAGE sql function with a SET
-- clause (every routine pins its search_path) is never inlined, and PostgreSQL before 18 parses, analyses and
-- plans its body again at every call, where PL/pgSQL keeps its plans for the session. Thirteen
-- helpers here were SQL functions (the gates, the kept reads, the floors, the fast path's probe of heads from
-- floors): perf on the worker's claim backend in the fair soak under a held snapshot put 18 % of its CPU in
-- parsing and planning them (tests/sql/test_sql_layout.py keeps claim.sql and this file PL/pgSQL).
--
-- Cost. A claim never enumerates the groups or their jobs:
--   * the ring is read in served_seq order on group_cursors_seq_idx, a chunk at a time, from
--     ring_from (fair_queues': every live cursor's served_seq is at least that, so the index entries
--     that earlier stamps left behind below it are skipped; raised only safely, _fair_ring_raise); a
--     group's head is one probe of jobs_group_idx (given column statistics: on a table never
--     analysed the planner ties it with jobs_pending_idx and may take that one, passing every pending
--     entry of the queue; the workers' vacuum analyses, pgjobs/client/vacuum.py), and the heads of a
--     run of groups are locked, and their cursors stamped, in one statement;
--   * a group arriving with a new job gets its cursor at the next claim: the jobs inserted since
--     the session's previous claim on the queue (ids above its seen_max_id: the session's hint, see
--     _fair_save_hint, else fair_queues'; up to 16,384 of them) are read by id
--     (_discover_fresh), and their groups without a row in fair_groups (one row per group with a
--     cursor, never updated) are registered; that also tells whether ungrouped work arrived;
--   * other groups get their cursor from an incremental skip scan over jobs_group_idx (16 distinct
--     groups per sweep, resuming where the previous sweep stopped; it steps over the groups that have a
--     cursor by their fair_groups key and reads the index only between them: _fair_next_group), for
--     work that became pending without a new job (a due scheduled job, a retry, a dependency met, an
--     insert that committed after a claim read past its id) or when more than 16,384 jobs came in since the session's
--     previous claim (a session that claims seldom on a busy server: as before, every such claim
--     sweeps; a smaller batch was too few: in the fair soak with a snapshot held for minutes, one slow claim
--     let more ids than that arrive before the next, which swept, and the sweep, slower than the time
--     2,048 jobs take to arrive, made the next claim sweep too, and so on: 46-61 sweeps a minute at
--     300-660 ms each, half the claimer's time; reading 16,384 new ids costs a few ms), and otherwise a claim sweeps only while the sweeps keep finding groups,
--     every 8th claim, or when it comes up short (then 256 groups at once): such a group is found
--     within 8 * (groups / 16) claims, or at once when the queue has nothing else to give. A claim
--     looks for ungrouped work on the same terms once none was found;
--   * the queue's active jobs are counted once per claim (jobs_active_idx), for max_active, the
--     per-group caps and the noisy threshold (on a queue without caps, a count that proved dear under
--     a held snapshot is reused for a second: "Reads a claim skips for a while" below).
--   * the usual claim (no caps, no noisy group, no never-served cursor, no kind quota that can run
--     out) skips the pick-by-pick walk: one statement reads the ring, one locks the first free cursors
--     and their heads (more passes past groups with nothing pending, and reads on past a front of the
--     ring other claims hold), one stamps them; the walk takes over from there when that falls short.
--   * a claim that fits all the pending work of the ring's groups takes it in one statement, in the
--     walk's order, and keeps the cursors of groups with nothing pending (_fair_drain): the usual
--     claim of a worker that keeps up, where the fast path came up short and the walk took over; and
--     one that does not fit but finds fewer groups with a job than its size takes them in rounds, also
--     in the walk's order (_fair_rounds), before the walk is tried (not when reads prove dear, as under a
--     held snapshot: the rounds probe every group from the front; the walk starts from the floors).
-- Cursors of groups without live work are deleted when the walk meets them (they drift to the
-- front of the ring as live groups are served), so the table stays the size of the live groups;
-- under a held snapshot, while the checks before a delete are gated, served ones stay (_forget_group).
--
-- Under a held snapshot. A foreign session idle in a transaction keeps every
-- version newer than its snapshot: no pruning, no VACUUM, and no dead index entry can be marked killed by
-- the scans that pass it. Measured (README, "Under a held snapshot"): one claim of one job after 20,000
-- jobs were claimed and completed under the snapshot read 2,301 buffers instead of 83 (this file's part
-- 2,261 instead of 48):
--   * 1,755: the active count above (jobs_active_idx passes the dead entry of every job completed since
--     the snapshot; claim()'s expired-lease probe, and _claim_controlled's until it was folded into this
--     count, pass again those whose lease would have run out by now: 1,970 each once the leases lapsed);
--   * 209: the cursor stamp (served_seq is indexed: every stamp is a new version with a new entry in
--     group_cursors_pkey, whose uniqueness check visited every earlier version of that group's cursor;
--     _fair_finish's updates by key and _forget_group walk them too; no unique key now: below);
--   * 204: the head probe of jobs_group_idx (the dead entries of the group's claimed jobs);
--   * about 80: the fair_queues row, rewritten by every claim (its version chain). Now written only
--     when a sweep ran or the ungrouped jobs' state moved; what changes every claim (seen_max_id,
--     quiet_claims) is the session's hint (_fair_save_hint), and the row's ring_from is read from the
--     cursors when it is written (_fair_ring_floor). The hint carries no ring_from (it did until
--     earlier: _fair_ring_raise has why not).
-- Built: the skip scan and its cursor probes no longer run on every claim that sees a new job (they
-- cost 5,373 of the 8,562 buffers a fair claim read after 20,000 jobs under a held snapshot when new
-- jobs kept coming, the soak's case; the look for ungrouped work on an all-grouped queue 498 more):
-- new groups come from the new ids, and fair_groups answers "has it a cursor?" in one probe. Now
-- 2,493 (the four items above), and 60 instead of 180 when the snapshot was just taken. The sweep every
-- 8th claim still walked its 16 groups' claimed jobs (until it stepped over the groups that have a cursor,
-- _fair_next_group: 3,216 entries a sweep, now at most 16). _claim_controlled's expired-lease probe is folded
-- into the count (which reads the same entries): once those 20,000 leases had lapsed, the whole claim
-- read 4,552 buffers where main read 12,783 (claim()'s own probe 1,974 of them: claim.sql). The sweep
-- of every 8th claim looks a found group's cursor up in fair_groups too: 3,319 buffers instead of 5,403
-- (what was left then is the skip scan passing each group's claimed jobs on jobs_group_idx: _fair_next_group).
-- fair_groups is not free of versions either: a group that runs out of work loses its cursor and its
-- row, and gets both again with its next job (in the soak, about 80 such cycles a second over 100
-- groups); a lookup passes one entry per cycle of that group since the snapshot, not one per serve.
-- Built since: on queues without caps a session keeps a count that proved dear for a
-- second (see "Active counts under a held snapshot" below), and claim()'s probe for leases to settle
-- is skipped on the same terms; so are the 8th claim's look for ungrouped work and its discovery
-- sweep once they proved dear (_fair_keep); the head probe takes jobs_group_idx given
-- statistics (the workers analyse). After 3,000 jobs under a held snapshot one claim read 284 blocks
-- instead of 2,493 (74 before the snapshot; what grew is the claimed group's own: its cursor's versions
-- 157 and its claimed jobs' heap fetches 60). tests/sql/test_fair_snapshot.py holds the bars.
-- Built then: the two per-group costs. A cursor's stamp checks no unique key any more
-- (migrations/deploy/fair_cursor_stamps.sql: group_cursors is keyed by a plain index on (queue,
-- group_key, served_seq), and fair_groups' key decides who creates a group's cursor), and head probes
-- start at the session's per-group floors once they proved dear ("Head floors", below). One claim of 20
-- after 20,000 jobs under a held snapshot over 100 groups read 639 blocks instead of 8,592 (520 before the
-- snapshot; the cursors' heap 105 instead of 4,125, the jobs' 179 instead of 4,139);
-- tests/sql/test_fair_floors.py. What would bound the rest (not built): for capped queues, an active
-- count that does not pass completed jobs (a lease floor on jobs_active_idx is not safe: a later claim
-- with a shorter lease, or a lease moved back, lands below it; an insert-only lease log needs the
-- completion paths in lifecycle.sql to take part). Floors shared between sessions (a session that claims
-- one job now and then probed each group it served from the front) are built since: "Floors in the cursors".
-- Built since: the count, the look and the sweep are paid by one session per period, not by
-- every session ("Shared gates"), and the look for never-served cursors runs only when one may have been
-- created (_fair_unserved). Left: groups that run dry lose their cursor and come back with a new one (tens
-- a second on a busy queue), each leaving dead entries that claims pass (the look above while it runs,
-- _forget_group's active check) and sending claims to the walk.

-- The claim epoch of the fair queues' head floors (claim_floor_epoch; "Head floors" below): a statement
-- made jobs claimable with run_at older than 150 ms (an explicit past run_at, a dependency released, a
-- scheduled job promoted late, a producer transaction that began a while ago), which may sort below a
-- head floor: tell the fair claimers. (The plain claim reads filings instead: claim.sql, "Floors".)
CREATE OR REPLACE FUNCTION pgjobs._claim_floor_note(run_at timestamptz)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF _claim_floor_note.run_at < clock_timestamp() - interval '150 ms'
       AND to_regclass('pgjobs.claim_floor_epoch') IS NOT NULL THEN  -- (absent: nothing to tell)
        PERFORM nextval('pgjobs.claim_floor_epoch');
        RETURN true;
    END IF;
    RETURN false;
END;
$$;

-- Leases moved into the past, or rows made claimable by another path (as above).
CREATE OR REPLACE FUNCTION pgjobs._claim_floor_bump()
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF to_regclass('pgjobs.claim_floor_epoch') IS NOT NULL THEN  -- (absent: nothing to tell)
        PERFORM nextval('pgjobs.claim_floor_epoch');
    END IF;
    RETURN true;
END;
$$;

-- Due scheduled jobs and expired leases of a controlled queue become pending before the pick, so
-- the pick reads one index per group, and an expired job no longer counts as active (the lease
-- expiry is recorded as the plain path's reclaim records it; the next lease is a new attempt).
-- Bookkeeping, not a transition a subscriber waits for (as claim.sql's _promote_scheduled): no
-- status event; the job's next event is its lease. Jobs out of attempts or with a cancellation
-- request were settled by claim() (_settle_expired).
CREATE OR REPLACE FUNCTION pgjobs._promote_due(queue text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_noted boolean;
BEGIN
    WITH sched AS (
        SELECT j.id FROM jobs AS j
         WHERE j.state = 'scheduled' AND j.queue = _promote_due.queue AND j.run_at <= now()
         ORDER BY j.run_at
         LIMIT 1000
           FOR UPDATE SKIP LOCKED
    ), expired AS (
        SELECT j.id FROM jobs AS j
         WHERE j.state = 'active' AND j.queue = _promote_due.queue AND j.lease_expires_at < now()
           AND j.attempt < j.max_attempts AND NOT j.cancel_requested
         ORDER BY j.lease_expires_at
         LIMIT 1000
           FOR UPDATE SKIP LOCKED
    ), upd AS (
    UPDATE jobs AS j
       SET state = 'pending',
           lease_token = NULL,
           lease_expires_at = NULL,
           errors = CASE WHEN j.state = 'active'
                         THEN j.errors || jsonb_build_array(jsonb_build_object(
                                  'attempt', j.attempt, 'at', now(), 'worker', j.leased_by,
                                  'error', 'lease expired'))
                         ELSE j.errors END,
           last_error = CASE WHEN j.state = 'active' THEN 'lease expired' ELSE j.last_error END
      FROM (SELECT sched.id FROM sched UNION ALL SELECT expired.id FROM expired) AS due
     WHERE j.id = due.id AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
    RETURNING j.run_at
    )
    -- their run_at may sort below a fair claimer's head floors (_fair_floors): tell them
    SELECT _claim_floor_note(min(upd.run_at)) INTO v_noted FROM upd;
END;
$$;

-- The registration lock of one group of one queue, tried, never waited for: held to the end of the
-- transaction by whoever registers the group (_discover_fresh, _discover_groups) or forgets it
-- (_forget_group). Why: fair_groups' primary key made a registration wait for another transaction's
-- uncommitted insert or delete of the same group: claims deadlocked (a claim's _discover_fresh
-- registered group b and waited for another claim's insert of group d, while that claim, having
-- registered d, had its sweep wait for b), and a claim in a transaction left open stalled every claimer
-- that met the same new group (tests/sql/test_fair_races.py). A group whose lock is taken is left to
-- the transaction holding it; if that one forgets it after all, the sweep registers it later (late,
-- never lost). Two groups whose keys hash alike share a lock: one of them waits for a later claim.
CREATE OR REPLACE FUNCTION pgjobs._fair_group_lock(queue text, group_key text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN pg_try_advisory_xact_lock(hashtextextended('pgjobs.group:' || queue || chr(10) || group_key, 0));
END;
$$;

-- One step of the skip scan: the first group after `after_key` (NULL: from the very first) that has a cursor
-- (fair_groups) or pending work (jobs_group_idx), whichever key is lower. Groups with a cursor are stepped
-- over by their fair_groups key, never read on jobs_group_idx: only the gap between two of them is (its upper
-- bound ends the scan), where the groups without a cursor are. Why: a held snapshot keeps, in front of each
-- group's first pending entry, the dead entry of every job of the group claimed since, and a step from the
-- index alone passed them all to find the group's key: in the ten-minute fair soak's hold (100 groups, all with
-- a cursor) a sweep of 16 groups took 0.5-1.2 s, the worker's claimer stalled behind it (tests/sql/
-- test_fair_sweep.py). A group with a cursor has nothing for the sweep to do (it only registers groups without
-- one), so the keys it meets and where it resumes are the same as before, with or without pending work.
CREATE OR REPLACE FUNCTION pgjobs._fair_next_group(v_q text, after_key text)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_reg text;   -- the next group with a cursor
    v_gap text;   -- the first group with pending work before it
BEGIN
    -- (two statements each way: a bound of ">= after_key" plus a filter would read all of after_key's entries;
    -- '' is a valid key and the smallest text: ">= ''" starts from the very first group)
    IF after_key IS NULL THEN
        SELECT g.group_key INTO v_reg FROM fair_groups AS g
         WHERE g.queue = v_q AND g.group_key >= '' ORDER BY g.group_key LIMIT 1;
    ELSE
        SELECT g.group_key INTO v_reg FROM fair_groups AS g
         WHERE g.queue = v_q AND g.group_key > after_key ORDER BY g.group_key LIMIT 1;
    END IF;
    SELECT x.k INTO v_gap
      FROM ((SELECT j.group_key AS k FROM jobs AS j
              WHERE after_key IS NULL AND j.state = 'pending' AND j.queue = v_q AND j.group_key IS NOT NULL
                AND j.group_key >= '' AND j.group_key < v_reg
              ORDER BY j.group_key LIMIT 1)
            UNION ALL
            (SELECT j.group_key FROM jobs AS j
              WHERE after_key IS NOT NULL AND j.state = 'pending' AND j.queue = v_q AND j.group_key IS NOT NULL
                AND j.group_key > after_key AND j.group_key < v_reg
              ORDER BY j.group_key LIMIT 1)
            UNION ALL
            -- past the last group with a cursor: to the end of the queue's groups
            (SELECT j.group_key FROM jobs AS j
              WHERE v_reg IS NULL AND after_key IS NULL AND j.state = 'pending' AND j.queue = v_q
                AND j.group_key IS NOT NULL AND j.group_key >= ''
              ORDER BY j.group_key LIMIT 1)
            UNION ALL
            (SELECT j.group_key FROM jobs AS j
              WHERE v_reg IS NULL AND after_key IS NOT NULL AND j.state = 'pending' AND j.queue = v_q
                AND j.group_key IS NOT NULL AND j.group_key > after_key
              ORDER BY j.group_key LIMIT 1)) AS x
     LIMIT 1;
    RETURN coalesce(v_gap, v_reg);
END;
$$;

-- The skip scan (see the top: Cost): up to `steps` groups in group_key order after `after_key` (NULL: from the
-- first), one _fair_next_group each, whatever the groups' backlogs; those without a cursor are registered as
-- never-served cursors, existing cursors are left alone. Returns how many groups it met (fewer than steps: the
-- queue's groups ran out), the last one (where the next sweep resumes), and how many were new.
CREATE OR REPLACE FUNCTION pgjobs._discover_groups(queue text, after_key text, steps int,
                                                   OUT met int, OUT last_key text, OUT added int)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    WITH RECURSIVE s (k, n) AS (
        SELECT _fair_next_group(_discover_groups.queue, after_key), 1
        UNION ALL
        SELECT _fair_next_group(_discover_groups.queue, s.k), s.n + 1
          FROM s
         WHERE s.k IS NOT NULL AND s.n < steps
    ), found AS (
        SELECT s.k FROM s WHERE s.k IS NOT NULL
    ), new AS MATERIALIZED (
        SELECT f.k
          FROM found AS f
          -- a probe of fair_groups' primary key per group (LIMIT keeps it a nested loop: an
          -- anti-join would read every group of the queue). Not of group_cursors: its key has one
          -- entry per version of the cursor, and a held snapshot keeps them all (see the top of this
          -- file). fair_groups holds a row for every cursor: both are inserted here and in
          -- _discover_fresh, and deleted in one statement by _forget_group.
          LEFT JOIN LATERAL (SELECT true AS known FROM fair_groups AS e
                              WHERE e.queue = _discover_groups.queue AND e.group_key = f.k
                              LIMIT 1) AS e ON true
         WHERE e.known IS NULL
    ), known AS (
        -- fair_groups' key decides who registers a group (see _discover_fresh)
        INSERT INTO fair_groups AS g (queue, group_key)
        SELECT _discover_groups.queue, n.k FROM new AS n WHERE _fair_group_lock(_discover_groups.queue, n.k)
        ON CONFLICT DO NOTHING
        RETURNING g.group_key
    ), ins AS (
        INSERT INTO group_cursors AS c (queue, group_key)
        SELECT _discover_groups.queue, k.group_key FROM known AS k
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT count(*)::int, max(f.k), (SELECT count(*)::int FROM ins) INTO met, last_key, added FROM found AS f;
    IF added > 0 THEN
        PERFORM nextval('pgjobs.fair_cursor_epoch');   -- never-served cursors: tell the claims (_fair_unserved)
    END IF;
END;
$$;

-- The groups of the jobs inserted since the previous claim (ids after `lo`, up to `hi`, the highest id
-- now: at most c_fresh_ids of them, the caller checks), registered as never-served cursors when they
-- have none; and whether any of those jobs is ungrouped. Reads the new jobs on jobs_pkey and one entry
-- of fair_groups per distinct group: not the queue's groups, not their backlogs, and none of the
-- versions that serving a group leaves behind (group_cursors_pkey has one entry per version, which a
-- held snapshot keeps: see the top of this file). Race: a job whose id was drawn before `hi` and whose
-- insert commits after this read is not seen here; the skip scan (_discover_groups) finds its group
-- within 8 claims, as it finds the groups whose work became pending without a new job.
CREATE OR REPLACE FUNCTION pgjobs._discover_fresh(queue text, lo bigint, hi bigint,
                                                  OUT added int, OUT ungrouped boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    WITH fresh AS (
        -- the new ids, a range of jobs_pkey in id order (new rows lie together in the heap too: a
        -- few pages however many). ORDER BY and LIMIT keep it on jobs_pkey, and the state and queue
        -- are tested on the rows found, not in the scan: a partial index matching them (the queue's
        -- pending work, claimed jobs included) would be planned instead
        SELECT j.k
          FROM (SELECT x.group_key AS k, x.queue AS q, x.state AS st
                  FROM jobs AS x
                 WHERE x.id > lo AND x.id <= hi
                   -- (jobs_live only: a constant prunes the history partitions at plan time, sql/history.sql)
                   AND x.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
                 ORDER BY x.id
                 LIMIT hi - lo) AS j
         WHERE j.q = _discover_fresh.queue AND j.st = 'pending'
    ), new AS MATERIALIZED (
        SELECT d.k
          FROM (SELECT DISTINCT f.k FROM fresh AS f WHERE f.k IS NOT NULL) AS d
          -- one probe of fair_groups_pkey per group (LIMIT: not an anti-join reading them all)
          LEFT JOIN LATERAL (SELECT true AS known FROM fair_groups AS g
                              WHERE g.queue = _discover_fresh.queue AND g.group_key = d.k
                              LIMIT 1) AS g ON true
         WHERE g.known IS NULL
    ), known AS (
        -- Race: claims register the groups of the same new jobs side by side (no discovery lock
        -- here). fair_groups' primary key decides who registers a group: only the insert that got the
        -- row creates the cursor. group_cursors has no unique key on (queue, group_key) (a stamp would
        -- check it against every version of the cursor: see migrations/deploy/fair_cursor_stamps.sql);
        -- a claim whose snapshot missed another's committed registration finds its fair_groups row
        -- here and adds nothing. A group another transaction is registering or forgetting right now
        -- is skipped, not waited for (_fair_group_lock: key order alone did not keep claims from
        -- deadlocking, since this claim's sweep registers more groups in a later statement).
        INSERT INTO fair_groups AS g (queue, group_key)
        SELECT _discover_fresh.queue, n.k FROM new AS n WHERE _fair_group_lock(_discover_fresh.queue, n.k)
        ORDER BY n.k
        ON CONFLICT DO NOTHING
        RETURNING g.group_key
    ), ins AS (
        INSERT INTO group_cursors AS c (queue, group_key)
        SELECT _discover_fresh.queue, k.group_key FROM known AS k
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT (SELECT count(*)::int FROM ins), coalesce(bool_or(f.k IS NULL), false) INTO added, ungrouped
      FROM fresh AS f;
    IF added > 0 THEN
        PERFORM nextval('pgjobs.fair_cursor_epoch');   -- never-served cursors: tell the claims (_fair_unserved)
    END IF;
END;
$$;

-- Where a group's cursor is (its ctid; NULL: none), without a lock (lock it by that ctid, FOR UPDATE SKIP
-- LOCKED, when it is to be written). Newest stamp first: the live version (an un-stamp, _fair_finish, leaves
-- a few versions above it at most). Found by its group in ascending order, a lookup walked every version of
-- the cursor a held snapshot keeps (13,600 blocks, 90 ms five minutes into the fair soak's hold), and a lock
-- skipped within that scan (another claim holds the cursor) went on through all of them.
CREATE OR REPLACE FUNCTION pgjobs._fair_cursor(v_q text, v_key text)
RETURNS tid
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN (SELECT c.ctid FROM group_cursors AS c
             WHERE c.queue = v_q AND c.group_key = v_key
             ORDER BY c.served_seq DESC
             LIMIT 1);
END;
$$;

-- Drops a group's cursor when the group has no live work left: no waiting, scheduled, pending or
-- active job. Called when a probe found nothing to take from a group that had no active job.
-- Under a held snapshot the checks pass every dead entry of the group's claimed jobs (jobs_group_idx) and of
-- the queue's completed ones (jobs_active_idx: it has no group key), so a call grows with the time held:
-- measured in the fair soak (bench/soak.py --fair --functions) at 5,200 jobs/s, 20-70 ms a call 2 to 5
-- minutes into a held snapshot, 15-100 calls every 10 s: 8-20 % of the worker's claimer; and the soak's probe
-- (a claim of one every 200 ms) met a dry group in its walk every few seconds, 50-150 ms a claim: its p99.
-- So these checks are one more read with a shared gate ('f': "Shared gates"): once a call proved dear (over
-- 1,000 entries), served groups' cursors stay, for every session, until the gate opens (60 s: _fair_keep has
-- why), and the session that claims most checks again. They stay in the ring as the fast
-- path keeps them under a held snapshot, and the walk meets them as groups with nothing to take. A never-served
-- cursor is checked all the same: the fast path does not run while one exists (_fair_unserved).
CREATE OR REPLACE FUNCTION pgjobs._forget_group(queue text, group_key text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_keep boolean := _fair_gated('f ' || _forget_group.queue);   -- served cursors stay: a check proved dear
    v_v0 bigint;
    v_t0 timestamptz := clock_timestamp();
BEGIN
    -- A kept served cursor returns here, in a statement of its own: in the DELETE below the checks, which refer
    -- to no column of the cursor, are a one-time filter run before its row is read, so it paid them all the
    -- same (35-70 ms a call ten minutes into the fair soak's hold, 5-12 % of the worker's claimer). Never
    -- served is read by served_seq = 0: one entry per time the group came back, not _fair_cursor's walk past
    -- the group's old stamps.
    IF v_keep AND NOT EXISTS (SELECT 1 FROM pgjobs.group_cursors AS c
                               WHERE c.queue = _forget_group.queue AND c.group_key = _forget_group.group_key
                                 AND c.served_seq = 0) THEN
        RETURN;
    END IF;
    v_v0 := CASE WHEN NOT v_keep THEN _fair_index_visits('jobs_active_idx') + _fair_index_visits('jobs_group_idx') END;
    WITH gone AS (
    DELETE FROM pgjobs.group_cursors AS c
     WHERE c.queue = _forget_group.queue AND c.group_key = _forget_group.group_key
       AND (c.served_seq = 0 OR NOT v_keep)
       -- (a group another claim is registering right now is left alone: _fair_group_lock)
       AND pgjobs._fair_group_lock(_forget_group.queue, _forget_group.group_key)
       -- a cursor another claimer holds is being served: not ours to drop (_fair_cursor: found and deleted
       -- by its ctid)
       AND c.ctid = (SELECT x.ctid FROM pgjobs.group_cursors AS x
                      WHERE x.ctid = pgjobs._fair_cursor(_forget_group.queue, _forget_group.group_key)
                        AND x.queue = _forget_group.queue AND x.group_key = _forget_group.group_key
                        FOR UPDATE SKIP LOCKED)
       AND NOT EXISTS (SELECT 1 FROM pgjobs.jobs AS j
                        WHERE j.state = 'pending' AND j.queue = _forget_group.queue
                          AND j.group_key = _forget_group.group_key)
       AND NOT EXISTS (SELECT 1 FROM pgjobs.jobs AS j
                        WHERE j.state IN ('waiting', 'scheduled') AND j.queue = _forget_group.queue
                          AND j.group_key = _forget_group.group_key)
       AND NOT EXISTS (SELECT 1 FROM pgjobs.jobs AS j
                        WHERE j.state = 'active' AND j.queue = _forget_group.queue
                          AND j.group_key = _forget_group.group_key)
    RETURNING c.queue, c.group_key
    )
    -- with its fair_groups row, in the same statement (a row without its cursor would keep
    -- _discover_fresh from registering the group again)
    DELETE FROM pgjobs.fair_groups AS g USING gone
     WHERE g.queue = gone.queue AND g.group_key = gone.group_key;
    IF v_v0 IS NOT NULL THEN
        PERFORM _fair_keep('f ' || _forget_group.queue,
                           _fair_index_visits('jobs_active_idx') + _fair_index_visits('jobs_group_idx') - v_v0 > 1000,
                           v_t0);
    END IF;
END;
$$;

-- The pieces of the fair pick, called from _claim_fair (at the end of this part). Each one is a rule or
-- race named at the top of this file; the state they share travels as arguments (arrays, the queue's
-- settings and fair_queues rows), and each is called once per claim, per chunk of the ring or per batch
-- of locks, except the two takers (_fair_take_ungrouped, _fair_take_again), called once per pick of U
-- or of a group picked again. Under _claim_controlled they inherit its planner settings (generic plans,
-- no JIT).

-- Rule U, the ungrouped jobs' turn: the head of the queue's ungrouped work, looked for among the first
-- 32 rows of the queue's claim order only (an all-grouped backlog is not read through to find none),
-- passing the jobs this claim has picked (v_ids). NULLs when none is in sight.
CREATE OR REPLACE FUNCTION pgjobs._fair_ungrouped_head(v_q text, v_open text[], v_ids bigint[],
                                                       OUT hp int, OUT hr timestamptz, OUT hi bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    SELECT s.priority, s.run_at, s.id INTO hp, hr, hi
      FROM (SELECT j.id, j.priority, j.run_at, j.group_key, j.kind
              FROM jobs AS j
             WHERE j.state = 'pending' AND j.queue = v_q AND j.id <> ALL (v_ids)
             ORDER BY j.priority, j.run_at, j.id
             LIMIT 32) AS s
     WHERE s.group_key IS NULL AND (v_open IS NULL OR s.kind = ANY (v_open))
     ORDER BY s.priority, s.run_at, s.id
     LIMIT 1;
END;
$$;

-- Reads a claim skips for a while under a held snapshot. A held snapshot keeps the dead entry of every
-- job completed (or claimed) since it was taken, and three reads of a fair claim pass them all:
--   * 'a': the count of the queue's active jobs per group (for the noisy rule; caps count them too) in
--     one pass over jobs_active_idx, and claim()'s probe for leases to settle (measured: a fair claimer
--     fell from ~670 to ~190 claims a second within 80 s of a held snapshot);
--   * 'u': every 8th quiet claim's look for ungrouped work on an all-grouped queue (work that came back
--     without a new job id: a release, a retry), a walk of jobs_pending_idx from the queue's front to the
--     first ungrouped job, past every grouped one;
--   * 's': every 8th quiet claim's discovery sweep of 16 groups' prefixes of jobs_group_idx.
-- When such a read proved dear (the count visited more than 2 x the active jobs it found + 1,000
-- entries; the look or the sweep more than 1,000), the session keeps it for pgjobs.fair_count_every
-- seconds (default 1; read at each claim; 0 keeps nothing): one session setting, pgjobs.fair_kept (jsonb:
-- kind and queue, e.g. 'a q1' -> [kept at, the gate value it wrote (NULL: none; for the record), what was
-- read...]), and longer while the read's shared gate is closed (below). Meanwhile its claims reuse the count
-- (and skip claim()'s probe: the count saw no lease run out) and skip the look and the sweep. Only on
-- queues without caps for the count: max_active and max_active_per_group are never overshot, so a capped
-- queue counts every claim. What that time can miss: a group turning noisy (fairness is a ranking; it
-- is ranked after the others that much late), a lease that ran out, ungrouped work or a group
-- without a cursor that came back without a new job (a claim that comes up short still looks and sweeps
-- at once; groups that come with new jobs are found by their ids as before). Without a held snapshot
-- (or with autovacuum keeping up) these reads visit about what they find, nothing is kept, and the
-- setting stays empty: the claim pays one current_setting() for it. Set like SET, so a rolled-back claim
-- leaves it as it was.

-- Shared gates. Each session used to pay these reads itself, once a second: N claimer sessions of a
-- queue paid N counts (sweeps, looks) a second, and a session that claims now and then (one claim every
-- 200 ms: bench/soak.py's probe) paid one in every five of its claims (measured: a probe claim of one job
-- 120 s into a held snapshot took 264 ms, of which the count 55, the look 53, the sweep 95; its p99 was
-- 5.6x the clean one). A session whose read proved dear now also closes a gate shared by every session:
-- the sequence fair_gate_a, _u or _s (sqitch change fair_gates; _f since, _forget_group's checks: sqitch
-- change fair_gate_forget) holds until when, and for which queue
-- (a hash of its name), the next such read may wait: pgjobs.fair_count_every seconds, or 20 times what
-- the read took when that is longer (the read then costs a twentieth of one session's time at most,
-- however long the snapshot is held, whatever the number of sessions; the look 100 times, the checks of
-- _forget_group 60 s: _fair_keep has why). While the gate is closed a
-- session skips the look and the sweep (what they find is shared: cursors in group_cursors, the
-- ungrouped state in fair_queues) and reuses the newest count up to 30 x pgjobs.fair_count_every seconds
-- old: its own, or the one the last dear count wrote to fair_counts (sqitch change fair_counts; one index
-- descent to the newest row of an insert-only table, so no version chain under the snapshot). A
-- sequence, not a table, for the gate: setval leaves no dead tuple under the very snapshot this works
-- around, and only the functions' owner may call it (roles.sql), so no role can hold a gate shut; a gate
-- set more than 10 minutes ahead is ignored all the same. Two fair queues dear at once overwrite each
-- other's gate (one sequence per read, one queue's hash in it): each then pays as before, no worse.
-- Who reads when a gate opens: the session that claims most. To each session the gate stays closed past its
-- end for ten times the time since that session's previous claim of the queue (at most twice
-- pgjobs.fair_count_every: _fair_grace), so a worker claiming every 10 ms reads 100 ms after the end, and a
-- probe claiming every 200 ms reads only when nobody has 2 s later; the claim that reads closes the gate before it
-- reads (for pgjobs.fair_count_every seconds, when this session's last such read was dear), so that the
-- claims starting while it reads skip it, and sets its end after. The gate opening first
-- to the session that had closed it, the others a second later: once a probe had read in that second (the
-- worker busy), the gate was the probe's for good, and it paid the count at every opening, every 6-7 s
-- (220-420 ms each, ten minutes into the fair soak's hold), and its own count and look again whenever they
-- were 30 s old: about 2 % of its claims, its p99. A close never shortens a gate: it closes an open one
-- (or one of another queue) or moves its end later.
-- A gate's value: until when (milliseconds since 2020, `seconds` from now) above 20 bits of the queue's hash.
CREATE OR REPLACE FUNCTION pgjobs._fair_gate_value(v_q text, seconds numeric)
RETURNS bigint
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN (((extract(epoch FROM clock_timestamp()) - 1577836800 + seconds) * 1000)::bigint << 20)
           | (hashtext(v_q) & 1048575)::bigint;
END;
$$;

-- (`grace`: seconds after its end during which the gate still counts as closed to the caller: see _fair_kept)
CREATE OR REPLACE FUNCTION pgjobs._fair_gate_closed(v_kind text, v_q text, grace numeric DEFAULT 0)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN (
        SELECT coalesce(g.v & 1048575 = n.v & 1048575 AND (g.v >> 20) + (grace * 1000)::bigint > (n.v >> 20)
                        AND (g.v >> 20) <= (n.v >> 20) + 600000, false)
          FROM (SELECT pg_sequence_last_value(to_regclass('pgjobs.fair_gate_' || v_kind)) AS v) AS g,
               (SELECT _fair_gate_value(v_q, 0) AS v) AS n
    );
END;
$$;

-- Closes the gate of a read ('a', 'u', 's' or 'f') of this queue for `seconds` (at most 60) from now, unless it
-- is closed for this queue until later already. Returns the value written (NULL: none).
CREATE OR REPLACE FUNCTION pgjobs._fair_gate_close(v_kind text, v_q text, seconds numeric)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN (
        SELECT setval(g.s, n.v)
          FROM (SELECT to_regclass('pgjobs.fair_gate_' || v_kind) AS s) AS g,
               (SELECT _fair_gate_value(v_q, least(seconds, 60)) AS v) AS n
         WHERE g.s IS NOT NULL
           AND NOT (_fair_gate_closed(v_kind, v_q) AND pg_sequence_last_value(g.s) >= n.v)
    );
END;
$$;

-- How long past its end a gate, or a head floor in a cursor, still holds for this session (seconds): ten times
-- the time since the session's previous claim of the queue (the third item of its fair_hint), at most twice
-- pgjobs.fair_count_every; `first` for a session that has not claimed the queue yet. A worker claiming every
-- 10 ms gets 100 ms, a probe claiming every 200 ms 2 s: when a gate opens the session that claims most reads
-- first, and a floor that ran out is probed from the front by it (the safety net, "Head floors"). Until the
-- busiest period twice that time, at most pgjobs.fair_count_every, and no grace for floors: in the
-- ten-minute fair soak's hold the soak's probe still paid the count when a gate opened (7 times: 250-820 ms)
-- and a group's probe from the front when its floor ran out (5 times: 75-140 ms).
CREATE OR REPLACE FUNCTION pgjobs._fair_grace(v_q text, first numeric)
RETURNS numeric
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN least(2 * _fair_count_every(),
                 coalesce(10 * (extract(epoch FROM clock_timestamp())
                                - (nullif(current_setting('pgjobs.fair_hint', true), '')::jsonb -> v_q ->> 2)::numeric),
                          first));
END;
$$;

-- A kept read ('a ', 'u ', 's ' or 'f ' and the queue; _fair_drain reads its 'd ' itself) while still good:
-- [kept at, gate written, what was read...]; else NULL. Good: kept less than pgjobs.fair_count_every seconds
-- ago; or, while the read's gate is closed (see above), a look or a sweep whatever its age (kept by nobody in
-- this session: '[]'), and a
-- count less than 30 times that old: this session's, else the newest in fair_counts (read only then: read
-- whenever the session's own was over a second old, the fair queue's clean throughput was 0.967x, eight
-- runs each, against 0.997x so; a clean run counts dear too, as autovacuum falls behind). To a session the
-- gate stays closed past its end for a while (_fair_grace; pgjobs.fair_count_every for a first claim): a
-- worker claiming every 10 ms reads 100 ms after the end, a probe claiming every 200 ms only if no one has
-- 2 s later (the session that claims most pays, as the shared gates intend).
CREATE OR REPLACE FUNCTION pgjobs._fair_kept(v_key text)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN (
        SELECT CASE WHEN (k.e ->> 0)::numeric + k.every > k.now THEN k.e
                    WHEN k.every = 0 OR left(v_key, 2) NOT IN ('a ', 'u ', 's ', 'f ')
                         OR NOT _fair_gate_closed(left(v_key, 1), substr(v_key, 3), k.grace) THEN NULL
                    WHEN left(v_key, 2) <> 'a ' THEN coalesce(k.e, '[]')
                    WHEN (k.e ->> 0)::numeric + 30 * k.every > k.now THEN k.e
                    ELSE (SELECT jsonb_build_array(extract(epoch FROM c.counted_at), NULL) || c.payload
                            FROM fair_counts AS c
                           WHERE c.queue = substr(v_key, 3)
                             AND c.counted_at > to_timestamp(k.now - 30 * k.every)
                           ORDER BY c.counted_at DESC
                           LIMIT 1)
               END
          FROM (SELECT x.e, x.every, x.now, _fair_grace(substr(v_key, 3), x.every) AS grace
                  FROM (SELECT nullif(current_setting('pgjobs.fair_kept', true), '')::jsonb -> v_key AS e,
                               _fair_count_every() AS every, extract(epoch FROM clock_timestamp()) AS now) AS x) AS k
    );
END;
$$;

-- _fair_kept for a claim that reads when it gets NULL: then, if this session's last such read ('a ', 'u ',
-- 's ' or 'f ') proved dear (it is kept, too old), the read's gate is closed for pgjobs.fair_count_every seconds
-- before it runs, so that the claims starting meanwhile skip it (_fair_keep sets the gate's end after).
CREATE OR REPLACE FUNCTION pgjobs._fair_kept_or_gate(v_key text)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_kept jsonb := _fair_kept(v_key);
BEGIN
    IF v_kept IS NULL AND left(v_key, 2) IN ('a ', 'u ', 's ', 'f ')
       AND nullif(current_setting('pgjobs.fair_kept', true), '')::jsonb ? v_key THEN
        PERFORM _fair_gate_close(left(v_key, 1), substr(v_key, 3), _fair_count_every());
    END IF;
    RETURN v_kept;
END;
$$;

-- Whether this session skips a gated read now ('u ', 's ' or 'f ' and the queue): it keeps some read (a session
-- whose reads are cheap has an empty pgjobs.fair_kept and never consults the gates), and _fair_kept_or_gate
-- says the read is kept or its gate closed. For the reads outside _claim_fair's own tests: the walk's long
-- sweep (_fair_sweep), U's turn in the walk (_fair_take_ungrouped), the checks before a cursor goes
-- (_forget_group).
CREATE OR REPLACE FUNCTION pgjobs._fair_gated(v_key text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF coalesce(current_setting('pgjobs.fair_kept', true), '') IN ('', '{}') THEN
        RETURN false;
    END IF;
    RETURN _fair_kept_or_gate(v_key) IS NOT NULL;
END;
$$;

-- After a read begun at `since`: keep it (with `payload`, a jsonb array) when it proved dear, close its
-- shared gate, and write a count to fair_counts for the other sessions (rows older than five minutes go:
-- VACUUM takes them once no snapshot needs them); else forget what was kept. How long the gate closes:
--   * 'a', 's': max(pgjobs.fair_count_every, 20 x what the read took) (a twentieth of one session's time);
--   * 'u': max(pgjobs.fair_count_every, 100 x what it took) (at most 60 s, as every gate): the look finds only
--     ungrouped work that came back without a new job (a claim that comes up short looks at once), and under a
--     held snapshot it read 100-300 ms of dead entries every 2-6 s in the ten-minute fair soak;
--   * 'f': 60 s. The checks before a dry group's cursor goes are upkeep (the table the size of the live groups),
--     and under a held snapshot a dropped cursor costs again when its group comes back: never served, it has no
--     floor (its head probed from the front, past every job of the group claimed since: 70-105 ms), the
--     fast path does not run while it exists (_fair_unserved), and the walk reads the never-served part of the
--     ring past one dead entry per group that ever came back. In the ten-minute fair soak, gated for 20 x a check
--     (1-2 s), the soak's probe paid a check (30-83 ms) and such a walk (110-300 ms) 14 times in the hold.
CREATE OR REPLACE FUNCTION pgjobs._fair_keep(v_key text, dear boolean, since timestamptz,
                                             payload jsonb DEFAULT '[]')
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_all jsonb := coalesce(nullif(current_setting('pgjobs.fair_kept', true), '')::jsonb, '{}');
    v_gate bigint;
BEGIN
    IF dear AND _fair_count_every() > 0 THEN
        IF left(v_key, 2) IN ('a ', 'u ', 's ', 'f ') THEN
            v_gate := _fair_gate_close(left(v_key, 1), substr(v_key, 3),
                                       CASE left(v_key, 2)
                                            WHEN 'f ' THEN 60
                                            WHEN 'u ' THEN greatest(_fair_count_every(),
                                                                    100 * extract(epoch FROM clock_timestamp() - since))
                                            ELSE greatest(_fair_count_every(),
                                                          20 * extract(epoch FROM clock_timestamp() - since)) END);
        END IF;
        IF left(v_key, 2) = 'a ' THEN
            DELETE FROM fair_counts AS c
             WHERE c.queue = substr(v_key, 3) AND c.counted_at < clock_timestamp() - interval '5 minutes';
            INSERT INTO fair_counts (queue, counted_at, payload)
            VALUES (substr(v_key, 3), clock_timestamp(), coalesce(payload, '[]'));
        END IF;
        v_all := v_all || jsonb_build_object(v_key, jsonb_build_array(extract(epoch FROM clock_timestamp()), v_gate)
                                                    || coalesce(payload, '[]'));
    ELSIF v_all ? v_key THEN
        v_all := v_all - v_key;
    ELSE
        RETURN;
    END IF;
    PERFORM set_config('pgjobs.fair_kept', v_all::text, false);
END;
$$;

-- The highest id of a live job above the ids this session's previous claim of the queue saw (the hint's first
-- item, else fair_queues.seen_max_id; none: the whole table), or that mark when there is none: whether jobs
-- came since, and up to where _discover_fresh reads them. Only live jobs (done ones need no cursor), and
-- only above the mark: max(id) over every partition of jobs read jobs_live's pkey from its end, past every
-- job claimed and done under a held snapshot, whenever the queue was drained (1,287,864 heap fetches, 265 ms,
-- the soak's probe every 2-5 s and the worker's counts 200 s into the fair soak's hold).
CREATE OR REPLACE FUNCTION pgjobs._fair_max_id(v_hint jsonb, v_seen bigint)
RETURNS bigint
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_mark bigint := coalesce((v_hint ->> 0)::bigint, v_seen);
BEGIN
    RETURN coalesce((SELECT max(j.id) FROM jobs AS j
                      WHERE j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])   -- jobs_live only
                        AND j.id > coalesce(v_mark, 0)),
                    v_mark);
END;
$$;

-- Whether every one of these queues has a kept count that is still good (claim() then skips its probe
-- for leases to settle on them). Callers test the setting first: empty, nothing is kept.
CREATE OR REPLACE FUNCTION pgjobs._fair_counts_fresh(queues text[])
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN (
        SELECT coalesce(bool_and(_fair_kept('a ' || q) IS NOT NULL), false) FROM unnest(queues) AS q
    );
END;
$$;

-- Entries of an index of jobs_live that this backend's scans have visited in this transaction (live or
-- dead); 0 for an index renamed or gone (then nothing is ever kept).
CREATE OR REPLACE FUNCTION pgjobs._fair_index_visits(index_name text)
RETURNS bigint
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN coalesce(pg_stat_get_xact_tuples_returned(to_regclass('pgjobs.' || index_name)), 0);
END;
$$;

-- pgjobs.fair_count_every: how long a kept read serves, in seconds (default 1; 0 keeps none).
CREATE OR REPLACE FUNCTION pgjobs._fair_count_every()
RETURNS numeric
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN greatest(coalesce(nullif(current_setting('pgjobs.fair_count_every', true), '')::numeric, 1), 0);
END;
$$;

-- Whether the queue has a never-served cursor (the walk takes the claim then: they go first). The look
-- is one probe of group_cursors_new_key, but a held snapshot keeps there the dead entry of every cursor
-- that was never served when created and has been served since: one per group that ran out of work, lost
-- its cursor and came back (tens a second on a busy fair queue), and each claim passed them all (2.1 ms a
-- claim after 100 s held at 3,000 jobs/s over 100 groups). Cursors are created by claims only
-- (_discover_fresh, _discover_groups), and each creation moves the sequence fair_cursor_epoch: a session
-- whose last look found none skips the look while the sequence has not moved since it read it (before that
-- look) and that look is less than a second old. Race: a creation whose nextval came before this session
-- read the sequence and whose commit came after its look is seen at the next look, a second later at most:
-- the new group is served that much later, never lost (as the floors' safety nets). In the session
-- setting pgjobs.fair_unserved (jsonb: queue -> [epoch, looked at]); a forged one misleads only the
-- session that set it.
CREATE OR REPLACE FUNCTION pgjobs._fair_unserved(v_q text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_e   bigint := coalesce(pg_sequence_last_value(to_regclass('pgjobs.fair_cursor_epoch')), 0);
    v_now numeric := extract(epoch FROM clock_timestamp());
    v_all jsonb := coalesce(nullif(current_setting('pgjobs.fair_unserved', true), '')::jsonb, '{}');
    v_any boolean;
BEGIN
    IF (v_all -> v_q ->> 0)::bigint = v_e AND (v_all -> v_q ->> 1)::numeric + 1 > v_now THEN
        RETURN false;
    END IF;
    v_any := EXISTS (SELECT 1 FROM group_cursors AS g WHERE g.queue = v_q AND g.served_seq = 0);
    IF NOT v_any THEN
        PERFORM set_config('pgjobs.fair_unserved',
                           (v_all || jsonb_build_object(v_q, jsonb_build_array(v_e, v_now)))::text, false);
    END IF;
    RETURN v_any;
END;
$$;

-- Head floors (under a held snapshot). A group's head is the first entry of jobs_group_idx for
-- (queue, group_key) that is pending; a held snapshot keeps, in front of it, the dead entry of every job
-- of the group claimed since (none can be removed or marked killed), and each probe fetched them all from
-- the heap: ~200 per group and claim after 20,000 jobs over 100 groups, the fair soak's collapse with
-- the cursor stamps (migrations/deploy/fair_cursor_stamps.sql). A session whose head probes proved dear
-- (jobs_group_idx entries visited > 4 x room + 500) keeps, per group, where it last took a head:
-- 'h <queue>' in pgjobs.fair_kept, [kept at, claim epoch, {group_key: [priority, run_at, id]}], and its
-- probes start there ((priority, run_at, id) >= the floor: a bound of the index scan, not a filter).
-- As claim.sql's scan floors, a floor is right about everything but work that appears below it, and
-- what appears there is announced by the claim epoch (claim_floor_epoch: an enqueue, release, retry or
-- promotion that files a pending job with a run_at older than 150 ms; here also _promote_due): a moved
-- epoch, a claim that promoted due jobs itself or that came up short drops the floors, and they serve
-- for pgjobs.fair_count_every seconds (default 1) from the claim that measured them, or 20 times what the
-- dear claims since then took when that is longer (the probes from the front that follow a reset cost a
-- twentieth of the session's time at most, however long the snapshot is held: as claim.sql's safety
-- net), after which a claim probes from the front again (and keeps new floors if that proved dear).
-- 'h <queue>' is then [kept at, claim epoch, floors, seconds the dear claims took]. A job more urgent than
-- the floor (a lower priority: a release or a new job of that level) is looked for first, one probe of the
-- range below the floor's level, and when there is one the group is probed from the front. What that
-- second can miss: a claim rolled back after this one passed its locked rows, a producer committing over
-- 300 ms after its transaction began: late by at most that second, never lost. Without a held snapshot a
-- probe visits about what it takes: nothing is kept, and no probe below a floor runs.
-- Floors in the cursors (sqitch change fair_head_floors). A session's floors are its own: a session that
-- claims one job now and then (the soak's probe, every 200 ms) served each group rarely, kept no floor for
-- it, and probed it from the front: 16,000-18,000 blocks, 70-180 ms, a claim of one 7 minutes into a hold.
-- The fast path now keeps a group's floor in its cursor row, which its stamp rewrites anyway (no version of
-- its own): floor_priority, floor_run_at, floor_id, until when it holds (floor_until) and under which claim
-- epoch (floor_epoch). Every session's fast path starts there while it holds (the epoch unmoved, the time
-- not past, no job more urgent than it pending). The floor is the group's first pending job of ANY kind,
-- locked or not, read without a lock from where the probe started (a floor that holds, or the front), not
-- the claim's own pick: a worker that runs some kinds, or that passed a row another session held, leaves a
-- floor that hides nothing from a claimer of other kinds or from the next claim once the row is free
-- (tests/sql/test_fair_floors.py). The head is then taken from that first job, by its ctid when it is free
-- and of a kind asked for (no second descent of the index), else by the probe from there. A claim that
-- probes from a floor carries it on (the new place, the same end and epoch: however often the group is
-- served, the floor ends, and the group is probed from the front once more, which is the safety net above);
-- one that probes from the front while its session keeps floors (the sign of a held snapshot) sets one,
-- holding as long as the session's own floors do, this claim's time counted in (_fair_fast). Without a held
-- snapshot no session keeps floors, no cursor gets one, and the fast path probes as before. The drain and
-- the rounds, which probe every group from the front, leave a ring with floors to the fast path. A group found
-- with nothing pending from the front gets a floor as well (_fair_floor_empty: a drained queue is every group),
-- and each new floor ends at a time of its own (_fair_stamp), so that the probes from the front that follow
-- the floors' end come a few groups at a time, not all in one claim.
-- Also under a held snapshot: a dry group passed over from a floor keeps its cursor in the fast path
-- (_forget_group's checks pass every dead entry of the group and of the queue's active jobs, 250-350 ms a
-- group 4 minutes into the fair soak's hold; since those checks have a shared gate, the walk keeps it too
-- while the gate is closed: _forget_group), and on a claim of
-- one fair queue claim()'s probe for leases to settle is folded into the active count's pass (_claim_fair):
-- one walk of jobs_active_idx, not two.

-- Before the picks: the claim epoch now, this session's kept floors of the queue, and the floors this claim
-- may use (NULL: none): not past their time, not with the epoch moved, not after promoting due jobs.
CREATE OR REPLACE FUNCTION pgjobs._fair_floors(v_q text, v_any_kept boolean, v_promoted boolean,
                                               OUT v_epoch bigint, OUT h_kept jsonb, OUT h_floor jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    SELECT e.v, k.h,
           CASE WHEN k.h IS NOT NULL AND NOT v_promoted AND (k.h ->> 1)::bigint = e.v AND _fair_count_every() > 0
                     AND (k.h ->> 0)::numeric + greatest(_fair_count_every(), 20 * (k.h ->> 3)::numeric)
                         > extract(epoch FROM clock_timestamp())
                THEN k.h -> 2 END
      INTO v_epoch, h_kept, h_floor
      FROM (SELECT coalesce(pg_sequence_last_value(to_regclass('pgjobs.claim_floor_epoch')), 0) AS v) AS e,
           (SELECT CASE WHEN v_any_kept
                        THEN nullif(current_setting('pgjobs.fair_kept', true), '')::jsonb -> ('h ' || v_q)
                   END AS h) AS k;
END;
$$;

-- After the picks: keep floors from them (merged into the floors used, which keep their age and epoch),
-- keep fresh ones (the probes proved dear), or forget them (not dear, or a claim with floors came up
-- short: what it missed may be below them).
CREATE OR REPLACE FUNCTION pgjobs._fair_floors_save(v_q text, h_kept jsonb, h_floor jsonb, v_epoch bigint,
                                                    dear boolean, filled boolean, tids tid[], took numeric)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_new jsonb;
BEGIN
    IF (h_floor IS NULL AND NOT dear) OR (h_floor IS NOT NULL AND NOT filled) OR _fair_count_every() = 0 THEN
        PERFORM _fair_keep('h ' || v_q, false, NULL);
        RETURN;
    END IF;
    -- the picked heads' keys, the first per group (by ctid: the rows are locked, not yet leased)
    -- (as claim.sql's floors: the head's own key, or (priority, now() - 300 ms, 0) when that is lower,
    -- for producers whose transaction began before this claim and commits after it)
    SELECT jsonb_object_agg(h.group_key,
                            CASE WHEN h.run_at < now() - interval '300 ms'
                                 THEN jsonb_build_array(h.priority, h.run_at, h.id)
                                 ELSE jsonb_build_array(h.priority, now() - interval '300 ms', 0) END)
      INTO v_new
      FROM (SELECT DISTINCT ON (j.group_key) j.group_key, j.priority, j.run_at, j.id
              FROM jobs_live AS j
             WHERE j.ctid = ANY (tids) AND j.group_key IS NOT NULL
             ORDER BY j.group_key, j.priority, j.run_at, j.id) AS h;
    PERFORM set_config('pgjobs.fair_kept',
                       (coalesce(nullif(current_setting('pgjobs.fair_kept', true), '')::jsonb, '{}')
                        || jsonb_build_object('h ' || v_q,
                               CASE WHEN h_floor IS NOT NULL
                                    THEN jsonb_build_array(h_kept -> 0, h_kept -> 1, h_floor || coalesce(v_new, '{}'),
                                                           (h_kept ->> 3)::numeric
                                                           + CASE WHEN dear THEN took ELSE 0 END)
                                    ELSE jsonb_build_array(extract(epoch FROM clock_timestamp()), v_epoch,
                                                           coalesce(v_new, '{}'), took) END))::text,
                       false);
END;
$$;

-- The queue state a claim keeps for the session's next claim on the queue, in the session setting
-- pgjobs.fair_hint (jsonb: queue -> [seen_max_id, quiet_claims, claimed at]); fair_queues gets the first two when it
-- writes the row anyway (see the top of this file, "Under a held snapshot": a row rewritten by every claim
-- is a version chain every claim walks). Only hints: a session without one starts from the row, and a stale
-- seen_max_id costs a sweep. (ring_from is not among them: _fair_ring_raise has why.) Set like SET, so a
-- rolled-back claim leaves the hint as it was.
CREATE OR REPLACE FUNCTION pgjobs._fair_save_hint(v_q text, v_seen bigint, v_quiet boolean, v_quiet_claims int)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    PERFORM set_config('pgjobs.fair_hint',
                       jsonb_set(coalesce(nullif(current_setting('pgjobs.fair_hint', true), '')::jsonb, '{}'),
                                 ARRAY[v_q],
                                 jsonb_build_array(coalesce(v_seen, 0),
                                                   CASE WHEN v_quiet THEN v_quiet_claims + 1 ELSE 0 END,
                                                   extract(epoch FROM clock_timestamp())))::text,
                       false);
END;
$$;

-- The ring_from this claim may raise the queue's to now (NULL: none). Why a lock: a claim draws its cursors'
-- new places (served_seq) from served_seq_seq and commits them a moment later. Meanwhile another claim that
-- reads the lowest place of the cursors (_fair_ring_floor) does not see those: it sees such a cursor at its
-- old place (lower: harmless) or, for a cursor never served (0) or created by that claim, not at all, and
-- could raise ring_from past the place drawn for it; once committed there, the cursor was below ring_from,
-- and no claim read it again: its group's jobs stayed pending for good (tests/sql/test_fair_races.py). So every claim holds the lock below in share mode from
-- before it draws a place to its commit (_claim_fair), and the lowest place is read only by a claim that
-- gets it in exclusive mode, in a statement of its own after that: no other claim is then between drawing
-- and committing, and any place drawn later is higher than all it reads. The exclusive hold is a session
-- lock released right after that read (an error in between releases it too), so claims of the queue wait
-- for one index read at most, never for this claim's transaction. `v_own`: the lowest place this claim
-- drew for cursors it has not stamped visibly yet (else NULL). Tried only by a claim that is not quiet
-- (every 8th or so: the row is written then anyway); when another claim holds the lock, ring_from stays
-- for now. (A session's hint raising it too, by what that session saw: not safe.)
CREATE OR REPLACE FUNCTION pgjobs._fair_ring_raise(v_q text, v_quiet boolean, v_own bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_key bigint := hashtextextended('pgjobs.ring:' || v_q, 0);
    v_new bigint;
BEGIN
    -- (READ COMMITTED only: the read below must see every claim that committed before the lock was taken)
    IF v_quiet OR current_setting('transaction_isolation') <> 'read committed' OR NOT pg_try_advisory_lock(v_key) THEN
        RETURN NULL;
    END IF;
    BEGIN
        SELECT least(x.fl, coalesce(greatest(x.ring_from, v_own), x.fl)) INTO v_new
          FROM (SELECT _fair_ring_floor(v_q, f.ring_from) AS fl, f.ring_from
                  FROM fair_queues AS f WHERE f.queue = v_q) AS x;
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        PERFORM pg_advisory_unlock(v_key);
        RAISE;
    END;
    PERFORM pg_advisory_unlock(v_key);
    RETURN v_new;
END;
$$;

-- The ring_from a claim writes to fair_queues (when it writes the row: see _fair_save_hint): the lowest
-- served_seq of a served cursor, read from the row's own ring_from on. Not the session's hint, nor what a
-- walk from it met: any session can SET pgjobs.fair_hint, and a ring_from too high in the shared row
-- would make every claim pass over the cursors below it. The row is written every 8th claim or so, so
-- this reads past the stamps of about that many claims.
CREATE OR REPLACE FUNCTION pgjobs._fair_ring_floor(v_q text, v_from bigint)
RETURNS bigint
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN greatest(v_from, coalesce((SELECT c.served_seq FROM pgjobs.group_cursors AS c
                                       WHERE c.queue = v_q AND c.served_seq + 0 > 0
                                         AND (c.served_seq, c.group_key) > (v_from - 1, '')
                                       ORDER BY c.served_seq, c.group_key
                                       LIMIT 1), v_from));
END;
$$;

-- One pass of the fast path where head floors are in play (a cursor of the ring read has one that holds, or
-- this session keeps floors: "Head floors"): how each head is probed (1, 2, 3: below), from where, and the
-- new floors for the stamp (v_fnow: a cursor's floor holds past this, _fair_fast's _fair_grace, once a claim);
-- and the groups found with no pending job from the front (_fair_floor_empty). Apart from the pass without
-- floors (_fair_fast), which is the usual claim: its extra steps per group (the mode, the first pending job,
-- the take by ctid) cost the fair queue's clean throughput 0.87x when every pass ran them (150,000 jobs, 1
-- process at concurrency 50, 4 runs each).
CREATE OR REPLACE FUNCTION pgjobs._fair_fast_floors(v_q text, v_open text[], h_kept jsonb, v_epoch bigint, v_need int,
                                                    v_at bigint, r_key text[], r_seq bigint[], r_ctid tid[],
                                                    a_key text[], a_cnt int[], v_fnow timestamptz,
                                                    OUT p_ids bigint[], OUT p_tids tid[], OUT p_ctids tid[],
                                                    OUT p_seqs bigint[], OUT p_last bigint, OUT p_fm int[],
                                                    OUT p_fp smallint[], OUT p_fr timestamptz[], OUT p_fi bigint[],
                                                    OUT p_fu timestamptz[], OUT p_n int, OUT p_end bigint,
                                                    OUT p_locked text[], OUT p_dry text[], OUT p_floors boolean,
                                                    OUT p_eo int[], OUT p_ectid tid[], OUT p_efp smallint[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    WITH lk AS (
        SELECT x.o, x.group_key, x.served_seq, x.seq, c.tid, c.floor_priority, c.floor_run_at, c.floor_id,
               c.floor_until, c.floor_epoch
          -- the served_seq values, drawn in ring order
          FROM (SELECT u.o, u.group_key, u.served_seq, u.tid, nextval('served_seq_seq') AS seq
                  FROM unnest(r_key, r_seq, r_ctid) WITH ORDINALITY AS u(group_key, served_seq, tid, o)
                 WHERE u.o > v_at) AS x
         CROSS JOIN LATERAL (
                -- a cursor another claim holds (or rewrote since the read) is passed over
                SELECT c.ctid AS tid, c.floor_priority, c.floor_run_at, c.floor_id, c.floor_until,
                       c.floor_epoch
                  FROM group_cursors AS c
                 WHERE c.ctid = x.tid AND c.queue = v_q AND c.group_key = x.group_key
                   FOR UPDATE SKIP LOCKED) AS c
         LIMIT v_need
    ), r AS (
        SELECT lk.o, lk.served_seq, lk.seq, lk.tid, h.id, h.jtid, m.m, fa.priority AS fp, fa.run_at AS fr,
               fa.id AS fi, lk.floor_until AS fu, lk.floor_priority AS ofp
          FROM lk
          -- How this group's head is probed (see "Head floors"): 1, from the group's floor in its cursor
          -- (still good, and no job more urgent than it pending); 2, from the front, while this session
          -- keeps floors (a held snapshot: the floor is set then); 3, from the front, as without one.
         CROSS JOIN LATERAL (
                SELECT CASE WHEN lk.floor_epoch = v_epoch AND lk.floor_until > v_fnow
                                 AND NOT EXISTS (SELECT 1 FROM jobs AS u
                                                  WHERE u.state = 'pending' AND u.queue = v_q
                                                    AND u.group_key = lk.group_key
                                                    AND u.priority < lk.floor_priority) THEN 1
                            WHEN h_kept IS NOT NULL THEN 2 ELSE 3 END AS m
                OFFSET 0) AS m   -- (a fence: else the planner copies the CASE, and its probe, into each use)
          -- 1 and 2: the group's first pending job of any kind, locked or not, a read that passes the
          -- dead entries (and the new floor: one that holds for every claimer, whatever its kinds and
          -- whoever holds a row); the head is then probed from there, past none of them
          LEFT JOIN LATERAL (
                SELECT a.priority, a.run_at, a.id, a.ctid
                  FROM jobs AS a
                 WHERE m.m < 3 AND a.state = 'pending' AND a.queue = v_q AND a.group_key = lk.group_key
                   AND (a.priority, a.run_at, a.id)
                       >= (CASE WHEN m.m = 1 THEN lk.floor_priority ELSE (-32768)::smallint END,
                           CASE WHEN m.m = 1 THEN lk.floor_run_at ELSE '-infinity' END,
                           CASE WHEN m.m = 1 THEN lk.floor_id ELSE 0 END)
                 ORDER BY a.priority, a.run_at, a.id
                 LIMIT 1) AS fa ON true
          -- (that first job itself when it is free and of a kind asked for, by its ctid: no second
          -- descent of the index; else the probe from it, which runs only when h1 found nothing)
          LEFT JOIN LATERAL (
                SELECT j.id, j.ctid AS jtid
                  FROM jobs AS j
                 WHERE j.ctid = fa.ctid AND j.state = 'pending' AND j.queue = v_q
                   AND j.group_key = lk.group_key AND (v_open IS NULL OR j.kind = ANY (v_open))
                   FOR UPDATE SKIP LOCKED) AS h1 ON true
          LEFT JOIN LATERAL (
                SELECT j.id, j.ctid AS jtid
                  FROM jobs AS j
                 WHERE h1.id IS NULL AND (m.m = 3 OR fa.id IS NOT NULL)
                   AND j.state = 'pending' AND j.queue = v_q AND j.group_key = lk.group_key
                   AND (v_open IS NULL OR j.kind = ANY (v_open))
                   AND (j.priority, j.run_at, j.id)
                       >= (coalesce(fa.priority, (-32768)::smallint), coalesce(fa.run_at, '-infinity'),
                           coalesce(fa.id, 0))
                 ORDER BY j.priority, j.run_at, j.id
                 LIMIT 1
                   FOR UPDATE SKIP LOCKED) AS h2 ON true
         CROSS JOIN LATERAL (SELECT coalesce(h1.id, h2.id) AS id, coalesce(h1.jtid, h2.jtid) AS jtid) AS h
         -- too few groups free (concurrent claims hold the rest): no heads locked for nothing
         WHERE (SELECT count(*) FROM lk) = v_need
    )
    SELECT p.ids, p.tids, p.ctids, p.seqs, p.last, p.fm, p.fp, p.fr, p.fi, p.fu,
           (SELECT count(*)::int FROM lk), (SELECT max(lk.o) FROM lk),
           (SELECT array_agg(lk.group_key ORDER BY lk.o) FROM lk),
           -- (not a group probed from a floor: under a held snapshot the checks before a cursor is
           -- deleted pass every dead entry of the group and of the queue's active jobs, 250-350 ms each
           -- 4 minutes into the fair soak's hold; the walk deletes it when it meets it)
           (SELECT array_agg(lk.group_key) FROM r JOIN lk ON lk.o = r.o
             WHERE r.id IS NULL AND r.m = 3 AND coalesce(a_cnt[array_position(a_key, lk.group_key)], 0) = 0),
           (SELECT bool_or(r.m < 3) FROM r), e.o, e.tid, e.fp
      INTO p_ids, p_tids, p_ctids, p_seqs, p_last, p_fm, p_fp, p_fr, p_fi, p_fu, p_n, p_end,
           p_locked, p_dry, p_floors, p_eo, p_ectid, p_efp
      -- (the new floors: the first pending job's key, or (its priority, now() - 300 ms, 0) when that is
      -- lower, for producers whose transaction began before this claim and commits after it)
      FROM (SELECT array_agg(r.id ORDER BY r.o) AS ids, array_agg(r.jtid ORDER BY r.o) AS tids,
                   array_agg(r.tid ORDER BY r.o) AS ctids, array_agg(r.seq ORDER BY r.o) AS seqs,
                   max(r.served_seq) AS last, array_agg(r.m ORDER BY r.o) AS fm,
                   array_agg(r.fp ORDER BY r.o) AS fp,
                   array_agg(least(r.fr, now() - interval '300 ms') ORDER BY r.o) AS fr,
                   array_agg(CASE WHEN r.fr < now() - interval '300 ms' THEN r.fi ELSE 0 END ORDER BY r.o) AS fi,
                   array_agg(r.fu ORDER BY r.o) AS fu
              FROM r WHERE r.id IS NOT NULL) AS p,
           -- (probed from the front under a held snapshot, no pending job at all: _fair_floor_empty)
           (SELECT array_agg(r.o ORDER BY r.o) AS o, array_agg(r.tid ORDER BY r.o) AS tid,
                   array_agg(coalesce(r.ofp, 0::smallint) ORDER BY r.o) AS fp
              FROM r WHERE r.m = 2 AND r.fi IS NULL) AS e;
END;
$$;

-- The fast path (Cost, last point): a fair queue without caps, no noisy group, no never-served cursor
-- and no kind quota that can run out (the caller checks all that). The picks are then the first `room`
-- groups of the ring whose cursor no other claim holds and that have a head, one head each, in ring order:
-- what the walk picks too, as long as U's turn does not come before the last of them. A group with no
-- head is passed over, as the walk passes it, and its cursor deleted as the walk deletes it when the group
-- has no live work at all (_forget_group: it comes back never served). Race: concurrent
-- claimers read the same front of the ring; a cursor another claim holds (or rewrote since the read) is
-- passed over by SKIP LOCKED within the statement (as the walk sends it to the back of the ring). Returns
-- the picks (ids, tids) when that filled the claim, having stamped the cursors and saved the queue's
-- state; else ids NULL and the ring as read (r_*) with the cursors locked (r_locked), from which
-- _fair_walk takes over: what was locked here (cursors and heads) is this claim's own and is found again
-- (the served_seq values drawn are skipped: harmless).
-- Passes. The first pass locks the first `room` free cursors of the ring (read up to 2 x room + 16) and
-- probes their heads; each further pass (6 in all) locks as many cursors after the last one tried as
-- picks are missing, reading on in chunks 4 times larger (up to v_limit cursors) once the ring as read
-- is used up. Why: with one pass over one read, a group with nothing pending at that moment, or a front
-- of the ring held by another claim, sent the claim to the walk, which probes pick by pick. In the fair
-- soak under a held snapshot (bench/soak.py --fair, 100 groups) that was 516 of the worker's 5,438 claims
-- a minute (claims of about 47), at 37 ms each against 1.9 ms for the fast path, a third of its time; and
-- most claims of the soak's probe (a claim of one: the ring's first 18 cursors were all held by the
-- worker's claim in flight), at 53 ms each.
CREATE OR REPLACE FUNCTION pgjobs._fair_fast(v_q text, room int, v_open text[], h_floor jsonb, h_kept jsonb,
                                             v_epoch bigint, v_t0 timestamptz, v_ring_from bigint, v_limit int,
                                             a_key text[], a_cnt int[], u_out boolean, u_seq bigint,
                                             v_pos text, v_found boolean, v_productive boolean, u_empty boolean,
                                             v_maxid bigint, v_quiet boolean, v_quiet_claims int,
                                             OUT ids bigint[], OUT tids tid[], OUT r_key text[], OUT r_ctid tid[],
                                             OUT r_seq bigint[], OUT r_act int[], OUT r_locked text[],
                                             OUT r_floors boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    f_ids     bigint[] := '{}';
    f_tids    tid[] := '{}';
    f_ctids   tid[] := '{}';
    f_seqs    bigint[] := '{}';
    f_last    bigint;
    p_ids     bigint[];
    p_tids    tid[];
    p_ctids   tid[];
    p_seqs    bigint[];
    p_locked  text[];
    p_dry     text[];
    f_dry     text[] := '{}';  -- groups passed over with no live work: forgotten as the walk does
    f_fm int[] := '{}'; f_fp smallint[] := '{}'; f_fr timestamptz[] := '{}'; f_fi bigint[] := '{}';
    f_fu timestamptz[] := '{}';  -- per pick: how its head was probed, the group's new floor, the old one's end
    p_fm int[]; p_fp smallint[]; p_fr timestamptz[]; p_fi bigint[]; p_fu timestamptz[]; p_floors boolean;
    p_eo int[]; p_ectid tid[]; p_efp smallint[];
    f_eo int[] := '{}'; f_ectid tid[] := '{}'; f_efp smallint[] := '{}';   -- groups found empty from the front
    v_took    numeric;
    v_fl      boolean := false; n_fl boolean;   -- a floor that holds among the cursors read
    v_n       int;
    v_birth   timestamptz;       -- until when the floors set by probes from the front hold
    v_fnow    timestamptz := now() - make_interval(secs => _fair_grace(v_q, 0));   -- floors hold past this
    p_n       int;
    p_end     bigint;
    p_last    bigint;
    v_at      bigint := 0;     -- the ring position up to which passes tried to lock cursors
    v_need    int;
    v_ask     int;             -- the cursors the last ring read asked for
    v_end     boolean := false;  -- the ring as read reaches the ring's end
    n_key     text[];
    n_ctid    tid[];
    n_seq     bigint[];
    n_act     int[];
BEGIN
    r_locked := '{}';
    r_floors := false;
    FOR pass IN 1 .. 6 LOOP
        v_need := room - cardinality(f_ids);
        EXIT WHEN v_need = 0;
        IF v_at >= coalesce(cardinality(r_key), 0) THEN
            -- The ring read (the first pass), or read on past what was read: its cursors were held by other
            -- claims or their groups dry. Why read on: a claim of one beside a worker's claim of 50 found
            -- the ring's first 18 cursors all held by it, and walked (53 ms a claim, the soak's probe, under
            -- a held snapshot). Each chunk 4 times the one before, up to v_limit cursors in all.
            EXIT WHEN v_end OR cardinality(r_key) >= v_limit;
            v_ask := CASE WHEN r_key IS NULL THEN least(2 * room + 16, v_limit)
                          ELSE least(4 * v_ask, v_limit - cardinality(r_key)) END;
            -- (served_seq + 0: a filter, not an index key. Given both served_seq > 0 and the row comparison,
            -- PostgreSQL 18 started the index scan at served_seq > 0, the queue's first stamp: under a held
            -- snapshot every dead stamp since, 16 more index pages for a claim of one after 3,000 jobs
            -- (tests/sql/test_fair_snapshot.py, test_fair_floors.py); 15 starts at the row comparison. The
            -- same in _fair_ring_floor and _fair_ring_chunk.)
            SELECT array_agg(ring.group_key), array_agg(ring.tid), array_agg(ring.served_seq),
                   array_agg(coalesce(a_cnt[array_position(a_key, ring.group_key)], 0)), coalesce(bool_or(ring.fl), false)
              INTO n_key, n_ctid, n_seq, n_act, n_fl
              FROM (SELECT c.group_key, c.served_seq, c.ctid AS tid,
                           c.floor_epoch = v_epoch AND c.floor_until > v_fnow AS fl
                      FROM group_cursors AS c
                     WHERE c.queue = v_q AND c.served_seq + 0 > 0
                       AND (c.served_seq, c.group_key) > (coalesce(r_seq[cardinality(r_seq)], v_ring_from - 1),
                                                          coalesce(r_key[cardinality(r_key)], ''))
                     ORDER BY c.served_seq, c.group_key
                     LIMIT v_ask) AS ring;
            v_end := coalesce(cardinality(n_key), 0) < v_ask;
            EXIT WHEN n_key IS NULL;
            r_key := r_key || n_key; r_ctid := r_ctid || n_ctid; r_seq := r_seq || n_seq; r_act := r_act || n_act;
            v_fl := v_fl OR n_fl;   -- (a cursor read has a floor that holds: the passes use _fair_fast_floors)
        END IF;
        IF h_kept IS NOT NULL OR v_fl THEN
            SELECT * INTO p_ids, p_tids, p_ctids, p_seqs, p_last, p_fm, p_fp, p_fr, p_fi, p_fu, p_n, p_end, p_locked,
                          p_dry, p_floors, p_eo, p_ectid, p_efp
              FROM _fair_fast_floors(v_q, v_open, h_kept, v_epoch, v_need, v_at, r_key, r_seq, r_ctid, a_key, a_cnt,
                                     v_fnow);
            f_eo := f_eo || coalesce(p_eo, '{}'); f_ectid := f_ectid || coalesce(p_ectid, '{}');
            f_efp := f_efp || coalesce(p_efp, '{}');
        ELSE
            -- No floor in play (the usual claim): one probe of each head from the front, no floor kept.
            WITH lk AS (
                SELECT x.o, x.group_key, x.served_seq, x.seq, c.tid
                  -- the served_seq values, drawn in ring order
                  FROM (SELECT u.o, u.group_key, u.served_seq, u.tid, nextval('served_seq_seq') AS seq
                          FROM unnest(r_key, r_seq, r_ctid) WITH ORDINALITY AS u(group_key, served_seq, tid, o)
                         WHERE u.o > v_at) AS x
                 CROSS JOIN LATERAL (
                        -- a cursor another claim holds (or rewrote since the read) is passed over
                        SELECT c.ctid AS tid
                          FROM group_cursors AS c
                         WHERE c.ctid = x.tid AND c.queue = v_q AND c.group_key = x.group_key
                           FOR UPDATE SKIP LOCKED) AS c
                 LIMIT v_need
            ), r AS (
                SELECT lk.o, lk.served_seq, lk.seq, lk.tid, h.id, h.jtid
                  FROM lk
                  LEFT JOIN LATERAL (
                        SELECT j.id, j.ctid AS jtid
                          FROM jobs AS j
                         WHERE j.state = 'pending' AND j.queue = v_q AND j.group_key = lk.group_key
                           AND (v_open IS NULL OR j.kind = ANY (v_open))
                         ORDER BY j.priority, j.run_at, j.id
                         LIMIT 1
                           FOR UPDATE SKIP LOCKED) AS h ON true
                 -- too few groups free (concurrent claims hold the rest): no heads locked for nothing
                 WHERE (SELECT count(*) FROM lk) = v_need
            )
            SELECT (SELECT array_agg(r.id ORDER BY r.o) FROM r WHERE r.id IS NOT NULL),
                   (SELECT array_agg(r.jtid ORDER BY r.o) FROM r WHERE r.id IS NOT NULL),
                   (SELECT array_agg(r.tid ORDER BY r.o) FROM r WHERE r.id IS NOT NULL),
                   (SELECT array_agg(r.seq ORDER BY r.o) FROM r WHERE r.id IS NOT NULL),
                   (SELECT max(r.served_seq) FROM r WHERE r.id IS NOT NULL),
                   (SELECT count(*)::int FROM lk), (SELECT max(lk.o) FROM lk),
                   (SELECT array_agg(lk.group_key ORDER BY lk.o) FROM lk),
                   (SELECT array_agg(lk.group_key) FROM r JOIN lk ON lk.o = r.o
                     WHERE r.id IS NULL AND coalesce(a_cnt[array_position(a_key, lk.group_key)], 0) = 0)
              INTO p_ids, p_tids, p_ctids, p_seqs, p_last, p_n, p_end, p_locked, p_dry;
            v_n := coalesce(cardinality(p_ids), 0);   -- (the stamp's arrays stay aligned with the picks)
            p_fm := array_fill(3, ARRAY[v_n]); p_fp := array_fill(NULL::smallint, ARRAY[v_n]);
            p_fr := array_fill(NULL::timestamptz, ARRAY[v_n]); p_fi := array_fill(NULL::bigint, ARRAY[v_n]);
            p_fu := p_fr; p_floors := false;
        END IF;
        f_dry := f_dry || coalesce(p_dry, '{}');
        -- (a floor used: the rounds, after a fast path come up short, would probe from the front past it)
        r_floors := r_floors OR coalesce(p_floors, false);
        r_locked := r_locked || coalesce(p_locked, '{}');
        -- Fewer cursors free than wanted: no heads were probed. None locked (a front of the ring held by
        -- other claims): read on; some: the walk's (it probes them; the fast path would pass them over).
        EXIT WHEN p_n BETWEEN 1 AND v_need - 1;
        f_ids := f_ids || coalesce(p_ids, '{}'); f_tids := f_tids || coalesce(p_tids, '{}');
        f_ctids := f_ctids || coalesce(p_ctids, '{}'); f_seqs := f_seqs || coalesce(p_seqs, '{}');
        f_fm := f_fm || coalesce(p_fm, '{}'); f_fp := f_fp || coalesce(p_fp, '{}');
        f_fr := f_fr || coalesce(p_fr, '{}'); f_fi := f_fi || coalesce(p_fi, '{}'); f_fu := f_fu || coalesce(p_fu, '{}');
        f_last := greatest(f_last, p_last);
        v_at := CASE WHEN p_n = 0 THEN cardinality(r_key) ELSE p_end END;
    END LOOP;
    IF 2 = ANY (f_fm) OR cardinality(f_eo) > 0 THEN
        -- as long as this session's floors hold, with this claim's time counted in (_fair_floors_save
        -- adds it when dear): the probes from the front of all groups cost a twentieth of the time at
        -- most, as the session's own floors do; a floor set by one group's probe alone would hold for
        -- 20 times that probe, and a probe of each group in a claim of its own cost them all that often
        v_took := extract(epoch FROM clock_timestamp() - v_t0);
        v_birth := CASE WHEN h_floor IS NOT NULL
                        THEN to_timestamp((h_kept ->> 0)::numeric
                                          + greatest(_fair_count_every(), 20 * ((h_kept ->> 3)::numeric + v_took)))
                        ELSE now() + greatest(_fair_count_every(), 20 * v_took) * interval '1 s' END;
    END IF;
    IF cardinality(f_eo) > 0 THEN   -- (whether or not the fast path fills the claim: the walk's ring follows)
        r_ctid := _fair_floor_empty(v_q, v_epoch, v_birth, f_eo, f_ectid, f_efp, r_ctid);
    END IF;
    IF cardinality(f_ids) = room AND (u_out OR u_seq > f_last) THEN
        -- (a group passed over with no active job either: its cursor goes, as when the walk meets it, so
        -- that it comes back never served; the walk does it when it takes over. Not under a held snapshot
        -- (r.m < 3): the checks before the delete pass every dead entry of the group and of the queue's
        -- active jobs, 250-350 ms a group in the fair soak, and a claim that met dozens took over 30 s;
        -- the cursor stays, and the fast path passes over it from its floor)
        PERFORM _forget_group(v_q, d.k) FROM unnest(f_dry) AS d(k);
        IF NOT f_fm && ARRAY[1, 2] THEN   -- no floor used: the stamp leaves the cursors' floors as they are
            f_fm := NULL; f_fp := NULL; f_fr := NULL; f_fi := NULL; f_fu := NULL;
        END IF;
        PERFORM _fair_stamp(v_q, f_ctids, f_seqs, v_pos, v_found, v_productive, u_empty, v_maxid, v_quiet,
                            v_quiet_claims, f_fm => f_fm, f_fp => f_fp, f_fr => f_fr, f_fi => f_fi, f_fu => f_fu,
                            v_epoch => v_epoch, v_birth => v_birth);
        ids := f_ids;
        tids := f_tids;
    END IF;
END;
$$;

-- When a new head floor in a cursor ends, given the end of the floors it is set with (v_birth: _fair_fast):
-- a time of its own in the last quarter of their life. Floors set together ended together, and the claim
-- after found every group without one, probed them all from the front and then ran the rounds, which probe
-- every group from the front again (2-4 s seven minutes into the fair soak's hold); spread, a claim meets a
-- few at a time. (_fair_stamp for picked heads, _fair_floor_empty for groups found empty.)
CREATE OR REPLACE FUNCTION pgjobs._fair_floor_end(v_birth timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN now() + (v_birth - now()) * (0.75 + 0.25 * random());
END;
$$;

-- A floor for each group the fast path probed from the front under a held snapshot (mode 2: _fair_fast_floors)
-- and found with no pending job at all: (its old floor's priority, else 0; now() - 300 ms; 0), of this claim
-- epoch, until v_until, as a picked group's floor. Why: floors came only from picked heads, so a group with
-- nothing pending kept none, and every claim probed it from the front past every job of it claimed since the
-- snapshot. On a queue drained under a held snapshot (at 60 % load, every few seconds) that was every group at
-- every claim: the fair soak's worker stalled for 5-10 s at a time, 6-9 minutes into its hold (90-670 jobs/s in
-- a window, a backlog of 187,000). What such a floor hides: a job of a lower priority is probed for first, as
-- for every floor; a job filed below it with an older run_at moves the claim epoch; a late commit (a producer
-- whose transaction began over 300 ms before) waits for the floor's end, as with every floor. The cursors are
-- rewritten: r_ctid (the ring as read, which the walk takes over) gets their new places (by ring position).
CREATE OR REPLACE FUNCTION pgjobs._fair_floor_empty(v_q text, v_epoch bigint, v_until timestamptz, e_o int[],
                                                    e_ctid tid[], e_fp smallint[], r_ctid tid[])
RETURNS tid[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF v_epoch IS NULL OR v_until IS NULL THEN   -- (no floors in this claim: a promotion moved the epoch)
        RETURN r_ctid;
    END IF;
    WITH w AS (
        UPDATE group_cursors AS c
           SET floor_priority = e.fp, floor_run_at = now() - interval '300 ms', floor_id = 0,
               floor_epoch = v_epoch, floor_until = _fair_floor_end(v_until)
          FROM unnest(e_o, e_ctid, e_fp) AS e(o, tid, fp)
         -- (= ANY as well, as _fair_stamp: a TID scan whatever the generic plan makes of the join; one call took
         -- 7 s near the end of a ten-minute fair hold, a cause not established)
         WHERE c.ctid = e.tid AND c.ctid = ANY (e_ctid) AND c.queue = v_q
        RETURNING e.o, c.ctid AS tid
    )
    SELECT array_agg(coalesce(w.tid, r.tid) ORDER BY r.o)
      INTO r_ctid
      FROM unnest(r_ctid) WITH ORDINALITY AS r(tid, o)
      LEFT JOIN w ON w.o = r.o;
    RETURN r_ctid;
END;
$$;

-- What a claim writes once it has its picks: the served cursors' new places in the ring (f_ctids: the
-- cursors as locked, f_seqs: their served_seq values drawn in ring order; the walk stamps its own before,
-- _fair_finish), the queue's shared state when a shared setting changed (ring_from raised when
-- _fair_ring_raise may; U's place when the walk moved it: u_seq, u_served), and the session's hint.
CREATE OR REPLACE FUNCTION pgjobs._fair_stamp(v_q text, f_ctids tid[], f_seqs bigint[], v_pos text, v_found boolean,
                                              v_productive boolean, u_empty boolean, v_maxid bigint,
                                              v_quiet boolean, v_quiet_claims int, u_seq bigint DEFAULT NULL,
                                              u_served boolean DEFAULT false, f_fm int[] DEFAULT NULL,
                                              f_fp smallint[] DEFAULT NULL, f_fr timestamptz[] DEFAULT NULL,
                                              f_fi bigint[] DEFAULT NULL, f_fu timestamptz[] DEFAULT NULL,
                                              v_epoch bigint DEFAULT NULL, v_birth timestamptz DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    -- (the cursors stamped here are counted apart: the read sees them at their old places, or not at all)
    v_raise bigint := _fair_ring_raise(v_q, v_quiet, (SELECT min(x) FROM unnest(f_seqs) AS x));
BEGIN
    WITH stamp AS (
        -- (the group's floor: carried on when its head was probed from it, keeping its end and epoch; set
        -- when probed from the front under a held snapshot; else left as it was, a floor as good as before)
        UPDATE group_cursors AS c
           SET served_seq = s.seq, last_served_at = now(),
               floor_priority = CASE WHEN s.m < 3 THEN s.fp ELSE c.floor_priority END,
               floor_run_at = CASE WHEN s.m < 3 THEN s.fr ELSE c.floor_run_at END,
               floor_id = CASE WHEN s.m < 3 THEN s.fi ELSE c.floor_id END,
               floor_until = CASE s.m WHEN 1 THEN s.fu WHEN 2 THEN _fair_floor_end(v_birth) ELSE c.floor_until END,
               floor_epoch = CASE WHEN s.m < 3 THEN v_epoch ELSE c.floor_epoch END
          FROM unnest(f_ctids, f_seqs, f_fm, f_fp, f_fr, f_fi, f_fu) AS s(tid, seq, m, fp, fr, fi, fu)
         WHERE c.ctid = s.tid AND c.ctid = ANY (f_ctids)
    )
    UPDATE fair_queues AS f
       SET ungrouped_seq = coalesce(u_seq, f.ungrouped_seq),
           ungrouped_served_at = CASE WHEN u_served THEN now() ELSE f.ungrouped_served_at END,
           ring_from = greatest(f.ring_from, v_raise),
           discover_after = v_pos,
           discover_found = v_found,
           discover_productive = v_productive,
           ungrouped_empty = coalesce(u_empty, f.ungrouped_empty),
           seen_max_id = coalesce(v_maxid, 0),
           quiet_claims = CASE WHEN v_quiet THEN v_quiet_claims + 1 ELSE 0 END,
           updated_at = now()
     WHERE f.queue = v_q
       -- only when a shared setting changes (a sweep ran, U's place or state moved): see _fair_save_hint
       AND (NOT v_quiet OR u_served OR f.ungrouped_seq <> coalesce(u_seq, f.ungrouped_seq)
            OR f.discover_after IS DISTINCT FROM v_pos OR f.discover_found <> v_found
            OR f.discover_productive <> v_productive
            OR f.ungrouped_empty <> coalesce(u_empty, f.ungrouped_empty))
       AND f.ctid = (SELECT x.ctid FROM fair_queues AS x WHERE x.queue = v_q FOR UPDATE SKIP LOCKED);
    PERFORM _fair_save_hint(v_q, v_maxid, v_quiet, v_quiet_claims);
END;
$$;

-- The drain (Cost, the point after the fast path): when every pending job of the ring's groups fits in this
-- claim, fairness has nothing to decide, and the claim takes them all. That is the usual claim of a worker
-- that keeps up (pending work arrives and is taken in small numbers over many groups): there the fast path,
-- one head from each of `room` groups, comes up short (half the groups have nothing pending at any moment),
-- and the walk took over, pick by pick, 29 % of the claims and 6.7 ms each (bench/soak.py --fair at 60 %,
-- 100 groups; pg_stat_user_functions). The caller checks what the fast path needs (no caps, no noisy group,
-- no kind quota that can run out: the worker's claims name their kinds, each with a quota of the claim's
-- size) and that the ungrouped jobs have no turn, and calls it only while this session keeps no
-- head floors (those mean a held snapshot made head probes dear). The ring (never-served cursors too) is
-- read whole, up to 4 x room + 128 cursors (else the fast path and the walk as before). Two statements: a
-- count that stops at room + 1 pending jobs (a backlog costs it a few probes), then, when they fit, the
-- same count again as a gate (one snapshot: nothing that arrived in between is taken unless all of it
-- fits) and the take: cursors and jobs locked SKIP LOCKED (a group another claim holds is left to it), the
-- served cursors stamped once each in ring order. Cursors of groups with nothing pending stay (the walk
-- deletes them when it meets them), so a group that runs dry and comes back keeps its place instead of
-- coming back never served. Nothing pending: NULL, and the walk runs (it sweeps for groups without a
-- cursor when a claim finds nothing; a drain that takes some leaves that to the every-8th-claim sweep).
CREATE OR REPLACE FUNCTION pgjobs._fair_drain(v_q text, room int, v_open text[], v_ring_from bigint, v_unserved boolean,
                                              a_key text[], a_cnt int[], v_total int, v_noisy_min int,
                                              v_noisy_share real, v_pos text, v_found boolean, v_productive boolean,
                                              u_empty boolean, v_maxid bigint, v_quiet boolean, v_quiet_claims int,
                                              rounds boolean, v_epoch bigint, OUT ids bigint[], OUT tids tid[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_max   int := 4 * room + 128;   -- cursors read, at most (the ring is read whole, or not at all)
    v_n     int;
    v_fl    boolean;                 -- a cursor's floor holds (under the claim epoch v_epoch)
    f_ctids tid[];
    f_seqs  bigint[];
    v_v     bigint := _fair_index_visits('jobs_group_idx');
    v_t0    timestamptz := clock_timestamp();
    v_fnow  timestamptz;             -- floors hold past this (_fair_grace)
    v_kd    jsonb;                   -- this session's last dear drain or rounds: [kept at, NULL, seconds]
BEGIN
    -- Its reads pass the dead entries of every group's claimed jobs that a held snapshot keeps (a head probe
    -- passes one group's): once they proved dear, the session leaves its claims to the fast path and the walk
    -- for pgjobs.fair_count_every seconds or 20 times what they took, when that is longer (kept as 'd <queue>':
    -- [kept at, NULL, seconds]; a twentieth of the session's time at most, as the shared gates. For a second
    -- only, the rounds after a fast path without floors ran every 20 s in the fair soak's hold, 4-6 s each
    -- 7-9 minutes into it). Rounds only for claims of 8 or more: a smaller one that came up short is the
    -- walk's, which stops at the first heads it finds.
    v_kd := CASE WHEN coalesce(current_setting('pgjobs.fair_kept', true), '') NOT IN ('', '{}')   -- (no parse: clean)
                 THEN current_setting('pgjobs.fair_kept', true)::jsonb -> ('d ' || v_q) END;
    IF (rounds AND room < 8) OR (v_kd ->> 0)::numeric + greatest(_fair_count_every(), 20 * (v_kd ->> 2)::numeric)
                                > extract(epoch FROM clock_timestamp()) THEN
        RETURN;
    END IF;
    v_fnow := now() - make_interval(secs => _fair_grace(v_q, 0));
    IF rounds THEN
        SELECT * INTO ids, tids, f_ctids, f_seqs
          FROM _fair_rounds(v_q, room, v_open, v_ring_from, v_max, a_key, a_cnt, v_total, v_noisy_min, v_noisy_share);
        PERFORM _fair_keep('d ' || v_q, _fair_index_visits('jobs_group_idx') - v_v > 4 * room + 500, v_t0,
                           jsonb_build_array(extract(epoch FROM clock_timestamp() - v_t0)));
        IF ids IS NOT NULL THEN
            PERFORM _fair_stamp(v_q, f_ctids, f_seqs, v_pos, v_found, v_productive, u_empty, v_maxid, v_quiet,
                                v_quiet_claims);
        END IF;
        RETURN;
    END IF;
    -- (a cursor met with a floor that holds, "Head floors", means the same as a session's floors: the drain
    -- is left to the fast path, which starts there; its probes from the front would pass what the floor
    -- skips, a held snapshot's dead entries)
    SELECT count(*) FILTER (WHERE NOT p.fl), coalesce(bool_or(p.fl), false) INTO v_n, v_fl
      FROM (SELECT r.fl
              FROM (SELECT c.group_key, false AS fl FROM group_cursors AS c
                     WHERE v_unserved AND c.queue = v_q AND c.served_seq = 0
                    UNION ALL
                    (SELECT c.group_key, coalesce(c.floor_epoch = v_epoch AND c.floor_until > v_fnow, false)
                       FROM group_cursors AS c
                      WHERE c.queue = v_q AND c.served_seq + 0 > 0 AND (c.served_seq, c.group_key) > (v_ring_from - 1, '')
                      ORDER BY c.served_seq, c.group_key
                      LIMIT v_max)) AS r
              LEFT JOIN LATERAL (SELECT 1 AS one FROM jobs AS j
                                  WHERE NOT r.fl AND j.state = 'pending' AND j.queue = v_q AND j.group_key = r.group_key
                                   AND (v_open IS NULL OR j.kind = ANY (v_open))
                                  LIMIT room + 1) AS x ON true
             WHERE x.one IS NOT NULL OR r.fl
             LIMIT room + 1) AS p;
    IF v_fl THEN
        RETURN;
    END IF;
    PERFORM _fair_keep('d ' || v_q, _fair_index_visits('jobs_group_idx') - v_v > 4 * room + 500, v_t0,
                       jsonb_build_array(extract(epoch FROM clock_timestamp() - v_t0)));
    IF v_n = 0 OR v_n > room THEN
        RETURN;
    END IF;
    WITH ring AS MATERIALIZED (
        SELECT c.group_key, c.served_seq, c.ctid AS tid FROM group_cursors AS c
         WHERE v_unserved AND c.queue = v_q AND c.served_seq = 0
        UNION ALL
        (SELECT c.group_key, c.served_seq, c.ctid FROM group_cursors AS c
          WHERE c.queue = v_q AND c.served_seq + 0 > 0 AND (c.served_seq, c.group_key) > (v_ring_from - 1, '')
          ORDER BY c.served_seq, c.group_key
          LIMIT v_max)
    ), pend AS MATERIALIZED (
        SELECT r.group_key
          FROM ring AS r
         CROSS JOIN LATERAL (SELECT 1 FROM jobs AS j
                              WHERE j.state = 'pending' AND j.queue = v_q AND j.group_key = r.group_key
                                   AND (v_open IS NULL OR j.kind = ANY (v_open))
                              LIMIT room + 1) AS x
         LIMIT room + 1
    ), took AS MATERIALIZED (
        SELECT r.group_key, r.served_seq, c.tid, j.id, j.jtid, j.priority, j.run_at
          FROM ring AS r
         CROSS JOIN LATERAL (
                SELECT c.ctid AS tid
                  FROM group_cursors AS c
                 WHERE c.ctid = r.tid AND c.queue = v_q AND c.group_key = r.group_key
                   FOR UPDATE SKIP LOCKED) AS c
         CROSS JOIN LATERAL (
                SELECT j.id, j.ctid AS jtid, j.priority, j.run_at
                  FROM jobs AS j
                 WHERE j.state = 'pending' AND j.queue = v_q AND j.group_key = r.group_key
                                   AND (v_open IS NULL OR j.kind = ANY (v_open))
                 ORDER BY j.priority, j.run_at, j.id
                 LIMIT room
                   FOR UPDATE SKIP LOCKED) AS j
         -- Groups with work only (no dry cursor locked), and only when all of it fits, in this snapshot,
         -- and no group can turn noisy in this claim (its active jobs after it at least noisy_min_active and
         -- more than noisy_share of the queue's before it): then the walk's picks are round by round, each
         -- round in ring order, and so are these (below).
         WHERE r.group_key IN (SELECT p.group_key FROM pend AS p)
           AND (SELECT count(*) FROM ring) < v_max AND (SELECT count(*) FROM pend) <= room
           AND NOT EXISTS (SELECT 1 FROM (SELECT p.group_key, count(*) AS n FROM pend AS p GROUP BY p.group_key) AS x
                            WHERE coalesce(a_cnt[array_position(a_key, x.group_key)], 0) + x.n >= v_noisy_min
                              AND coalesce(a_cnt[array_position(a_key, x.group_key)], 0) + x.n
                                  > v_noisy_share * coalesce(v_total, 0))
         LIMIT room
    ), o AS MATERIALIZED (
        -- Each pick's round (its rank in its group) and its group's place in the first round: never-served
        -- groups first, by their heads (rule 4), then the ring's order (rule 3). A group's last pick is
        -- in round n (its picks), so its new place in the ring follows (n, place).
        SELECT t.id, t.jtid, t.tid, t.group_key, t.served_seq,
               row_number() OVER w AS rk, count(*) OVER (PARTITION BY t.tid) AS n,
               first_value(t.priority) OVER w AS hp, first_value(t.run_at) OVER w AS hr,
               first_value(t.id) OVER w AS hi
          FROM took AS t
        WINDOW w AS (PARTITION BY t.tid ORDER BY t.priority, t.run_at, t.id)
    ), g AS (
        SELECT s.tid, nextval('served_seq_seq') AS seq
          FROM (SELECT o.tid, o.n, o.served_seq, o.hp, o.hr, o.hi, o.group_key FROM o WHERE o.rk = 1
                 ORDER BY o.n, o.served_seq, o.hp, o.hr, o.hi, o.group_key) AS s
    )
    SELECT (SELECT array_agg(o.id ORDER BY o.rk, o.served_seq, o.hp, o.hr, o.hi, o.group_key) FROM o),
           (SELECT array_agg(o.jtid ORDER BY o.rk, o.served_seq, o.hp, o.hr, o.hi, o.group_key) FROM o),
           (SELECT array_agg(g.tid) FROM g), (SELECT array_agg(g.seq) FROM g)
      INTO ids, tids, f_ctids, f_seqs;
    IF ids IS NULL THEN
        RETURN;   -- more came meanwhile, a group could turn noisy, or other claims hold it all: not drained
    END IF;
    PERFORM _fair_stamp(v_q, f_ctids, f_seqs, v_pos, v_found, v_productive, u_empty, v_maxid, v_quiet,
                        v_quiet_claims);
END;
$$;

-- Rounds (the drain's second use, after the fast path came up short): more is pending than the claim takes,
-- but fewer groups than its size have a head free, or some of the first ones have none. While no group can
-- turn noisy, the walk's picks are then round by round, each round in ring order: the claim takes the
-- `room` first jobs in (rank in its group, place of its group) order. So: the served ring read whole (at most
-- v_max cursors; no never-served cursor, as the fast path requires), each group's pending jobs counted up
-- to `room`, the depth R of the last round (the least R with sum(least(n, R)) >= room), each group's share
-- (least(n, R - 1), and one more for the first groups in ring order that have R or more, up to `room`),
-- then one statement locks the cursors and those jobs (SKIP LOCKED). Anything short of the plan (another
-- claim holds a cursor or a job, one could turn noisy, the ring is longer): NULL, and the walk takes over
-- (what was locked is this claim's own and found again). Returns the picks in the walk's order and the
-- cursors with their new places, drawn in the order of each group's last pick.
CREATE OR REPLACE FUNCTION pgjobs._fair_rounds(v_q text, room int, v_open text[], v_ring_from bigint, v_max int,
                                               a_key text[], a_cnt int[], v_total int, v_noisy_min int,
                                               v_noisy_share real, OUT ids bigint[], OUT tids tid[],
                                               OUT f_ctids tid[], OUT f_seqs bigint[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    g_key text[]; g_tid tid[]; g_seq bigint[]; g_n int[]; g_q int[];
    v_ring int;
    v_r    int;   -- the depth of the last round
    v_want int;
    v_got  int;
BEGIN
    SELECT array_agg(r.group_key ORDER BY r.served_seq, r.group_key), array_agg(r.tid ORDER BY r.served_seq, r.group_key),
           array_agg(r.served_seq ORDER BY r.served_seq, r.group_key), array_agg(x.n ORDER BY r.served_seq, r.group_key),
           count(*)
      INTO g_key, g_tid, g_seq, g_n, v_ring
      FROM (SELECT c.group_key, c.served_seq, c.ctid AS tid FROM group_cursors AS c
             WHERE c.queue = v_q AND c.served_seq + 0 > 0 AND (c.served_seq, c.group_key) > (v_ring_from - 1, '')
             ORDER BY c.served_seq, c.group_key
             LIMIT v_max) AS r
     CROSS JOIN LATERAL (SELECT count(*)::int AS n
                           FROM (SELECT 1 FROM jobs AS j
                                  WHERE j.state = 'pending' AND j.queue = v_q AND j.group_key = r.group_key
                                    AND (v_open IS NULL OR j.kind = ANY (v_open))
                                  LIMIT room) AS y) AS x;
    IF v_ring >= v_max OR g_key IS NULL THEN
        RETURN;
    END IF;
    -- Counts sorted: below the i-th smallest s, sum(least(n, r)) = (sum of the smaller ones) + (those left) * r.
    SELECT ceil((room - x.prev)::numeric / x.k)::int INTO v_r
      FROM (SELECT t.s, coalesce(sum(t.s) OVER (ORDER BY t.s, t.o ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS prev,
                   count(*) OVER () - row_number() OVER (ORDER BY t.s, t.o) + 1 AS k
              FROM unnest(g_n) WITH ORDINALITY AS t(s, o) WHERE t.s > 0) AS x
     WHERE x.prev + x.k * x.s >= room
     ORDER BY x.s, x.k DESC
     LIMIT 1;
    v_r := coalesce(v_r, room + 1);   -- (all of it fits: every group gives all it has)
    WITH b AS (
        SELECT t.o, least(t.n, v_r - 1) AS base, t.n >= v_r AS more FROM unnest(g_n) WITH ORDINALITY AS t(n, o)
    ), e AS (
        SELECT b.o, b.base, CASE WHEN b.more THEN row_number() OVER (PARTITION BY b.more ORDER BY b.o) END AS er
          FROM b
    )
    SELECT array_agg(e.base + CASE WHEN e.er <= room - (SELECT sum(b.base) FROM b) THEN 1 ELSE 0 END ORDER BY e.o),
           least(room, sum(e.base) + count(e.er))
      INTO g_q, v_want
      FROM e;
    -- No group may turn noisy in this claim (its active jobs after it at least noisy_min_active and more than
    -- noisy_share of the queue's before it): the walk's order would differ.
    IF EXISTS (SELECT 1 FROM unnest(g_key, g_q) AS t(k, q)
                WHERE t.q > 0
                  AND coalesce(a_cnt[array_position(a_key, t.k)], 0) + t.q >= v_noisy_min
                  AND coalesce(a_cnt[array_position(a_key, t.k)], 0) + t.q > v_noisy_share * coalesce(v_total, 0)) THEN
        RETURN;
    END IF;
    WITH plan AS (
        SELECT t.k, t.tid, t.q, t.o FROM unnest(g_key, g_tid, g_q) WITH ORDINALITY AS t(k, tid, q, o) WHERE t.q > 0
    ), took AS MATERIALIZED (
        SELECT p.k, p.q, p.o, c.tid, j.id, j.jtid, j.rk
          FROM plan AS p
         CROSS JOIN LATERAL (
                SELECT c.ctid AS tid FROM group_cursors AS c
                 WHERE c.ctid = p.tid AND c.queue = v_q AND c.group_key = p.k
                   FOR UPDATE SKIP LOCKED) AS c
         CROSS JOIN LATERAL (
                SELECT y.id, y.jtid, row_number() OVER (ORDER BY y.priority, y.run_at, y.id) AS rk
                  FROM (SELECT j.id, j.ctid AS jtid, j.priority, j.run_at
                          FROM jobs AS j
                         WHERE j.state = 'pending' AND j.queue = v_q AND j.group_key = p.k
                           AND (v_open IS NULL OR j.kind = ANY (v_open))
                         ORDER BY j.priority, j.run_at, j.id
                         LIMIT p.q
                           FOR UPDATE SKIP LOCKED) AS y) AS j
    ), g AS (
        SELECT s.tid, nextval('served_seq_seq') AS seq
          FROM (SELECT DISTINCT ON (t.o) t.tid, t.q, t.o FROM took AS t ORDER BY t.o) AS s
         ORDER BY s.q, s.o
    )
    SELECT (SELECT count(*) FROM took),
           (SELECT array_agg(t.id ORDER BY t.rk, t.o) FROM took AS t), (SELECT array_agg(t.jtid ORDER BY t.rk, t.o) FROM took AS t),
           (SELECT array_agg(g.tid) FROM g), (SELECT array_agg(g.seq) FROM g)
      INTO v_got, ids, tids, f_ctids, f_seqs;
    IF v_got <> v_want THEN
        ids := NULL; tids := NULL; f_ctids := NULL; f_seqs := NULL;   -- short of the plan: the walk decides
    END IF;
END;
$$;

-- The walk reads the ring a chunk at a time (Cost, first point): phase 0 the never-served cursors
-- (served_seq = 0) in key order, ranked among themselves by their heads (rule 4), phase 1 the served
-- ones from ring_from on in (served_seq, group_key) order (rule 3), phase 2: done. Appends what it read
-- to L1 (the l1_* arrays) and moves the walk's boundary on; bounded work per claim (v_limit cursors).
-- Race: on a queue without the claim lock, a cursor read already may have been stamped since by another
-- call that committed meanwhile; v_seen keeps it from being read twice. Never-served groups with
-- nothing to take now and nothing running lose their cursor (rule: cursors of groups without live work
-- are deleted when the walk meets them).
CREATE OR REPLACE FUNCTION pgjobs._fair_ring_chunk(v_q text, v_ring_from bigint, serialized boolean,
                                                   v_refreshed boolean, v_chunk int, v_limit int, v_open text[],
                                                   v_ids bigint[], a_key text[], a_cnt int[], v_stamped text[],
                                                   INOUT v_phase int, INOUT v_bseq bigint, INOUT v_bkey text,
                                                   INOUT v_first boolean, INOUT v_walked int,
                                                   INOUT l1_key text[], INOUT l1_ctid tid[], INOUT l1_seq bigint[],
                                                   INOUT l1_act int[], INOUT l1_hp int[], INOUT l1_hr timestamptz[],
                                                   INOUT l1_hi bigint[], INOUT l1_lid bigint[], INOUT l1_ltid tid[],
                                                   INOUT l1_lkind text[], INOUT l1_done boolean[],
                                                   INOUT l1_busy boolean[], INOUT l1_nseq bigint[],
                                                   INOUT l1_oldat timestamptz[], INOUT l1_picked boolean[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_k       int;
    v_seen    text[];
    l_key     text[];
    l_ctid    tid[];
    l_seq     bigint[];
    l_act     int[];
    l_hp      int[];
    l_hr      timestamptz[];
    l_hi      bigint[];
    l_bkey    text;
    l_dead    text[];
BEGIN
    IF v_phase = 0 THEN
        WITH c AS (
            SELECT c.group_key, c.ctid AS tid
              FROM group_cursors AS c
             WHERE c.queue = v_q AND c.served_seq = 0
               AND c.group_key >= v_bkey AND (v_first OR c.group_key <> v_bkey)
               AND (NOT v_refreshed OR c.group_key <> ALL (l1_key))
             ORDER BY c.group_key
             LIMIT v_chunk
        ), r AS (
            -- never-served groups tie on served_seq: their heads decide
            SELECT c.group_key, c.tid, h.priority, h.run_at, h.id, coalesce(a.n, 0) AS act
              FROM c
              LEFT JOIN LATERAL (
                    SELECT j.priority, j.run_at, j.id
                      FROM jobs AS j
                     WHERE j.state = 'pending' AND j.queue = v_q AND j.group_key = c.group_key
                       AND (v_open IS NULL OR j.kind = ANY (v_open)) AND j.id <> ALL (v_ids)
                     ORDER BY j.priority, j.run_at, j.id
                     LIMIT 1) AS h ON true
              LEFT JOIN unnest(a_key, a_cnt) AS a(k, n) ON a.k = c.group_key
        )
        -- (aggregates fed by one sorted subquery keep its order: one sort, not one per
        -- ordered aggregate)
        SELECT array_agg(r.group_key) FILTER (WHERE r.id IS NOT NULL),
               array_agg(r.tid) FILTER (WHERE r.id IS NOT NULL),
               array_agg(r.act) FILTER (WHERE r.id IS NOT NULL),
               array_agg(r.priority) FILTER (WHERE r.id IS NOT NULL),
               array_agg(r.run_at) FILTER (WHERE r.id IS NOT NULL),
               array_agg(r.id) FILTER (WHERE r.id IS NOT NULL),
               array_agg(r.group_key) FILTER (WHERE r.id IS NULL AND r.act = 0),
               max(r.group_key),
               count(*)::int
          INTO l_key, l_ctid, l_act, l_hp, l_hr, l_hi, l_dead, l_bkey, v_k
          FROM (SELECT * FROM r ORDER BY r.priority, r.run_at, r.id) AS r;
        l_seq := array_fill(0::bigint, ARRAY[coalesce(cardinality(l_key), 0)]);
        v_first := false;
        IF v_k > 0 THEN
            v_bkey := l_bkey;
        END IF;
        IF v_k < v_chunk THEN
            -- on to the served part, from the lowest served_seq still live (the second
            -- pass of a short claim reads only never-served groups: the rest was read)
            v_phase := CASE WHEN v_refreshed THEN 2 ELSE 1 END;
            v_bseq := v_ring_from - 1;
            v_bkey := '';
        END IF;
    ELSE
        v_seen := CASE WHEN serialized THEN v_stamped ELSE l1_key END;
        -- (in the subquery's order: the aggregates read it as it comes, with no join between)
        SELECT array_agg(c.group_key), array_agg(c.tid), array_agg(c.served_seq),
               array_agg(coalesce(a_cnt[array_position(a_key, c.group_key)], 0)),
               count(*)::int
          INTO l_key, l_ctid, l_seq, l_act, v_k
          FROM (SELECT c.group_key, c.served_seq, c.ctid AS tid
                  FROM group_cursors AS c
                 WHERE c.queue = v_q AND c.served_seq + 0 > 0
                   AND (c.served_seq, c.group_key) > (v_bseq, v_bkey)
                   -- read already, and stamped since (by this call; on a queue without the
                   -- claim lock, maybe by another call that committed meanwhile)
                   AND c.group_key <> ALL (v_seen)
                 ORDER BY c.served_seq, c.group_key
                 LIMIT v_chunk) AS c;
        l_hp := NULL; l_hr := NULL; l_hi := NULL; l_dead := NULL;
        IF v_k > 0 THEN
            v_bseq := l_seq[v_k];
            v_bkey := l_key[v_k];
        END IF;
        IF v_k < v_chunk THEN
            v_phase := 2;
        END IF;
    END IF;
    v_walked := v_walked + v_k;
    IF v_walked >= v_limit THEN
        v_phase := 2;   -- bounded work per claim; the rest of the ring waits for the next
    END IF;
    IF l_key IS NOT NULL THEN
        l1_key := l1_key || l_key;
        l1_ctid := l1_ctid || l_ctid;
        l1_seq := l1_seq || l_seq;
        l1_act := l1_act || l_act;
        l1_hp := l1_hp || coalesce(l_hp, array_fill(NULL::int, ARRAY[cardinality(l_key)]));
        l1_hr := l1_hr || coalesce(l_hr, array_fill(NULL::timestamptz, ARRAY[cardinality(l_key)]));
        l1_hi := l1_hi || coalesce(l_hi, array_fill(NULL::bigint, ARRAY[cardinality(l_key)]));
        l1_lid := l1_lid || array_fill(NULL::bigint, ARRAY[cardinality(l_key)]);
        l1_ltid := l1_ltid || array_fill(NULL::tid, ARRAY[cardinality(l_key)]);
        l1_lkind := l1_lkind || array_fill(NULL::text, ARRAY[cardinality(l_key)]);
        l1_done := l1_done || array_fill(false, ARRAY[cardinality(l_key)]);
        l1_busy := l1_busy || array_fill(false, ARRAY[cardinality(l_key)]);
        l1_nseq := l1_nseq || array_fill(NULL::bigint, ARRAY[cardinality(l_key)]);
        l1_oldat := l1_oldat || array_fill(NULL::timestamptz, ARRAY[cardinality(l_key)]);
        l1_picked := l1_picked || array_fill(false, ARRAY[cardinality(l_key)]);
    END IF;
    -- never-served groups with nothing to take now and nothing running: drop the cursor
    -- if nothing is waiting or scheduled either
    IF l_dead IS NOT NULL THEN
        PERFORM _forget_group(v_q, d.k) FROM unnest(l_dead) AS d(k);
    END IF;
END;
$$;

-- Lock-and-stamp (rule 3's stamp; Cost: a run of groups in one statement): the heads of the L1 entries
-- from b_i on, as many as picks are left (v_left), each locked with its cursor, and the cursors of the
-- groups whose head is taken stamped in the same statement with the served_seq they get (drawn in ring
-- order). Race: a group's cursor is locked (SKIP LOCKED) for as long as this claim runs, so a cursor
-- another claim holds means that claim is serving the group right now: this one serves it only once the
-- other groups have had their turn (it is marked busy in l1_busy). Concurrent claimers thus spread over
-- the groups although neither sees the other's picks. A cursor found held is passed over within the
-- statement (the batch goes on down L1 until it holds as many cursors as picks are left): under
-- concurrent claimers, who all read the same front of the ring, one statement instead of one per run of
-- held cursors. A stamped group that ends up not picked gets its old stamp back (_fair_finish).
CREATE OR REPLACE FUNCTION pgjobs._fair_lock_heads(v_q text, b_i int, v_left int, v_open text[], v_ids bigint[],
                                                   h_floor jsonb,
                                                   l1_key text[], l1_ctid tid[],
                                                   INOUT l1_done boolean[], INOUT l1_busy boolean[],
                                                   INOUT l1_lid bigint[], INOUT l1_ltid tid[], INOUT l1_lkind text[],
                                                   INOUT l1_nseq bigint[], INOUT l1_oldat timestamptz[],
                                                   INOUT v_stamped text[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_k       int;
    v_j       int;
    v_per     int;
    l_ord     bigint[];
    l_hi      bigint[];
    l_key     text[];
    l_at      timestamptz[];
    l_tid     tid[];
    l_seq     bigint[];
    v_epoch   bigint := coalesce(pg_sequence_last_value(to_regclass('pgjobs.claim_floor_epoch')), 0);
BEGIN
    v_k := cardinality(l1_key);
    WITH r AS (
        SELECT x.k, x.seq, x.ord, c.at, c.tid, h.id, h.kind, h.jtid
          -- the served_seq values, drawn in ring order
          FROM (SELECT u.k, u.ctid, u.ord, nextval('served_seq_seq') AS seq
                  FROM unnest(l1_key[b_i:v_k], l1_ctid[b_i:v_k]) WITH ORDINALITY AS u(k, ctid, ord)) AS x
         CROSS JOIN LATERAL (
                -- by the ctid read with the ring: a cursor rewritten since (another
                -- claim served the group meanwhile) is not found, and counts as held
                SELECT c.last_served_at AS at, c.ctid AS tid, c.floor_priority, c.floor_run_at, c.floor_id,
                       c.floor_epoch, c.floor_until
                  FROM group_cursors AS c
                 WHERE c.ctid = x.ctid AND c.queue = v_q AND c.group_key = x.k
                   FOR UPDATE SKIP LOCKED) AS c
          -- the group's head floor: the session's, else its cursor's while that holds (as _fair_take_again's;
          -- a walk whose session dropped its floors probed every group from the front past every job claimed
          -- since the snapshot: 6-8.5 s a claim ten minutes into the fair soak's hold)
          LEFT JOIN LATERAL (
                SELECT (h_floor -> x.k ->> 0)::smallint AS p, (h_floor -> x.k ->> 1)::timestamptz AS r,
                       (h_floor -> x.k ->> 2)::bigint AS i
                 WHERE h_floor ? x.k
                UNION ALL
                SELECT c.floor_priority, c.floor_run_at, c.floor_id
                 WHERE NOT coalesce(h_floor ? x.k, false) AND c.floor_epoch = v_epoch
                   -- (the grace only for a cursor with a floor of this epoch: none on a clean queue)
                   AND c.floor_until > now() - make_interval(secs => _fair_grace(v_q, 0))
                OFFSET 0) AS f0 ON true   -- (a fence: the check below then probes by its priority)
          -- unless a job more urgent than it is pending (one probe of the range below it)
          LEFT JOIN LATERAL (
                SELECT f0.p, f0.r, f0.i
                 WHERE NOT EXISTS (SELECT 1 FROM jobs AS u
                                    WHERE u.state = 'pending' AND u.queue = v_q AND u.group_key = x.k
                                      AND u.priority < f0.p)) AS hf ON f0.p IS NOT NULL
          LEFT JOIN LATERAL (
                SELECT j.id, j.kind, j.ctid AS jtid
                  FROM jobs AS j
                 WHERE j.state = 'pending' AND j.queue = v_q AND j.group_key = x.k
                   AND (v_open IS NULL OR j.kind = ANY (v_open)) AND j.id <> ALL (v_ids)
                   AND (j.priority, j.run_at, j.id)
                       >= (coalesce(hf.p, (-32768)::smallint), coalesce(hf.r, '-infinity'), coalesce(hf.i, 0))
                 ORDER BY j.priority, j.run_at, j.id
                 LIMIT 1
                   FOR UPDATE SKIP LOCKED) AS h ON true
         LIMIT v_left
    ), stamp AS (
        -- by ctid: the version just locked (no second walk of the key's index entries)
        UPDATE group_cursors AS c
           SET served_seq = r.seq, last_served_at = now()
          FROM r
         WHERE r.id IS NOT NULL AND c.ctid = r.tid
           AND c.ctid = ANY (ARRAY(SELECT r2.tid FROM r AS r2 WHERE r2.id IS NOT NULL))
        RETURNING 1
    )
    SELECT array_agg(r.ord), array_agg(r.id), array_agg(r.kind), array_agg(r.at),
           array_agg(r.jtid), array_agg(r.seq), (SELECT count(*) FROM stamp)::int
      INTO l_ord, l_hi, l_key, l_at, l_tid, l_seq, v_per
      FROM (SELECT * FROM r ORDER BY r.ord) AS r;
    -- the entries up to the last one held were looked at (all of them when the batch
    -- came up short); those among them not held are held by another claim
    IF coalesce(cardinality(l_ord), 0) >= v_left THEN
        v_k := b_i - 1 + l_ord[cardinality(l_ord)]::int;
    END IF;
    v_j := 1;
    FOR i IN b_i .. v_k LOOP
        l1_done[i] := true;
        IF v_j <= coalesce(cardinality(l_ord), 0) AND l_ord[v_j] = i - b_i + 1 THEN
            l1_lid[i] := l_hi[v_j];
            l1_ltid[i] := l_tid[v_j];
            l1_lkind[i] := l_key[v_j];
            IF l_hi[v_j] IS NOT NULL THEN
                l1_nseq[i] := l_seq[v_j];
                l1_oldat[i] := l_at[v_j];
                v_stamped := v_stamped || l1_key[i];
            END IF;
            v_j := v_j + 1;
        ELSE
            l1_busy[i] := true;
        END IF;
    END LOOP;
END;
$$;

-- U's pick (the ungrouped jobs take turns as one more member of the ring): the next row locked ahead
-- for U (u_buf from u_bp on) whose kind is still open, else a new batch of U's share of the picks left
-- (v_left over the v_rest members of the ring still to be served), the first ungrouped rows in the
-- queue's claim order, locked with SKIP LOCKED (rows other claimers hold are passed). A row locked ahead
-- and not taken stays locked until commit and is passed over by other claimers meanwhile: harmless.
CREATE OR REPLACE FUNCTION pgjobs._fair_take_ungrouped(v_q text, v_open text[], v_ids bigint[], v_left int,
                                                       v_rest int, INOUT u_buf bigint[], INOUT u_buftid tid[],
                                                       INOUT u_bufkind text[], INOUT u_bp int, INOUT u_owned boolean,
                                                       INOUT u_busy boolean, INOUT u_seq bigint, INOUT u_hi bigint,
                                                       INOUT u_probed boolean, INOUT u_empty boolean,
                                                       INOUT u_out boolean, INOUT u_served boolean,
                                                       OUT v_id bigint, OUT v_tid tid, OUT v_kind text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    c_ungrouped_scan CONSTANT int := 32;   -- rows of the queue's claim order read to find ungrouped work
    v_k       int;
BEGIN
    IF NOT u_owned AND NOT u_busy THEN
        -- Race: U's turn is recorded in the queue's fair_queues row: held by another claim, that
        -- claim is serving U right now (as with a group's cursor): U goes to the back of the ring
        PERFORM 1 FROM fair_queues AS f WHERE f.queue = v_q FOR UPDATE SKIP LOCKED;
        u_owned := FOUND;
        u_busy := NOT FOUND;
        IF u_busy THEN
            u_seq := nextval('served_seq_seq');
            RETURN;
        END IF;
    END IF;
    WHILE u_bp <= cardinality(u_buf) LOOP
        u_bp := u_bp + 1;
        IF v_open IS NULL OR u_bufkind[u_bp - 1] = ANY (v_open) THEN
            v_id := u_buf[u_bp - 1];
            v_tid := u_buftid[u_bp - 1];
            v_kind := u_bufkind[u_bp - 1];
            EXIT;
        END IF;
    END LOOP;
    -- Under a held snapshot the scan below passes every job of the queue claimed since, from its front (100-150 ms
    -- ten minutes into the fair soak's hold, the probe's claims that found the queue empty and gave U its turn):
    -- while the look for ungrouped work is gated ('u', "Shared gates"), the queue's shared state said none was
    -- left, and this claim saw none arrive, U has nothing.
    IF v_id IS NULL AND u_empty IS DISTINCT FROM false AND _fair_gated('u ' || v_q)
       AND coalesce((SELECT f.ungrouped_empty FROM fair_queues AS f WHERE f.queue = v_q), false) THEN
        u_empty := true;
        u_out := true;
        RETURN;
    END IF;
    IF v_id IS NULL THEN
        v_k := greatest(1, ceil(v_left::numeric / greatest(1, v_rest))::int);
        WITH cand AS (
            SELECT s.id
              FROM (SELECT j.id, j.priority, j.run_at, j.group_key, j.kind
                      FROM jobs AS j
                     WHERE j.state = 'pending' AND j.queue = v_q AND j.id <> ALL (v_ids)
                     ORDER BY j.priority, j.run_at, j.id
                     LIMIT c_ungrouped_scan + v_k) AS s
             WHERE s.group_key IS NULL AND (v_open IS NULL OR s.kind = ANY (v_open))
        ), locked AS (
            SELECT j.id, j.kind, j.priority, j.run_at, j.ctid AS jtid
              FROM jobs AS j
             WHERE j.id IN (SELECT cand.id FROM cand) AND j.state = 'pending'
             ORDER BY j.priority, j.run_at, j.id
             LIMIT v_k
               FOR UPDATE SKIP LOCKED
        )
        SELECT array_agg(l.id), array_agg(l.kind), array_agg(l.jtid)
          INTO u_buf, u_bufkind, u_buftid
          FROM (SELECT * FROM locked ORDER BY locked.priority, locked.run_at, locked.id) AS l;
        u_buf := coalesce(u_buf, '{}');
        u_bufkind := coalesce(u_bufkind, '{}');
        u_buftid := coalesce(u_buftid, '{}');
        u_bp := 1;
        IF cardinality(u_buf) > 0 THEN
            u_bp := 2;
            v_id := u_buf[1];
            v_tid := u_buftid[1];
            v_kind := u_bufkind[1];
        END IF;
    END IF;
    u_seq := nextval('served_seq_seq');
    u_hi := NULL;
    u_probed := true;
    u_empty := v_id IS NULL;
    IF v_id IS NULL THEN
        -- nothing ungrouped in sight: U takes its turn at the back of the ring
        u_out := true;
        RETURN;
    END IF;
    u_served := true;
END;
$$;

-- The pick of a group picked before in this call (rule 3: it went to the back of the ring), a noisy one
-- (rules 1 and 2), or one whose kind ran out since its head was locked, when no row locked ahead for it
-- (pf_*: a row's pf_key is NULLed once used) has a kind still open (the walk looks at those first, without
-- a call): a new batch, its share of the picks left, for it and the groups after it in L2 that have none
-- locked ahead. Rows locked with SKIP LOCKED; one locked ahead and not taken stays locked until commit:
-- harmless.
CREATE OR REPLACE FUNCTION pgjobs._fair_take_again(v_q text, v_key text, v_open text[], v_ids bigint[], h_floor jsonb,
                                                   v_left int, v_rest int, b_src int, b_i int,
                                                   l2_key text[], l2_out boolean[],
                                                   INOUT pf_key text[], INOUT pf_id bigint[], INOUT pf_tid tid[],
                                                   INOUT pf_kind text[],
                                                   OUT v_id bigint, OUT v_tid tid, OUT v_kind text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_k       int;
    v_per     int;
    l_key     text[];
    l_dead    text[];
    l_hi      bigint[];
    l_lkind   text[];
    l_tid     tid[];
    v_epoch   bigint := coalesce(pg_sequence_last_value(to_regclass('pgjobs.claim_floor_epoch')), 0);
BEGIN
    IF v_id IS NULL THEN   -- (OUT: always, but the block keeps the statement's layout)
        v_per := greatest(1, ceil(v_left::numeric / greatest(1, v_rest))::int);
        l_key := ARRAY[v_key];
        IF b_src = 4 THEN
            FOR i IN b_i + 1 .. cardinality(l2_key) LOOP
                EXIT WHEN cardinality(l_key) >= v_left;
                CONTINUE WHEN l2_out[i] OR l2_key[i] = ANY (l_key) OR l2_key[i] = ANY (pf_key);
                l_key := l_key || l2_key[i];
            END LOOP;
        END IF;
        SELECT array_agg(y.k), array_agg(y.id), array_agg(y.kind), array_agg(y.jtid)
          INTO l_dead, l_hi, l_lkind, l_tid
          FROM (SELECT x.k, h.id, h.kind, h.jtid
                  FROM unnest(l_key) WITH ORDINALITY AS x(k, ord)
                 -- the group's head floor: the session's, else its cursor's while that holds (the claim epoch
                 -- unmoved, not past its end: "Floors in the cursors"; a promotion in this claim moved the
                 -- epoch), unless a job more urgent than it is pending (one probe of the range below it).
                 -- (The cursor's: a session that kept no floor for the group probed it from the front, past
                 -- every job of the group claimed under a held snapshot: 40-90 ms, 18 of the soak's probe's
                 -- 110 claims over 100 ms. Found by _fair_cursor.)
                 LEFT JOIN LATERAL (
                       SELECT (h_floor -> x.k ->> 0)::smallint AS p, (h_floor -> x.k ->> 1)::timestamptz AS r,
                              (h_floor -> x.k ->> 2)::bigint AS i
                        WHERE h_floor ? x.k
                       UNION ALL
                       SELECT c.floor_priority, c.floor_run_at, c.floor_id
                         FROM group_cursors AS c
                        WHERE NOT coalesce(h_floor ? x.k, false)
                          AND c.ctid = _fair_cursor(v_q, x.k) AND c.queue = v_q AND c.group_key = x.k
                          AND c.floor_epoch = v_epoch
                          -- (called once per pick: the grace only for a cursor with a floor of this epoch)
                          AND c.floor_until > now() - make_interval(secs => _fair_grace(v_q, 0))
                       OFFSET 0) AS f0 ON true   -- (a fence: the check below then probes by its priority)
                 LEFT JOIN LATERAL (
                       SELECT f0.p, f0.r, f0.i
                        WHERE NOT EXISTS (SELECT 1 FROM jobs AS u
                                           WHERE u.state = 'pending' AND u.queue = v_q AND u.group_key = x.k
                                             AND u.priority < f0.p)) AS hf ON f0.p IS NOT NULL
                 CROSS JOIN LATERAL (
                       SELECT j.id, j.kind, j.priority, j.run_at, j.ctid AS jtid
                         FROM jobs AS j
                        WHERE j.state = 'pending' AND j.queue = v_q AND j.group_key = x.k
                          AND (v_open IS NULL OR j.kind = ANY (v_open)) AND j.id <> ALL (v_ids)
                          AND j.id <> ALL (pf_id)
                          AND (j.priority, j.run_at, j.id)
                              >= (coalesce(hf.p, (-32768)::smallint), coalesce(hf.r, '-infinity'), coalesce(hf.i, 0))
                        ORDER BY j.priority, j.run_at, j.id
                        LIMIT v_per
                          FOR UPDATE SKIP LOCKED) AS h
                 ORDER BY x.ord, h.priority, h.run_at, h.id) AS y;
        IF l_hi IS NOT NULL THEN
            pf_key := pf_key || l_dead;
            pf_id := pf_id || l_hi;
            pf_tid := pf_tid || l_tid;
            pf_kind := pf_kind || l_lkind;
            v_k := array_position(pf_key, v_key);
            IF v_k IS NOT NULL THEN
                pf_key[v_k] := NULL;
                v_id := pf_id[v_k];
                v_tid := pf_tid[v_k];
                v_kind := pf_kind[v_k];
            END IF;
        END IF;
    END IF;
END;
$$;

-- The state update at the end of a walked claim (rule 3's stamps, then through _fair_stamp the discovery
-- sweep's position and U's place). Groups stamped ahead by a batch but not picked after all (the
-- call filled up first, or the group turned out noisy) get their old place in the ring back; the other
-- served groups are stamped with the last served_seq each got in this call. Race: a cursor another
-- claimer holds right now is left to it (it has just served that group too), and so is the fair_queues
-- row (SKIP LOCKED: that claim is saving the state too).
CREATE OR REPLACE FUNCTION pgjobs._fair_finish(v_q text, v_nstamped int, v_npicked1 int, l1_key text[],
                                               l1_seq bigint[], l1_oldat timestamptz[], l1_nseq bigint[],
                                               l1_picked boolean[], v_unstamped boolean, l2_key text[],
                                               l2_seq bigint[], l2_pick boolean[], l2_wrote boolean[],
                                               u_seq bigint, u_served boolean, v_pos text,
                                               v_found boolean, v_productive boolean, u_empty boolean,
                                               v_maxid bigint, v_quiet boolean, v_quiet_claims int)
RETURNS boolean   -- true: a value, so that the walk calls it as an expression, not as a query
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- Both find each cursor from its group, one LATERAL probe per group (then update by ctid): a join of the
    -- groups with the cursors, planned generic on a table whose statistics said it was empty (a VACUUM
    -- under a held snapshot), walked the index entries of the whole queue's cursors, every version a held
    -- snapshot keeps, once per group: 10-12 s a claim, the worker stalled behind it (the fair soak's hold).
    IF v_nstamped > v_npicked1 THEN
        -- (the version this walk stamped: its group and new served_seq, one index entry)
        WITH back AS (
            SELECT v.tid, r.seq, r.at
              FROM unnest(l1_key, l1_seq, l1_oldat, l1_nseq, l1_picked) AS r(k, seq, at, nseq, picked)
             CROSS JOIN LATERAL (SELECT c.ctid AS tid FROM group_cursors AS c
                                  WHERE c.queue = v_q AND c.group_key = r.k AND c.served_seq = r.nseq
                                 OFFSET 0) AS v   -- (a fence: not pulled up into a join the planner may turn)
             WHERE r.nseq IS NOT NULL AND NOT r.picked
        )
        UPDATE group_cursors AS c
           SET served_seq = b.seq, last_served_at = b.at
          FROM back AS b
         WHERE c.ctid = b.tid AND c.ctid = ANY (ARRAY(SELECT b2.tid FROM back AS b2));
    END IF;
    -- Stamp the other served groups with the last served_seq each got in this call. A cursor
    -- another claimer holds right now is left to it (it has just served that group too).
    IF v_unstamped THEN
        WITH s AS (
            SELECT DISTINCT ON (x.k) x.k, x.seq, x.wrote
              FROM unnest(l2_key, l2_seq, l2_pick, l2_wrote) AS x(k, seq, picked, wrote)
             WHERE x.picked
             ORDER BY x.k, x.seq DESC
        ), lk AS (
            SELECT v.tid, s.seq
              FROM s
             CROSS JOIN LATERAL (SELECT c.ctid AS tid FROM group_cursors AS c
                                  WHERE c.ctid = _fair_cursor(v_q, s.k) AND c.queue = v_q AND c.group_key = s.k
                                    FOR UPDATE SKIP LOCKED) AS v   -- (_fair_cursor: by its ctid)
             WHERE NOT s.wrote
        )
        UPDATE group_cursors AS c
           SET last_served_at = now(), served_seq = greatest(c.served_seq, lk.seq)
          FROM lk
         WHERE c.ctid = lk.tid AND c.ctid = ANY (ARRAY(SELECT l2.tid FROM lk AS l2));
    END IF;
    -- (its own stamps are visible to _fair_stamp's ring read by now: none to count apart)
    PERFORM _fair_stamp(v_q, '{}', '{}', v_pos, v_found, v_productive, u_empty, v_maxid, v_quiet, v_quiet_claims,
                        u_seq, u_served);
    RETURN true;
END;
$$;

-- Discovery (Cost, second point): a sweep of up to `steps` groups from v_pos (the incremental skip scan
-- of _discover_groups), and the sweep's state: a sweep that ran out of groups starts from the first one
-- next time, and whether the last complete round found new groups (a quiet claim sweeps while they do).
-- Race: on a queue without the claim lock, one discoverer at a time: the others skip it rather than wait.
-- The long sweep of a quiet claim that came up short (the walk's, 256 groups) shares the 's' gate with the
-- 8th claim's sweep ("Shared gates"): under a held snapshot it passes every dead entry of 256 groups' claimed
-- jobs, and a claim of one that found the queue empty (the worker keeping up takes all there is every few ms)
-- paid it: 0.1-2 s a claim, 21 of the soak probe's 24 claims over 100 ms ten minutes into the fair hold.
CREATE OR REPLACE FUNCTION pgjobs._fair_sweep(v_q text, serialized boolean, steps int, INOUT v_pos text,
                                              INOUT v_found boolean, INOUT v_productive boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_disc    record;
    v_long    boolean := steps > 16;   -- the walk's sweep (16 x _claim_fair's c_discover_steps), not a claim's
    v_v1      bigint;
    v_t0      timestamptz := clock_timestamp();
BEGIN
    IF v_long AND _fair_gated('s ' || v_q) THEN
        RETURN;   -- a sweep proved dear a moment ago: what it finds is shared (cursors), the gate's time is short
    END IF;
    v_v1 := CASE WHEN v_long THEN _fair_index_visits('jobs_group_idx') END;
    IF serialized OR pg_try_advisory_xact_lock(hashtextextended('pgjobs.discover:' || v_q, 0)) THEN
        v_disc := _discover_groups(v_q, v_pos, steps);
        IF v_long THEN
            PERFORM _fair_keep('s ' || v_q, _fair_index_visits('jobs_group_idx') - v_v1 > 1000, v_t0);
        END IF;
        v_found := v_found OR v_disc.added > 0;
        -- a sweep that ran out of groups starts from the first one next time
        v_pos := CASE WHEN v_disc.met < steps THEN NULL ELSE v_disc.last_key END;
        IF v_pos IS NULL THEN
            v_productive := v_found;
            v_found := false;
        END IF;
    END IF;
END;
$$;

-- The walk taking over from the fast path: L1 starts as the ring _fair_fast read (its chunks), every
-- cursor tried and not locked already known as held by another claim (race: another claim is serving
-- that group, which goes after the others), the boundary after what was read.
CREATE OR REPLACE FUNCTION pgjobs._fair_walk_start(room int, v_limit int, l_key text[], l_ctid tid[], l_seq bigint[],
                                                   l_act int[], l_dead text[], INOUT v_phase int,
                                                   INOUT v_bseq bigint, INOUT v_bkey text, OUT v_walked int, OUT l1_key text[], OUT l1_ctid tid[],
                                                   OUT l1_seq bigint[], OUT l1_act int[], OUT l1_hp int[],
                                                   OUT l1_hr timestamptz[], OUT l1_hi bigint[], OUT l1_lid bigint[],
                                                   OUT l1_ltid tid[], OUT l1_lkind text[], OUT l1_done boolean[],
                                                   OUT l1_busy boolean[], OUT l1_nseq bigint[],
                                                   OUT l1_oldat timestamptz[], OUT l1_picked boolean[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_k       int;
    v_j       int;
BEGIN
    v_k := cardinality(l_key);
    l1_key := l_key;
    l1_ctid := l_ctid;
    l1_seq := l_seq;
    l1_act := l_act;
    l1_hp := array_fill(NULL::int, ARRAY[v_k]);
    l1_hr := array_fill(NULL::timestamptz, ARRAY[v_k]);
    l1_hi := array_fill(NULL::bigint, ARRAY[v_k]);
    l1_lid := array_fill(NULL::bigint, ARRAY[v_k]);
    l1_ltid := array_fill(NULL::tid, ARRAY[v_k]);
    l1_lkind := array_fill(NULL::text, ARRAY[v_k]);
    l1_done := array_fill(false, ARRAY[v_k]);
    l1_busy := array_fill(false, ARRAY[v_k]);
    l1_nseq := array_fill(NULL::bigint, ARRAY[v_k]);
    l1_oldat := array_fill(NULL::timestamptz, ARRAY[v_k]);
    l1_picked := array_fill(false, ARRAY[v_k]);
    -- tried: all of the ring when fewer than `room` were locked, else up to the last locked
    v_j := CASE WHEN coalesce(cardinality(l_dead), 0) < room THEN v_k
                ELSE array_position(l_key, l_dead[cardinality(l_dead)]) END;
    FOR i IN 1 .. v_j LOOP
        IF NOT l1_key[i] = ANY (coalesce(l_dead, '{}')) THEN
            l1_done[i] := true;
            l1_busy[i] := true;
        END IF;
    END LOOP;
    v_walked := v_k;
    IF v_k < least(2 * room + 16, v_limit) THEN
        v_phase := 2;   -- the whole ring was read
    ELSE
        v_bseq := l1_seq[v_k];
        v_bkey := l1_key[v_k];
    END IF;
END;
$$;


-- Rule U in one pick's ranking (the ungrouped jobs take turns as one more member of the ring, never
-- noisy): whether U beats the best candidate so far (b_*): a lower place in the ring, or for a tie between
-- never-served, a better head (U's head is looked for once; none in sight: U goes to the back of the ring,
-- so an all-grouped queue looks for ungrouped work once per round). The walk calls it only when U's place
-- is not after the candidate's (about once per round of the ring), so most picks make no call.
CREATE OR REPLACE FUNCTION pgjobs._fair_rank_u(v_q text, v_open text[], v_ids bigint[], b_src int, b_seq bigint,
                                               b_hp int, b_hr timestamptz, b_hi bigint, INOUT u_out boolean,
                                               INOUT u_seq bigint, INOUT u_probed boolean, INOUT u_empty boolean,
                                               INOUT u_hp int, INOUT u_hr timestamptz, INOUT u_hi bigint,
                                               OUT u_wins boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF u_seq = 0 AND b_src IS NOT NULL AND b_seq = 0 AND NOT u_probed THEN
        -- a tie between never-served: compare heads
        SELECT h.hp, h.hr, h.hi INTO u_hp, u_hr, u_hi FROM _fair_ungrouped_head(v_q, v_open, v_ids) AS h;
        u_probed := true;
        u_empty := u_hi IS NULL;
        IF u_hi IS NULL THEN
            -- Nothing ungrouped in sight: the pseudo-group goes to the back of the ring,
            -- so an all-grouped queue looks for ungrouped work once per round.
            u_out := true;
            u_seq := nextval('served_seq_seq');
        END IF;
    END IF;
    u_wins := NOT u_out AND (b_src IS NULL OR u_seq < b_seq
                             OR (u_hi IS NOT NULL AND (u_hp, u_hr, u_hi) < (b_hp, b_hr, b_hi)));
END;
$$;

-- The pick-by-pick walk (rules 1-4, one pick at a time; each pick re-ranks the groups), from the ring
-- as _fair_fast read it (l_*; NULL when the fast path did not run). The best candidate of a pick is
-- among: the front of L1 (the ring as read, in ring order), U (the ungrouped jobs), N (groups found
-- noisy: rule 1, ranked by rule 2 once only noisy ones are left) and L2 (the groups picked in this call,
-- in pick order: back of the ring). A quiet claim that comes up short sweeps again (longer) and goes on
-- with what that finds. The queue's state is saved at the end (_fair_finish).
-- Each pick passes the front of L1 first: a group at its cap cannot be picked in this call; a noisy one
-- moves to N (an L1 group not picked yet keeps its active count, and the noisy threshold only rises as
-- this call leases jobs: a group that passes stays good). L1 used up, the next chunk of the ring is read
-- first: the best candidate always lies within what was read, since every cursor not read yet comes later
-- in the ring. The best non-noisy candidate among the front of L1, U, the noisy groups that are not noisy
-- any more, and the first non-noisy group picked earlier in this call: lowest served_seq first;
-- never-served ties go to the better head; when only noisy groups have work left, fewer active jobs
-- first, then least recently served.
-- State: L1 (l1_*), the cursors read, in ring order (never-served ones of a chunk by head), consumed from
-- p1; N (n_*), groups found noisy (fewer than 1 / noisy_share of them); L2 (l2_*), the groups picked in
-- this call, in pick order (ascending new served_seq); pf_*, rows locked ahead for groups picked again
-- (pf_key NULLed once a row is used); u_buf*, ungrouped rows locked ahead (used from u_bp); u_*, U's place
-- and head. Heads are taken locked (SKIP LOCKED passes rows other transactions hold), locked ahead a batch
-- per statement: for a run of L1 entries, as many as picks are left; for a group picked again (or U), its
-- share of the picks left. A row locked ahead and then not taken (the ranking went elsewhere, or its kind
-- ran out) stays locked until commit and is passed over by other claimers meanwhile: harmless.
CREATE OR REPLACE FUNCTION pgjobs._fair_walk(v_q text, room int, kinds text[], quotas int[], serialized boolean,
                                             v_cap_group int, v_noisy_min int, v_noisy_share real,
                                             v_ring_from bigint, v_ungrouped_seq bigint, v_total int,
                                             a_key text[], a_cnt int[], v_maxid bigint, v_quiet boolean,
                                             v_pos text, v_found boolean, v_quiet_claims int,
                                             v_productive boolean, u_out boolean, u_probed boolean,
                                             u_empty boolean, u_hp int, u_hr timestamptz, u_hi bigint,
                                             v_unserved boolean, v_chunk int, v_limit int, l_key text[],
                                             l_ctid tid[], l_seq bigint[], l_act int[], l_dead text[],
                                             h_floor jsonb, OUT ids bigint[], OUT tids tid[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    c_discover_steps CONSTANT int := 16;   -- groups the skip scan registers per claim
    v_open    text[] := kinds;             -- kinds still claimable in this call (NULL: any)
    v_quota   int[] := quotas;
    v_ids     bigint[] := '{}';
    v_tids    tid[] := '{}';
    v_stamped text[] := '{}';              -- groups whose cursor this call has stamped
    v_refreshed boolean := false;          -- the second pass of a quiet claim that came up short
    v_npicked1 int := 0;                   -- picks of groups whose cursor the batch stamped
    v_unstamped boolean := false;          -- a group picked whose cursor is not stamped yet
    -- where the walk is: phase 0 never-served cursors, 1 served ones, 2 done; the last (served_seq,
    -- group_key) read; cursors read so far
    -- (no never-served cursor: the walk starts on the served part)
    v_phase int := CASE WHEN v_unserved THEN 0 ELSE 1 END; v_bkey text := ''; v_first boolean := true;
    v_bseq bigint := CASE WHEN NOT v_unserved THEN v_ring_from - 1 END; v_walked int := 0;
    -- L1, per entry: key, served_seq, active jobs, head (priority, run_at, id: never-served entries), the
    -- head a batch locked for it (id, ctid, kind), its cursor's ctid as read, whether its head was looked
    -- for, whether another claim holds its cursor, the served_seq the batch stamped and the last_served_at
    -- before that, whether it was picked
    l1_key text[] := '{}'; l1_seq bigint[] := '{}'; l1_act int[] := '{}';
    l1_hp int[] := '{}'; l1_hr timestamptz[] := '{}'; l1_hi bigint[] := '{}';
    l1_lid bigint[] := '{}'; l1_ltid tid[] := '{}'; l1_lkind text[] := '{}'; l1_ctid tid[] := '{}';
    l1_done boolean[] := '{}'; l1_busy boolean[] := '{}'; l1_nseq bigint[] := '{}';
    l1_oldat timestamptz[] := '{}'; l1_picked boolean[] := '{}'; p1 int := 1;
    pf_key text[] := '{}'; pf_id bigint[] := '{}'; pf_tid tid[] := '{}'; pf_kind text[] := '{}';
    u_buf bigint[] := '{}'; u_buftid tid[] := '{}'; u_bufkind text[] := '{}'; u_bp int := 1;
    n_key text[] := '{}'; n_seq bigint[] := '{}'; n_act int[] := '{}'; n_out boolean[] := '{}';
    -- L2, per entry: key, served_seq, active jobs, out for this call, picked (false: only moved back,
    -- being served elsewhere), its served_seq already stamped on the cursor
    l2_key text[] := '{}'; l2_seq bigint[] := '{}'; l2_act int[] := '{}'; l2_out boolean[] := '{}';
    l2_pick boolean[] := '{}'; l2_wrote boolean[] := '{}'; p2 int := 1;
    -- U: u_owned, this claim holds the fair_queues row (U's turn); u_busy, another claim does
    u_seq bigint := v_ungrouped_seq; u_served boolean := false; u_owned boolean := false; u_busy boolean := false;
    -- one pick: the best candidate (b_src 1 L1, 2 U, 3 N, 4 L2), then the group and the head taken
    b_src int; b_i int; b_seq bigint; b_act int; b_hp int; b_hr timestamptz; b_hi bigint; v_win boolean;
    v_key text; v_act int; v_id bigint; v_tid tid; v_kind text; v_k int; v_left int; v_r record;
BEGIN
    IF l_key IS NOT NULL THEN
        SELECT * INTO v_phase, v_bseq, v_bkey, v_walked, l1_key, l1_ctid, l1_seq, l1_act, l1_hp, l1_hr, l1_hi,
                      l1_lid, l1_ltid, l1_lkind, l1_done, l1_busy, l1_nseq, l1_oldat, l1_picked
          FROM _fair_walk_start(room, v_limit, l_key, l_ctid, l_seq, l_act, l_dead, v_phase, v_bseq, v_bkey);
    END IF;

    <<passes>>
    LOOP
    <<picks>>
    WHILE cardinality(v_ids) < room LOOP
        WHILE p1 <= cardinality(l1_key) LOOP
            v_act := l1_act[p1];
            IF v_act >= v_cap_group THEN
                p1 := p1 + 1;
            ELSIF v_act >= v_noisy_min AND v_act > v_noisy_share * v_total THEN
                n_key := n_key || l1_key[p1]; n_seq := n_seq || l1_seq[p1];
                n_act := n_act || v_act; n_out := n_out || false;
                p1 := p1 + 1;
            ELSE
                EXIT;
            END IF;
        END LOOP;
        IF p1 > cardinality(l1_key) AND v_phase < 2 THEN   -- L1 used up: the next chunk first
            SELECT * INTO v_phase, v_bseq, v_bkey, v_first, v_walked, l1_key, l1_ctid, l1_seq, l1_act,
                          l1_hp, l1_hr, l1_hi, l1_lid, l1_ltid, l1_lkind, l1_done, l1_busy, l1_nseq, l1_oldat,
                          l1_picked
              FROM _fair_ring_chunk(v_q, v_ring_from, serialized, v_refreshed, v_chunk, v_limit, v_open, v_ids, a_key,
                                    a_cnt, v_stamped, v_phase, v_bseq, v_bkey, v_first, v_walked, l1_key,
                                    l1_ctid, l1_seq, l1_act, l1_hp, l1_hr, l1_hi, l1_lid, l1_ltid, l1_lkind,
                                    l1_done, l1_busy, l1_nseq, l1_oldat, l1_picked);
            CONTINUE picks;
        END IF;

        -- The best non-noisy candidate (see the header).
        b_src := NULL;
        IF p1 <= cardinality(l1_key) THEN
            b_src := 1; b_i := p1; b_seq := l1_seq[p1];
            b_hp := l1_hp[p1]; b_hr := l1_hr[p1]; b_hi := l1_hi[p1];
        END IF;
        IF NOT u_out AND (b_src IS NULL OR u_seq <= b_seq) THEN
            SELECT * INTO u_out, u_seq, u_probed, u_empty, u_hp, u_hr, u_hi, v_win
              FROM _fair_rank_u(v_q, v_open, v_ids, b_src, b_seq, b_hp, b_hr, b_hi, u_out, u_seq, u_probed, u_empty,
                                u_hp, u_hr, u_hi);
            IF v_win THEN
                b_src := 2; b_seq := u_seq;
            END IF;
        END IF;
        FOR i IN 1 .. cardinality(n_key) LOOP
            CONTINUE WHEN n_out[i];
            CONTINUE WHEN n_act[i] >= v_noisy_min AND n_act[i] > v_noisy_share * v_total;
            IF b_src IS NULL OR n_seq[i] < b_seq THEN
                b_src := 3; b_i := i; b_seq := n_seq[i];
            END IF;
        END LOOP;
        WHILE p2 <= cardinality(l2_key) AND l2_out[p2] LOOP
            p2 := p2 + 1;
        END LOOP;
        FOR i IN p2 .. cardinality(l2_key) LOOP
            CONTINUE WHEN l2_out[i];
            IF l2_act[i] >= v_cap_group THEN
                l2_out[i] := true;   -- at its cap: out for the rest of this call
                CONTINUE;
            END IF;
            CONTINUE WHEN l2_act[i] >= v_noisy_min AND l2_act[i] > v_noisy_share * v_total;
            IF b_src IS NULL OR l2_seq[i] < b_seq THEN
                b_src := 4; b_i := i; b_seq := l2_seq[i];
            END IF;
            EXIT;
        END LOOP;

        IF b_src IS NULL THEN
            -- Only noisy groups have work left: fewer active jobs first, then least recently served.
            FOR i IN 1 .. cardinality(n_key) LOOP
                CONTINUE WHEN n_out[i];
                IF b_src IS NULL OR (n_act[i], n_seq[i]) < (b_act, b_seq) THEN
                    b_src := 3; b_i := i; b_act := n_act[i]; b_seq := n_seq[i];
                END IF;
            END LOOP;
            FOR i IN p2 .. cardinality(l2_key) LOOP
                CONTINUE WHEN l2_out[i];
                IF b_src IS NULL OR (l2_act[i], l2_seq[i]) < (b_act, b_seq) THEN
                    b_src := 4; b_i := i; b_act := l2_act[i]; b_seq := l2_seq[i];
                END IF;
            END LOOP;
        END IF;
        EXIT picks WHEN b_src IS NULL;

        -- Take the chosen group's head, locked ahead in batches (see the header).
        v_id := NULL; v_tid := NULL; v_left := room - cardinality(v_ids);
        IF b_src = 1 THEN
            v_key := l1_key[b_i];
            IF NOT l1_done[b_i] THEN
                v_r := _fair_lock_heads(v_q, b_i, v_left, v_open, v_ids, h_floor, l1_key, l1_ctid, l1_done, l1_busy,
                                        l1_lid, l1_ltid, l1_lkind, l1_nseq, l1_oldat, v_stamped);
                l1_done := v_r.l1_done; l1_busy := v_r.l1_busy; l1_lid := v_r.l1_lid; l1_ltid := v_r.l1_ltid;
                l1_lkind := v_r.l1_lkind; l1_nseq := v_r.l1_nseq; l1_oldat := v_r.l1_oldat; v_stamped := v_r.v_stamped;
            END IF;
            p1 := p1 + 1;
            v_act := l1_act[b_i];
            IF l1_busy[b_i] THEN
                -- being served by another claim: to the back of the ring, not taken now
                l2_key := l2_key || v_key; l2_seq := l2_seq || nextval('served_seq_seq'); l2_act := l2_act || v_act;
                l2_out := l2_out || false; l2_pick := l2_pick || false; l2_wrote := l2_wrote || false;
                CONTINUE picks;
            ELSIF l1_lid[b_i] IS NOT NULL AND (v_open IS NULL OR l1_lkind[b_i] = ANY (v_open)) THEN
                v_id := l1_lid[b_i];
                v_tid := l1_ltid[b_i];
                v_kind := l1_lkind[b_i];
                l1_picked[b_i] := true;
                v_npicked1 := v_npicked1 + 1;
            ELSIF l1_lid[b_i] IS NOT NULL THEN
                v_key := v_key;   -- its kind ran out meanwhile: look again below
            ELSE
                -- nothing to take: drop the cursor if the group has no live work at all
                IF v_act = 0 THEN
                    PERFORM _forget_group(v_q, v_key);
                END IF;
                CONTINUE picks;
            END IF;
        ELSIF b_src = 3 THEN
            v_key := n_key[b_i]; n_out[b_i] := true; v_act := n_act[b_i];
        ELSIF b_src = 4 THEN
            v_key := l2_key[b_i]; l2_out[b_i] := true; v_act := l2_act[b_i];
        END IF;

        IF b_src = 2 THEN
            SELECT * INTO u_buf, u_buftid, u_bufkind, u_bp, u_owned, u_busy, u_seq, u_hi, u_probed, u_empty, u_out,
                          u_served, v_id, v_tid, v_kind
              FROM _fair_take_ungrouped(v_q, v_open, v_ids, v_left,
                                        cardinality(l2_key) - p2 + 1 + cardinality(l1_key) - p1 + 1, u_buf, u_buftid,
                                        u_bufkind, u_bp, u_owned, u_busy, u_seq, u_hi, u_probed, u_empty, u_out,
                                        u_served);
            CONTINUE picks WHEN v_id IS NULL;
        ELSIF v_id IS NULL THEN
            -- a group picked before in this call, a noisy one, or one whose kind ran out: its rows locked ahead
            LOOP
                v_k := array_position(pf_key, v_key);
                EXIT WHEN v_k IS NULL;
                pf_key[v_k] := NULL;
                IF v_open IS NULL OR pf_kind[v_k] = ANY (v_open) THEN
                    v_id := pf_id[v_k]; v_tid := pf_tid[v_k]; v_kind := pf_kind[v_k];
                    EXIT;
                END IF;
            END LOOP;
            IF v_id IS NULL THEN
                v_r := _fair_take_again(v_q, v_key, v_open, v_ids, h_floor, v_left, cardinality(l2_key) - p2 + 1
                                        + cardinality(l1_key) - p1 + 1, b_src, b_i, l2_key, l2_out, pf_key, pf_id,
                                        pf_tid, pf_kind);
                pf_key := v_r.pf_key; pf_id := v_r.pf_id; pf_tid := v_r.pf_tid; pf_kind := v_r.pf_kind;
                v_id := v_r.v_id; v_tid := v_r.v_tid; v_kind := v_r.v_kind;
            END IF;
            CONTINUE picks WHEN v_id IS NULL;
        END IF;
        IF b_src = 1 AND l1_picked[b_i] THEN
            -- (its served_seq is already stamped on its cursor)
            l2_key := l2_key || v_key; l2_seq := l2_seq || l1_nseq[b_i]; l2_act := l2_act || (v_act + 1);
            l2_out := l2_out || false; l2_pick := l2_pick || true; l2_wrote := l2_wrote || true;
        ELSIF b_src <> 2 THEN
            IF b_src = 1 AND l1_nseq[b_i] IS NOT NULL THEN
                l1_picked[b_i] := true;           -- stamped, and taken after all (kind re-probe)
                v_npicked1 := v_npicked1 + 1;
            END IF;
            v_unstamped := true;
            l2_key := l2_key || v_key; l2_seq := l2_seq || nextval('served_seq_seq'); l2_act := l2_act || (v_act + 1);
            l2_out := l2_out || false; l2_pick := l2_pick || true; l2_wrote := l2_wrote || false;
        END IF;

        v_ids := v_ids || v_id;
        v_tids := v_tids || v_tid;
        v_total := v_total + 1;
        IF v_open IS NOT NULL THEN
            v_k := array_position(kinds, v_kind);
            v_quota[v_k] := v_quota[v_k] - 1;
            IF v_quota[v_k] <= 0 THEN
                v_open := array_remove(v_open, v_kind);
                EXIT picks WHEN cardinality(v_open) = 0;
            END IF;
        END IF;
    END LOOP;

    -- A quiet claim that came up short: look for what it skipped (groups without a cursor, with
    -- a longer sweep, and ungrouped work) and go on with what that finds.
    EXIT passes WHEN cardinality(v_ids) >= room OR NOT v_quiet OR v_refreshed
                  OR (v_open IS NOT NULL AND cardinality(v_open) = 0);
    v_refreshed := true;
    SELECT * INTO v_pos, v_found, v_productive
      FROM _fair_sweep(v_q, serialized, 16 * c_discover_steps, v_pos, v_found, v_productive);
    u_out := u_probed AND u_empty;
    v_phase := 0; v_bkey := ''; v_first := true;
    END LOOP;

    v_win := _fair_finish(v_q, cardinality(v_stamped), v_npicked1, l1_key, l1_seq, l1_oldat, l1_nseq, l1_picked,
                         v_unstamped, l2_key, l2_seq, l2_pick, l2_wrote, u_seq, u_served, v_pos, v_found,
                         v_productive, u_empty, v_maxid, v_quiet, v_quiet_claims);
    ids := v_ids;
    tids := v_tids;
END;
$$;

-- Fair pick on one queue: up to `room` pending job ids, in pick order, each locked (the caller
-- leases them). `kinds` NULL: any kind; else only these kinds, at most quotas[i] of kinds[i].
-- `serialized`: the queue's claim lock is held (a queue with caps), so counts and ring are exact.
-- Without it (a fair queue without caps) claimers run side by side: every lock here is taken with
-- SKIP LOCKED, so nothing waits on another claimer, and a group whose cursor another claim holds
-- is served after the others (see the top of this file).
-- It applies the rules named at the top of this file: it reads the claim's state (settings, fair_queues
-- row, active counts: one statement), decides whether the discovery sweep and the look for U run, and
-- hands the pick to _fair_fast (the usual claim) or _fair_walk (the rest, or what the fast path left).
CREATE OR REPLACE FUNCTION pgjobs._claim_fair(queue text, room int, kinds text[], quotas int[], serialized boolean,
                                              OUT ids bigint[], OUT tids tid[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    c_discover_steps CONSTANT int := 16;   -- groups the skip scan registers per claim
    c_fresh_ids CONSTANT int := 16384;     -- new job ids _discover_fresh reads, at most (see the top: Cost)
    v_q       text := _claim_fair.queue;
    v_fresh   boolean;                     -- the jobs inserted since the previous claim were read by id
    v_expired boolean; v_settle boolean;   -- an active job's lease has run out (v_settle: its last attempt's)
    v_promoted boolean := false;           -- _promote_due ran in this call
    v_hint    jsonb;                       -- this session's [seen_max_id, quiet_claims]
    u_fresh   boolean := false;            -- one of them is ungrouped
    v_cfg     queues;
    v_open    text[] := kinds;             -- kinds claimable in this call (NULL: any)
    v_quota   int[] := quotas;
    v_total   int;                         -- the queue's active jobs
    a_key text[]; a_cnt int[];             -- active jobs per group at the start
    v_v0      bigint;                      -- jobs_active_idx entries visited before the count (NULL: kept)
    v_any_kept boolean;                    -- this session keeps some read (pgjobs.fair_kept is not empty)
    v_kept    jsonb;                       -- the count it kept for this queue, if still good
    v_dear    boolean;                     -- the count just taken proved dear
    v_v1      bigint;                      -- index entries visited before the look for U, the sweep
    v_fq      fair_queues;
    v_pos     text;                        -- where the next claim's discovery resumes
    v_maxid   bigint;                      -- the highest job id now
    v_quiet   boolean;                     -- no job inserted since the previous claim
    v_found   boolean;                     -- this round of the discovery sweep found new groups
    v_productive boolean;                  -- the last complete round did
    v_unserved boolean;                    -- some cursor has never been served (phase 0 has work)
    v_short   boolean;                     -- the drain or the fast path may take the claim (no walk)
    v_top     int;                         -- the most active jobs of one group at the start
    v_chunk   int := least(greatest(room, 16), 256);   -- cursors the walk reads per statement
    v_limit   int := 1000 + 4 * room;      -- cursors one claim may read
    u_seq     bigint;                      -- U's place in the ring
    u_out     boolean := false;            -- U has no turn in this claim
    u_hp int; u_hr timestamptz; u_hi bigint;   -- U's head, when looked for
    u_probed  boolean := false;
    u_empty   boolean;                     -- what the last look for ungrouped work in this call found
    v_k       int;
    v_f       record;                      -- what _fair_fast or _fair_walk returned
    l_key text[]; l_ctid tid[]; l_seq bigint[]; l_act int[]; l_dead text[];   -- the ring as the fast path read it
    v_epoch   bigint;                      -- the claim epoch before the heads are probed (_fair_floors)
    r_epoch   bigint;                      -- the same, when cursors' floors may be used (else NULL)
    h_kept    jsonb;                       -- this session's head floors for the queue, if still good
    h_floor   jsonb;                       -- the floors this claim's head probes start from (NULL: none)
    v_v2      bigint;                      -- jobs_group_idx entries visited before the picks
    v_dear_h  boolean;                     -- the picks' head probes proved dear
    v_t0      timestamptz;                 -- when a read that may prove dear (_fair_keep), then the picks, began
BEGIN
    -- One statement for everything a claim reads before the walk (each statement has a fixed cost to start,
    -- larger than what most of these reads cost): the queue's settings, its fair_queues state, its active
    -- jobs per group, as of now; the highest job id (see v_quiet below). The same pass tells whether a
    -- lease has run out (claim() leaves its probe to it: a second walk of jobs_active_idx, whose dead
    -- entries a held snapshot keeps): then those out of attempts are settled, the others' jobs become
    -- pending (_promote_due), and the active jobs are counted again. A count this session kept (see
    -- _fair_keep: under a held snapshot) saves the pass over the active jobs on a queue without caps.
    -- (this session's own state of the queue, newer than the row's: _fair_save_hint; _fair_max_id starts there)
    v_hint := nullif(current_setting('pgjobs.fair_hint', true), '')::jsonb -> v_q;
    v_any_kept := coalesce(current_setting('pgjobs.fair_kept', true), '') NOT IN ('', '{}');
    v_kept := CASE WHEN v_any_kept THEN _fair_kept_or_gate('a ' || v_q) END;
    IF v_kept IS NOT NULL THEN
        v_total := (v_kept ->> 2)::int;
        v_top := (v_kept ->> 3)::int;
        a_key := ARRAY(SELECT jsonb_array_elements_text(v_kept -> 4));
        a_cnt := ARRAY(SELECT x::int FROM jsonb_array_elements_text(v_kept -> 5) AS x);
        SELECT c.max_active, c.max_active_per_group, c.noisy_share, c.noisy_min_active,
               f.queue, f.ungrouped_seq, f.ungrouped_empty, f.ring_from, f.discover_after, f.discover_found,
               f.discover_productive, f.seen_max_id, f.quiet_claims, _fair_max_id(v_hint, f.seen_max_id)
          INTO v_cfg.max_active, v_cfg.max_active_per_group, v_cfg.noisy_share, v_cfg.noisy_min_active,
               v_fq.queue, v_fq.ungrouped_seq, v_fq.ungrouped_empty, v_fq.ring_from, v_fq.discover_after,
               v_fq.discover_found, v_fq.discover_productive, v_fq.seen_max_id, v_fq.quiet_claims, v_maxid
          FROM queues AS c
          LEFT JOIN fair_queues AS f ON f.queue = c.queue
         WHERE c.queue = v_q;
        IF v_cfg.max_active IS NOT NULL OR v_cfg.max_active_per_group IS NOT NULL THEN
            v_total := NULL;   -- capped since: count
        END IF;
    END IF;
    v_v0 := CASE WHEN v_total IS NULL THEN _fair_index_visits('jobs_active_idx') END; v_t0 := clock_timestamp();
    LOOP
        EXIT WHEN v_total IS NOT NULL AND v_v0 IS NULL;
        SELECT c.max_active, c.max_active_per_group, c.noisy_share, c.noisy_min_active,
               f.queue, f.ungrouped_seq, f.ungrouped_empty, f.ring_from, f.discover_after, f.discover_found,
               f.discover_productive, f.seen_max_id, f.quiet_claims,
               a.total, a.keys, a.cnts, a.top, a.expired, a.settle, _fair_max_id(v_hint, f.seen_max_id)
          INTO v_cfg.max_active, v_cfg.max_active_per_group, v_cfg.noisy_share, v_cfg.noisy_min_active,
               v_fq.queue, v_fq.ungrouped_seq, v_fq.ungrouped_empty, v_fq.ring_from, v_fq.discover_after,
               v_fq.discover_found, v_fq.discover_productive, v_fq.seen_max_id, v_fq.quiet_claims,
               v_total, a_key, a_cnt, v_top, v_expired, v_settle, v_maxid
          FROM queues AS c
          LEFT JOIN fair_queues AS f ON f.queue = c.queue
         CROSS JOIN (SELECT coalesce(sum(x.n), 0)::int AS total,
                            array_agg(x.k) FILTER (WHERE x.k IS NOT NULL) AS keys,
                            array_agg(x.n) FILTER (WHERE x.k IS NOT NULL) AS cnts,
                            coalesce(max(x.n) FILTER (WHERE x.k IS NOT NULL), 0) AS top,
                            coalesce(bool_or(x.e), false) AS expired, coalesce(bool_or(x.s), false) AS settle
                       FROM (SELECT j.group_key AS k, count(*)::int AS n,
                                    bool_or(j.lease_expires_at < now() AND j.attempt < j.max_attempts
                                            AND NOT j.cancel_requested) AS e,
                                    bool_or(j.lease_expires_at < now() AND (j.attempt >= j.max_attempts
                                                                            OR j.cancel_requested)) AS s
                               FROM jobs AS j
                              WHERE j.state = 'active' AND j.queue = v_q
                              GROUP BY j.group_key) AS x) AS a
         WHERE c.queue = v_q;
        EXIT WHEN NOT (v_expired OR v_settle) OR v_promoted;
        PERFORM _settle_expired(ARRAY[v_q]) WHERE v_settle;
        PERFORM _promote_due(v_q) WHERE v_expired;
        v_promoted := true;
    END LOOP;
    IF v_v0 IS NOT NULL AND NOT v_promoted
       AND v_cfg.max_active IS NULL AND v_cfg.max_active_per_group IS NULL THEN
        v_dear := _fair_index_visits('jobs_active_idx') - v_v0 > 2 * v_total + 1000;
        IF v_dear OR v_any_kept THEN   -- (the payload is built only when kept: not on every claim)
            PERFORM _fair_keep('a ' || v_q, v_dear, v_t0,
                               CASE WHEN v_dear THEN jsonb_build_array(v_total, v_top,
                                   coalesce(to_jsonb(a_key), '[]'), coalesce(to_jsonb(a_cnt), '[]')) END);
        END IF;
    END IF;
    IF v_cfg.max_active IS NOT NULL THEN
        room := least(room, v_cfg.max_active - v_total);
    END IF;
    IF room <= 0 THEN
        ids := '{}';
        tids := '{}';
        RETURN;
    END IF;

    IF v_fq.queue IS NULL THEN
        INSERT INTO fair_queues AS f (queue) VALUES (v_q) ON CONFLICT DO NOTHING;
        SELECT * INTO v_fq FROM fair_queues AS f WHERE f.queue = v_q;
    END IF;
    u_seq := v_fq.ungrouped_seq;
    IF v_hint IS NOT NULL THEN
        v_fq.seen_max_id := (v_hint ->> 0)::bigint;
        v_fq.quiet_claims := (v_hint ->> 1)::int;   -- (ring_from only from the row: _fair_ring_raise)
    END IF;

    -- Work of a group without a cursor, or ungrouped work, mostly comes with new jobs. While no
    -- job was inserted since the previous claim (the highest id is the same: a backlog being
    -- worked off), the discovery sweep and the look for ungrouped work run only every 8th claim,
    -- or when this claim comes up short (see the end of the loop). What else makes such work
    -- (a retry, a fail or release back to pending, a commit of a long transaction's old ids) is
    -- thus found within 8 claims, or at once when the queue has nothing else to give.
    -- The jobs inserted since the previous claim (at most c_fresh_ids) are read by id instead: their
    -- groups get a cursor at once, and whether one of them is ungrouped is known, so such a claim
    -- counts as quiet too (the skip scan walked each group's claimed jobs and every version of its
    -- cursor, which a held snapshot keeps: see the top of this file; now it steps over groups with a cursor).
    v_fresh := coalesce(v_maxid > v_fq.seen_max_id AND v_maxid - v_fq.seen_max_id <= c_fresh_ids, false);
    IF v_fresh THEN
        SELECT d.ungrouped INTO u_fresh FROM _discover_fresh(v_q, v_fq.seen_max_id, v_maxid) AS d;
        IF u_fresh THEN
            u_empty := false;   -- saved as such unless a look in this claim finds none after all
        END IF;
    END IF;
    v_quiet := (v_maxid IS NOT DISTINCT FROM v_fq.seen_max_id OR v_fresh) AND v_fq.quiet_claims % 8 <> 7;
    u_out := v_quiet AND v_fq.ungrouped_empty AND NOT u_fresh;
    IF NOT v_quiet AND v_fq.ungrouped_empty AND NOT u_fresh
       AND (v_maxid IS NOT DISTINCT FROM v_fq.seen_max_id OR v_fresh) THEN
        -- the 8th quiet claim looks for ungrouped work that came back without a new job, whether
        -- or not the ungrouped turn comes in this claim; unless this session's last look proved
        -- dear and is recent (_fair_keep): then as a quiet claim
        IF v_any_kept AND _fair_kept_or_gate('u ' || v_q) IS NOT NULL THEN
            u_out := true;
        ELSE
            v_v1 := _fair_index_visits('jobs_pending_idx'); v_t0 := clock_timestamp();
            SELECT h.hp, h.hr, h.hi INTO u_hp, u_hr, u_hi FROM _fair_ungrouped_head(v_q, v_open, '{}') AS h;
            u_probed := true;
            u_empty := u_hi IS NULL;
            u_out := u_empty;
            PERFORM _fair_keep('u ' || v_q, _fair_index_visits('jobs_pending_idx') - v_v1 > 1000, v_t0);
        END IF;
    END IF;

    -- New groups join the ring as never served (on a queue without the claim lock, one
    -- discoverer at a time: the others skip it rather than wait). A quiet claim sweeps too while
    -- the sweeps keep finding groups (this round of the sweep or the last one did): a backlog
    -- loaded at once gets all its groups in the ring first.
    v_pos := v_fq.discover_after;
    v_found := v_fq.discover_found;
    v_productive := v_fq.discover_productive;
    IF (NOT v_quiet OR v_found OR v_productive)
       -- (the 8th claim's sweep, when the last one proved dear: see _fair_keep; not a sweep that
       -- stands in for _discover_fresh, nor one while the sweeps keep finding groups)
       AND NOT (NOT v_found AND NOT v_productive AND (v_maxid IS NOT DISTINCT FROM v_fq.seen_max_id OR v_fresh)
                AND v_any_kept AND _fair_kept_or_gate('s ' || v_q) IS NOT NULL) THEN
        v_v1 := _fair_index_visits('jobs_group_idx'); v_t0 := clock_timestamp();
        SELECT * INTO v_pos, v_found, v_productive
          FROM _fair_sweep(v_q, serialized, c_discover_steps, v_pos, v_found, v_productive);
        IF NOT v_found AND (v_maxid IS NOT DISTINCT FROM v_fq.seen_max_id OR v_fresh) THEN
            PERFORM _fair_keep('s ' || v_q, _fair_index_visits('jobs_group_idx') - v_v1 > 1000, v_t0);
        END IF;
    END IF;

    -- Read now, not with the state above: cursors a concurrent discovery committed meanwhile are
    -- new groups, and go before every served one (as the walk's first read would find them).
    v_unserved := _fair_unserved(v_q);

    -- The usual claims skip the walk below (queue without caps, no group noisy): when all pending work
    -- fits in the claim, the drain takes it; else, with no never-served cursor and no kind quota that
    -- could run out, the fast path takes one head from each of the first `room` free groups of the ring
    -- (what the walk picks too, when each has a head and U's turn does not come first). What either
    -- leaves, the walk takes over (what they locked is this claim's own and found again). _fair_drain
    -- and _fair_fast have the why.
    v_k := (SELECT min(q) FROM unnest(v_quota) AS q);   -- (NULL: no kind quota)
    -- Head floors (see "Head floors"): kept by a session whose head probes proved dear.
    SELECT * INTO v_epoch, h_kept, h_floor FROM _fair_floors(v_q, v_any_kept, v_promoted);
    r_epoch := CASE WHEN _fair_count_every() > 0 AND NOT v_promoted THEN v_epoch END;
    v_v2 := _fair_index_visits('jobs_group_idx'); v_t0 := clock_timestamp();
    -- Places in the ring are drawn from here on (see _fair_ring_raise); the drain and the fast path can be
    -- turned off by a session (the tests compare them with the walk).
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('pgjobs.ring:' || v_q, 0));
    v_short := NOT serialized AND v_cfg.max_active IS NULL AND v_cfg.max_active_per_group IS NULL
               AND NOT (v_top >= v_cfg.noisy_min_active AND v_top > v_cfg.noisy_share * v_total)
               AND current_setting('pgjobs.fair_walk_only', true) IS DISTINCT FROM 'on';
    IF v_short AND (v_open IS NULL OR v_k >= room) AND u_out AND h_floor IS NULL THEN
        -- (calls as expressions: a SELECT ... FROM f() costs a query's start and a materialised result)
        v_f := _fair_drain(v_q, room, v_open, v_fq.ring_from, v_unserved, a_key, a_cnt, v_total, v_cfg.noisy_min_active,
                           v_cfg.noisy_share, v_pos, v_found, v_productive, u_empty, v_maxid, v_quiet, v_fq.quiet_claims, false, r_epoch);
        ids := v_f.ids; tids := v_f.tids;
    END IF;
    IF ids IS NULL AND v_short AND NOT v_unserved AND (v_open IS NULL OR v_k >= room) THEN
        v_f := _fair_fast(v_q, room, v_open, h_floor, h_kept, r_epoch, v_t0, v_fq.ring_from, v_limit, a_key, a_cnt, u_out, u_seq, v_pos,
                          v_found, v_productive, u_empty, v_maxid, v_quiet, v_fq.quiet_claims);
        ids := v_f.ids; tids := v_f.tids;
        l_key := v_f.r_key; l_ctid := v_f.r_ctid; l_seq := v_f.r_seq; l_act := v_f.r_act; l_dead := v_f.r_locked;
        IF ids IS NULL AND u_out AND h_floor IS NULL AND NOT v_f.r_floors AND NOT v_any_kept   -- came up short: rounds
           AND _fair_index_visits('jobs_group_idx') - v_v2 <= 4 * room + 500 THEN   -- unless reads are dear (a held snapshot)
            v_f := _fair_drain(v_q, room, v_open, v_fq.ring_from, false, a_key, a_cnt, v_total, v_cfg.noisy_min_active,
                               v_cfg.noisy_share, v_pos, v_found, v_productive, u_empty, v_maxid, v_quiet, v_fq.quiet_claims, true, r_epoch);
            ids := v_f.ids; tids := v_f.tids;
        END IF;
    END IF;
    IF ids IS NULL THEN
        v_f := _fair_walk(v_q, room, kinds, quotas, serialized, v_cfg.max_active_per_group, v_cfg.noisy_min_active,
                          v_cfg.noisy_share, v_fq.ring_from, v_fq.ungrouped_seq, v_total, a_key, a_cnt, v_maxid,
                          v_quiet, v_pos, v_found, v_fq.quiet_claims, v_productive, u_out, u_probed, u_empty, u_hp,
                          u_hr, u_hi, v_unserved, v_chunk, v_limit, l_key, l_ctid, l_seq, l_act, l_dead, h_floor);
        ids := v_f.ids; tids := v_f.tids;
    END IF;
    v_dear_h := _fair_index_visits('jobs_group_idx') - v_v2 > 4 * room + 500;
    IF v_dear_h OR h_kept IS NOT NULL THEN
        PERFORM _fair_floors_save(v_q, h_kept, h_floor, v_epoch, v_dear_h, cardinality(ids) >= room, tids,
                                  extract(epoch FROM clock_timestamp() - v_t0));
    END IF;
END;
$$;


-- Capped pick on a queue without fair selection (its claim lock held): claim order (priority,
-- run_at, id), passing over groups at max_active_per_group and kinds whose quota is spent.
CREATE OR REPLACE FUNCTION pgjobs._claim_capped(queue text, room int, kinds text[], quotas int[],
                                                OUT ids bigint[], OUT tids tid[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_q       text := _claim_capped.queue;
    v_cfg     queues;
    v_open    text[] := kinds;
    v_quota   int[] := quotas;
    v_total   int;
    v_blocked text[];
    g_key     text[] := '{}';             -- active jobs per group (the groups with any, and those picked)
    g_act     int[] := '{}';
    v_ids     bigint[] := '{}';
    v_tids    tid[] := '{}';
    v_rows    record;
    v_skipped boolean;
    v_seen    int;
    v_g       int;
    v_k       int;
BEGIN
    SELECT * INTO v_cfg FROM queues AS c WHERE c.queue = v_q;
    SELECT count(*)::int INTO v_total FROM jobs AS j WHERE j.state = 'active' AND j.queue = v_q;
    IF v_cfg.max_active IS NOT NULL THEN
        room := least(room, v_cfg.max_active - v_total);
    END IF;
    v_blocked := '{}';
    IF v_cfg.max_active_per_group IS NOT NULL THEN
        -- active jobs per group, as of now
        SELECT coalesce(array_agg(a.k), '{}'), coalesce(array_agg(a.n), '{}') INTO g_key, g_act
          FROM (SELECT j.group_key AS k, count(*)::int AS n FROM jobs AS j
                 WHERE j.state = 'active' AND j.queue = v_q AND j.group_key IS NOT NULL
                 GROUP BY j.group_key) AS a;
        SELECT coalesce(array_agg(a.k), '{}') INTO v_blocked
          FROM unnest(g_key, g_act) AS a(k, n)
         WHERE a.n >= v_cfg.max_active_per_group;
    END IF;

    WHILE cardinality(v_ids) < room LOOP
        v_skipped := false;
        v_seen := 0;
        FOR v_rows IN
            SELECT j.id, j.group_key, j.kind, j.ctid AS jtid
              FROM jobs AS j
             WHERE j.state = 'pending' AND j.queue = v_q
               AND (v_open IS NULL OR j.kind = ANY (v_open))
               AND (j.group_key IS NULL OR j.group_key <> ALL (v_blocked))
               AND j.id <> ALL (v_ids)
             ORDER BY j.priority, j.run_at, j.id
             LIMIT room - cardinality(v_ids)
               FOR UPDATE SKIP LOCKED
        LOOP
            v_seen := v_seen + 1;
            IF v_open IS NOT NULL AND NOT v_rows.kind = ANY (v_open) THEN
                v_skipped := true;
                CONTINUE;
            END IF;
            IF v_rows.group_key IS NOT NULL AND v_cfg.max_active_per_group IS NOT NULL THEN
                v_g := array_position(g_key, v_rows.group_key);
                IF v_g IS NULL THEN
                    g_key := g_key || v_rows.group_key;
                    g_act := g_act || 0;
                    v_g := cardinality(g_key);
                END IF;
                IF g_act[v_g] >= v_cfg.max_active_per_group THEN
                    v_blocked := v_blocked || v_rows.group_key;
                    v_skipped := true;
                    CONTINUE;
                END IF;
                g_act[v_g] := g_act[v_g] + 1;
            END IF;
            v_ids := v_ids || v_rows.id;
            v_tids := v_tids || v_rows.jtid;
            IF v_open IS NOT NULL THEN
                v_k := array_position(kinds, v_rows.kind);
                v_quota[v_k] := v_quota[v_k] - 1;
                IF v_quota[v_k] <= 0 THEN
                    v_open := array_remove(v_open, v_rows.kind);
                    v_skipped := true;
                END IF;
            END IF;
        END LOOP;
        -- Fewer rows than asked and none passed over: the queue has nothing more to give.
        EXIT WHEN NOT v_skipped OR v_seen = 0 OR (v_open IS NOT NULL AND cardinality(v_open) = 0);
    END LOOP;
    ids := v_ids;
    tids := v_tids;
END;
$$;

CREATE OR REPLACE FUNCTION pgjobs._claim_controlled(worker text, queues text[], max_jobs int, lease interval,
                                                    kind_limits jsonb)
RETURNS pgjobs.claimed_job[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
-- Every statement below reads a handful of index entries or rows by ctid. A generic plan's estimate on a
-- big table can still pass jit_above_cost, and compiling costs far more than running (tens of ms per
-- claim); and on group_cursors, small and rewritten all the time, the statistics lag, and a plan that
-- reads the whole table or a bitmap of a key's dead versions looks cheaper than it is (bitmap scans also
-- never mark dead index entries, so every later lookup pays for them again). Generic plans from the first
-- call on (inherited by the functions called from here): their shapes are fixed by the indexes above, and
-- planning each statement per call cost more than running most of them.
SET jit = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_kinds  text[];                      -- NULL: any kind
    v_quotas int[];
    v_cfg    record;
    v_fair   boolean;
    v_paused boolean;
    v_capped boolean;
    v_got    bigint[];
    v_gottids tid[];
    v_tids   tid[] := '{}';
    v_ids    bigint[] := '{}';
    v_rows   claimed_job[];
BEGIN
    IF kind_limits IS NOT NULL THEN
        SELECT coalesce(array_agg(e.key ORDER BY e.key), '{}'),
               coalesce(array_agg(least(floor((e.value::text)::numeric), max_jobs)::int ORDER BY e.key), '{}')
          INTO v_kinds, v_quotas
          FROM jsonb_each(kind_limits) AS e
         WHERE jsonb_typeof(e.value) = 'number' AND (e.value::text)::numeric >= 1;
        IF cardinality(v_kinds) = 0 THEN
            RETURN NULL;   -- only listed kinds may be taken, and none may
        END IF;
    END IF;

    FOR v_cfg IN
        SELECT c.queue, c.fair, c.max_active, c.max_active_per_group
          FROM pgjobs.queues AS c
         WHERE c.queue = ANY (_claim_controlled.queues)
         ORDER BY c.queue
    LOOP
        EXIT WHEN cardinality(v_ids) >= max_jobs;
        IF (v_cfg.max_active IS NOT NULL OR v_cfg.max_active_per_group IS NOT NULL)
           AND current_setting('transaction_isolation') <> 'read committed' THEN
            -- A snapshot older than the lock could miss jobs leased by the previous holder.
            RAISE EXCEPTION USING ERRCODE = 'PJ002',
                MESSAGE = format('claim on queue %L (it has concurrency caps) needs READ COMMITTED, not %s',
                                 v_cfg.queue, current_setting('transaction_isolation'));
        END IF;
        v_capped := v_cfg.max_active IS NOT NULL OR v_cfg.max_active_per_group IS NOT NULL;
        IF v_capped THEN
            PERFORM pg_advisory_xact_lock(hashtextextended('pgjobs.claim:' || v_cfg.queue, 0));
            -- the settings as of now (a configure_queue may have committed while we waited)
            SELECT c.fair, c.paused INTO v_fair, v_paused FROM pgjobs.queues AS c WHERE c.queue = v_cfg.queue;
            CONTINUE WHEN v_paused;
        ELSE
            v_fair := v_cfg.fair;
        END IF;
        -- Mostly there is nothing due: two index probes spare the call and its UPDATE, whose
        -- executor start alone (the indexes of jobs to open) costs more than the probes. (A fair
        -- queue's expired leases are found by _claim_fair's count of the active jobs, which reads
        -- them anyway.)
        IF EXISTS (SELECT 1 FROM jobs AS j
                    WHERE j.state = 'scheduled' AND j.queue = v_cfg.queue AND j.run_at <= now())
           OR (NOT v_fair
               AND EXISTS (SELECT 1 FROM jobs AS j
                            WHERE j.state = 'active' AND j.queue = v_cfg.queue AND j.lease_expires_at < now()
                              AND j.attempt < j.max_attempts AND NOT j.cancel_requested)) THEN
            PERFORM _promote_due(v_cfg.queue);
        END IF;
        IF v_fair THEN
            SELECT f.ids, f.tids INTO v_got, v_gottids
              FROM _claim_fair(v_cfg.queue, max_jobs - cardinality(v_ids), v_kinds, v_quotas, v_capped) AS f;
        ELSE
            SELECT f.ids, f.tids INTO v_got, v_gottids
              FROM _claim_capped(v_cfg.queue, max_jobs - cardinality(v_ids), v_kinds, v_quotas) AS f;
        END IF;
        IF cardinality(v_got) > 0 THEN
            v_ids := v_ids || v_got;
            v_tids := v_tids || v_gottids;
            IF v_kinds IS NOT NULL AND cardinality(v_ids) < max_jobs THEN
                -- What this queue gave counts against the call's kind limits (for the next queue: not after a
                -- full claim, the worker's usual one). The live states only: by id alone the lookup probed
                -- every history partition too, 50 ids times each partition's id index, on every claim.
                SELECT array_agg(k.quota - coalesce(t.taken, 0) ORDER BY k.ord) INTO v_quotas
                  FROM unnest(v_kinds, v_quotas) WITH ORDINALITY AS k(kind, quota, ord)
                  LEFT JOIN (SELECT j.kind, count(*)::int AS taken FROM jobs AS j
                              WHERE j.id = ANY (v_got) AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
                              GROUP BY j.kind) AS t ON t.kind = k.kind;
                SELECT array_agg(k.kind ORDER BY k.kind), array_agg(k.quota ORDER BY k.kind) INTO v_kinds, v_quotas
                  FROM unnest(v_kinds, v_quotas) AS k(kind, quota)
                 WHERE k.quota > 0;
                EXIT WHEN v_kinds IS NULL;
            END IF;
        END IF;
    END LOOP;

    IF cardinality(v_ids) = 0 THEN
        RETURN NULL;
    END IF;
    WITH upd AS (
        UPDATE jobs AS j
           SET state = 'active',
               attempt = j.attempt + 1,
               lease_token = gen_random_uuid(),
               leased_by = worker,
               lease_expires_at = now() + lease,
               first_started_at = coalesce(j.first_started_at, now())
          FROM unnest(v_ids, v_tids) WITH ORDINALITY AS t(id, tid, ord)
         -- by ctid: every row was locked by this claim, so its version is the one read
         WHERE j.ctid = t.tid AND j.id = t.id AND j.state = ANY ('{waiting,scheduled,pending,active}'::job_state[])
           AND j.ctid = ANY (v_tids)
        RETURNING j.id, j.kind, j.queue, j.payload, j.meta, j.attempt, j.max_attempts, j.lease_token,
                  j.lease_expires_at, j.checkpoint, j.group_key, j.batch_id, j.first_started_at, t.ord
    )
    SELECT array_agg(ROW(u.id, u.kind, u.queue, u.payload, u.meta, u.attempt, u.max_attempts, u.lease_token,
                         u.lease_expires_at, u.checkpoint, u.group_key, u.batch_id,
                         u.first_started_at)::claimed_job
                     ORDER BY u.ord)
      INTO v_rows
      FROM upd AS u;
    RETURN v_rows;
END;
$$;
