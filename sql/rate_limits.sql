-- Rate limits: at most max_starts attempts START in any window of length `per` (plus burst), counted across
-- every worker, for a key (jobs name it in rate_key) or for a whole queue. A retry is a start: every claim
-- of a job takes a token.
--
-- The algorithm is an exact sliding window (docs/design/claim.md, "Where flow control sits"). Each limit has
-- a log of its starts, one row a token taken (rate_starts: seq consecutive per limit, started_at). With
-- n = max_starts + burst, the start that gets seq q is allowed at time t when row q - n is absent or was
-- logged at or before t - per. A claim that wants k tokens reads the newest seq s (one backward index
-- descent) and the rows s-n+1 .. s-n+k (one short index range): k entries, whatever n is. A late claim
-- delays its own slot only (the slot frees per after it), where a token interval schedule (GCRA without a
-- burst) loses every lateness for good.
--
-- Why it is exact. A claim checks at its own now(), the start time its attempts record (first_started_at,
-- lease_expires_at - lease), and logs max(now(), newest logged): the logged times never decrease along seq,
-- and none is earlier than the start it stands for. (A claim whose transaction began before the newest
-- logged start took the lock after it: it is checked at its own earlier time, which is only stricter, and
-- logged at the newest time, which keeps the order.) Take any window of length per and its start of the
-- highest seq, q, at t: row q - n was logged at or before t - per, every row below it no later, and each of
-- those starts happened no later than logged, so before the window; it holds at most q-n+1 .. q, n starts.
--
-- Exact across the fleet: a claim reads and appends the log under a transaction-level advisory lock on the
-- limit, in the transaction that leases the jobs; a claim that rolls back takes its rows, so its tokens,
-- with it. The log is insert-only, no row is rewritten per claim; maintenance (_rate_prune) deletes the
-- rows below s - n + 1, which no claim reads again, so the dead entries a held snapshot keeps lie below
-- every range a claim reads.
--
-- Where the claim calls in (the only lines the claim files hold of this):
-- * pgjobs.claim (claim.sql): `IF _rate_applies(queues)` sends the call through _claim_rated (claim.sql),
--   which takes the tokens here and the jobs through _claim_unrated;
-- * _next_due (claim.sql): a limited queue's next token time is a due time, so an idle worker's poller
--   wakes then, not at its poll interval;
-- * _maintain_history (maintain.sql): _rate_prune deletes the log rows no claim reads again.
--
-- Per-key limits hold back what they cannot start: a claim that took more jobs of a key than it has tokens
-- for undoes its own work (a subtransaction) and files the key's pending jobs as scheduled at the times the
-- key's next tokens free (rate_held_until = that run_at): exact for the next n tokens (per after the starts
-- that hold them), estimates past them. A held job leaves the pending index, so the claims that follow never
-- read it again; it comes back as a due scheduled job when its time comes, which is also the poller's next
-- due time (no busy waiting, no poll-interval rhythm). A held job that comes due without a token is held
-- again, at the next token times; only the tokens decide.

-- The advisory lock of one limit, for the rest of the transaction (all claims of the limit queue here).
CREATE OR REPLACE FUNCTION pgjobs._rate_lock(scope text, key text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('pgjobs.rate|' || scope || '|' || key, 0));
END;
$$;

-- A limit's window at `at` for a claim that wants up to `want` tokens: `tokens` it may take now (NULL: no
-- limit), `next_at` when the first token it may not take frees (`at` when it may take all it wants), and
-- the window: n = max_starts + burst starts per `per`. Exact only under _rate_lock (the caller holds it);
-- a read for display (explain, the poller) without it.
CREATE OR REPLACE FUNCTION pgjobs._rate_window(scope text, key text, at timestamptz, want int,
                                               OUT tokens int, OUT next_at timestamptz, OUT n int,
                                               OUT per interval)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_k    int;
    v_s    bigint;
    v_busy bigint;
    v_from timestamptz;
    v_lo   bigint;
    v_hi   bigint;
    v_mid  bigint;
BEGIN
    SELECT l.max_starts + l.burst, l.per INTO n, per
      FROM rate_limits AS l WHERE l.scope = _rate_window.scope AND l.key = _rate_window.key;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- (a start takes the row n places below its own: past n, the tokens wanted are the claim's own starts)
    v_k := least(greatest(want, 0), n);
    -- The newest row: one backward descent of rate_starts_pkey.
    SELECT x.seq INTO v_s FROM rate_starts AS x
     WHERE x.scope = _rate_window.scope AND x.key = _rate_window.key ORDER BY x.seq DESC LIMIT 1;
    IF v_s IS NULL THEN
        tokens := v_k; next_at := at;   -- no start logged yet
        RETURN;
    END IF;
    -- Token j is row s-n+j: taken while it started after at - per. The rows of a range are never deleted
    -- (maintenance keeps s-n+1 and above); an absent one is older than the log (a new limit, or one raised).
    -- The times never decrease along seq, so the tokens taken are the range's last rows.
    IF v_k <= 64 THEN
        SELECT count(*), min(x.started_at) INTO v_busy, v_from FROM rate_starts AS x
         WHERE x.scope = _rate_window.scope AND x.key = _rate_window.key
           AND x.seq BETWEEN v_s - n + 1 AND v_s - n + v_k AND x.started_at > at - per;
    ELSE
        -- (a display's ask, list_rate_limits: the first row taken by bisection, log2(k) descents, not k rows)
        v_lo := v_s - n + 1;
        v_hi := v_s - n + v_k + 1;
        WHILE v_lo < v_hi LOOP
            v_mid := (v_lo + v_hi) / 2;
            v_from := NULL;
            SELECT x.started_at INTO v_from FROM rate_starts AS x
             WHERE x.scope = _rate_window.scope AND x.key = _rate_window.key AND x.seq = v_mid;
            IF v_from > at - per THEN
                v_hi := v_mid;
            ELSE
                v_lo := v_mid + 1;
            END IF;
        END LOOP;
        v_busy := v_s - n + v_k + 1 - v_lo;
        SELECT x.started_at INTO v_from FROM rate_starts AS x
         WHERE x.scope = _rate_window.scope AND x.key = _rate_window.key AND x.seq = v_lo;
    END IF;
    tokens := v_k - v_busy;
    next_at := CASE WHEN v_busy > 0 THEN v_from + per ELSE at END;
END;
$$;

-- Takes k tokens of a limit at `at` (the caller holds _rate_lock and checked them with _rate_window): k rows
-- after the newest, logged at max(at, newest logged) so that the times never decrease along seq (why that
-- keeps the bound exact: the top of this file).
CREATE OR REPLACE FUNCTION pgjobs._rate_take(scope text, key text, k int, at timestamptz)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_s    bigint;
    v_last timestamptz;
BEGIN
    IF k IS NULL OR k <= 0 THEN
        RETURN;
    END IF;
    SELECT x.seq, x.started_at INTO v_s, v_last FROM rate_starts AS x
     WHERE x.scope = _rate_take.scope AND x.key = _rate_take.key ORDER BY x.seq DESC LIMIT 1;
    INSERT INTO rate_starts (scope, key, seq, started_at)
    SELECT _rate_take.scope, _rate_take.key, coalesce(v_s, 0) + g.i, greatest(at, v_last)
      FROM generate_series(1, k) AS g(i);
END;
$$;

-- When a limit's next token frees (NULL: no limit; `at` when one is free now).
CREATE OR REPLACE FUNCTION pgjobs._next_token_at(scope text, key text, at timestamptz DEFAULT now())
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN (_rate_window(scope, key, at, 1)).next_at;
END;
$$;

-- Whether a claim of these queues takes the rated path: one of the queues has a limit, or a key limit exists
-- and one of the queues ever had a job with a rate_key (rate_queues). Probes of tables of a few rows: a queue
-- whose jobs never name a key pays only these, whatever keys other queues limit.
CREATE OR REPLACE FUNCTION pgjobs._rate_applies(queues text[])
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN (EXISTS (SELECT 1 FROM rate_limits AS l WHERE l.scope = 'queue' AND l.key = ANY (queues))
            OR EXISTS (SELECT 1 FROM rate_limits AS l WHERE l.scope = 'key')
               AND EXISTS (SELECT 1 FROM rate_queues AS r WHERE r.queue = ANY (queues)));
END;
$$;

-- Notes the queues of jobs enqueued with a rate_key (enqueue, enqueue_many): a read, and a write only the
-- first time a queue has one.
CREATE OR REPLACE FUNCTION pgjobs._rate_note_queues(queues text[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    INSERT INTO rate_queues AS r (queue)
    SELECT DISTINCT q.name FROM unnest(queues) AS q(name)
     WHERE q.name IS NOT NULL AND NOT EXISTS (SELECT 1 FROM rate_queues AS x WHERE x.queue = q.name)
    ON CONFLICT (queue) DO NOTHING;
END;
$$;

-- The per-key check of what a claim took (rows in claim order): locks the limited keys (in key order, so
-- two claims never wait on each other crosswise) and, when every key has the tokens, takes them and returns
-- NULL; else returns the keys that ran short with their tokens, {"key": tokens}, taking nothing.
CREATE OR REPLACE FUNCTION pgjobs._rate_admit(claimed pgjobs.claimed_job[])
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    r      record;
    v_n    jsonb := '{}';
    v_tok  int;
    v_short jsonb := '{}';
BEGIN
    FOR r IN SELECT j.rate_key AS key, count(*)::int AS n
               FROM unnest(claimed) AS c
               JOIN jobs_live AS j ON j.id = c.id
               JOIN rate_limits AS l ON l.scope = 'key' AND l.key = j.rate_key
              GROUP BY j.rate_key ORDER BY j.rate_key LOOP
        PERFORM _rate_lock('key', r.key);
        v_tok := (_rate_window('key', r.key, now(), r.n)).tokens;
        IF v_tok < r.n THEN
            v_short := v_short || jsonb_build_object(r.key, v_tok);
        END IF;
        v_n := v_n || jsonb_build_object(r.key, r.n);
    END LOOP;
    IF v_short <> '{}' THEN
        RETURN v_short;
    END IF;
    FOR r IN SELECT e.key, (e.value::text)::int AS n FROM jsonb_each(v_n) AS e ORDER BY e.key LOOP
        PERFORM _rate_take('key', r.key, r.n, now());
    END LOOP;
    RETURN NULL;
END;
$$;

-- Holds back the jobs of keys that ran short ({"key": tokens}) in these queues: the first `tokens` of each
-- key in claim order stay (the claim's retry takes them), the next ones (up to `how_many` a key) are filed
-- as scheduled at the times the key's next tokens free. The front of the key's line (jobs held before, due
-- now or promoted to pending, and lapsed leases) takes the next token times; new jobs go after the jobs held
-- already, or take the next token times when none is left ahead. A pending job leaves the pending index; a
-- due scheduled one gets its new time; an active one with a lapsed lease keeps its lease until then. SKIP
-- LOCKED: a job another claim holds is that claim's.
--
-- A token that frees while this claim runs, or within as long again as it has run, is no time to sleep to:
-- the poller reads due times from its own clock on and would miss one that passes while the claim commits
-- and it reads. Those jobs are filed due at this moment (after this claim's now(), so its next turn leaves
-- them) and their queues woken at commit (_wake): the next claim takes them, or, a little early, finds the
-- key short and files them again, closer to their time.
CREATE OR REPLACE FUNCTION pgjobs._rate_hold(short jsonb, queues text[], how_many int)
RETURNS int
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    r      record;
    v_n    int;
    v_per  interval;
    v_s    bigint;
    v_last timestamptz;
    v_clock timestamptz;
    v_soon timestamptz;
    v_done int := 0;
    v_k    int;
    v_wake boolean;
BEGIN
    -- (No lock of the key: the times are estimates, and a lock taken here, outside the claim's turn, would be
    -- held to the end of the transaction while the next turn locks other keys: an order of locks another
    -- claim could take the other way round.)
    FOR r IN SELECT e.key, (e.value::text)::int AS tokens FROM jsonb_each(short) AS e ORDER BY e.key LOOP
        SELECT l.max_starts + l.burst, l.per INTO v_n, v_per FROM rate_limits AS l
         WHERE l.scope = 'key' AND l.key = r.key;
        CONTINUE WHEN NOT FOUND;
        SELECT x.seq INTO v_s FROM rate_starts AS x WHERE x.scope = 'key' AND x.key = r.key
         ORDER BY x.seq DESC LIMIT 1;
        -- The end of the key's line of held jobs, if any of them is still to come.
        SELECT max(j.run_at) INTO v_last FROM jobs_live AS j
         WHERE j.rate_key = r.key AND j.state = 'scheduled' AND j.run_at = j.rate_held_until;
        v_last := CASE WHEN v_last > now() THEN v_last END;
        v_clock := clock_timestamp();
        v_soon := v_clock + (v_clock - now());
        WITH cand AS (
            SELECT c.id, c.priority, c.run_at, c.front
              FROM (SELECT j.id, j.priority, j.run_at, j.rate_held_until IS NOT NULL AS front FROM jobs_live AS j
                     WHERE j.rate_key = r.key AND j.state = 'pending' AND j.queue = ANY (queues)
                     ORDER BY j.priority, j.run_at, j.id
                     LIMIT how_many + r.tokens
                       FOR UPDATE SKIP LOCKED) AS c
            -- due scheduled jobs and lapsed leases of the key: the few a claim takes from outside the index
            UNION ALL
            SELECT c.id, c.priority, c.run_at, true
              FROM (SELECT j.id, j.priority, j.run_at FROM jobs_live AS j
                     WHERE j.rate_key = r.key AND j.state = 'scheduled' AND j.run_at <= now()
                       AND j.queue = ANY (queues)
                     LIMIT how_many
                       FOR UPDATE SKIP LOCKED) AS c
            UNION ALL
            SELECT c.id, c.priority, c.run_at, true
              FROM (SELECT j.id, j.priority, j.run_at FROM jobs_live AS j
                     WHERE j.queue = ANY (queues) AND j.state = 'active' AND j.lease_expires_at < now()
                       AND j.rate_key = r.key
                     LIMIT how_many
                       FOR UPDATE SKIP LOCKED) AS c
        ), held AS (
            SELECT k.id, k.front, row_number() OVER (PARTITION BY k.front ORDER BY k.l) AS i,
                   count(*) FILTER (WHERE k.front) OVER () AS f
              FROM (SELECT c.id, c.front, row_number() OVER (ORDER BY c.priority, c.run_at, c.id) AS l
                      FROM cand AS c) AS k
             WHERE k.l > r.tokens
        ), pos AS (
            -- p: the job's place among the key's next starts (the retry's `tokens` first); NULL: after v_last
            SELECT h.id, h.i, CASE WHEN h.front THEN r.tokens + h.i
                                   WHEN v_last IS NULL THEN r.tokens + h.f + h.i END AS p
              FROM held AS h
        ), slot AS (
            -- The time slot k (1..n) frees: per after row s-n+k was logged (NULL: absent, free now).
            SELECT g.k, x.started_at + v_per AS free
              FROM generate_series(1, least(v_n, (SELECT max(p.p) FROM pos AS p))) AS g(k)
              LEFT JOIN rate_starts AS x ON x.scope = 'key' AND x.key = r.key AND x.seq = v_s - v_n + g.k
        ), late AS (
            -- Place p takes slot (p-1) % n + 1 after c = (p-1) / n turns of the window: when it frees (not
            -- before this claim's turn is over) or, after c turns, c * per after a start that takes it now at
            -- the earliest. Past the line, the window's pace: n starts per `per`.
            SELECT t.id, CASE WHEN t.at <= v_soon THEN v_clock ELSE t.at END AS at, t.at <= v_soon AS soon
              FROM (SELECT p.id, CASE WHEN p.p IS NULL THEN v_last + p.i * (v_per / v_n)
                                      WHEN p.p <= v_n THEN greatest(s.free, v_clock)
                                      ELSE greatest(s.free, now()) + ((p.p - 1) / v_n) * v_per END AS at
                      FROM pos AS p LEFT JOIN slot AS s ON s.k = (p.p - 1) % v_n + 1) AS t
        ), upd AS (
            UPDATE jobs_live AS j
               SET state = CASE WHEN j.state = 'active' THEN j.state ELSE 'scheduled' END,
                   run_at = CASE WHEN j.state = 'active' THEN j.run_at ELSE late.at END,
                   rate_held_until = CASE WHEN j.state = 'active' THEN j.rate_held_until ELSE late.at END,
                   lease_expires_at = CASE WHEN j.state = 'active' THEN late.at ELSE j.lease_expires_at END
              FROM late WHERE j.id = late.id
            RETURNING late.soon
        )
        SELECT count(*), bool_or(upd.soon) INTO v_k, v_wake FROM upd;
        v_done := v_done + v_k;
        IF v_wake THEN
            PERFORM _wake(queues);
        END IF;
    END LOOP;
    RETURN v_done;
END;
$$;

-- A limited queue's next token time in (lo, hi] (NULL: none): a due time for the poller (_next_due,
-- claim.sql). A token free already (it freed while the last claim and this read were on their way) with
-- jobs pending: a token interval (per / n) from now, so the poller still wakes at the limit's pace, never
-- faster (one wake per interval while the queue has pending jobs a claim did not take).
CREATE OR REPLACE FUNCTION pgjobs._rate_next_due(queues text[], lo timestamptz, hi timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM rate_limits AS l WHERE l.scope = 'queue' AND l.key = ANY (queues)) THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT min(t.at) FROM (
                SELECT CASE WHEN w.tokens = 0 THEN w.next_at
                            WHEN EXISTS (SELECT 1 FROM jobs AS j WHERE j.state = 'pending' AND j.queue = l.key)
                            THEN lo + w.per / w.n END AS at
                  FROM rate_limits AS l
                 CROSS JOIN LATERAL _rate_window(l.scope, l.key, lo, 1) AS w
                 WHERE l.scope = 'queue' AND l.key = ANY (queues)) AS t
             WHERE t.at <= hi);
END;
$$;

-- Writes or removes a limit (max_starts 0 removes it). NULLs: keep what the limit has (a new limit
-- needs both max_starts and per). Raises PJ002 naming the bad value, changing nothing.
CREATE OR REPLACE FUNCTION pgjobs._rate_configure(scope text, key text, max_starts int, per interval, burst int)
RETURNS pgjobs.rate_limits
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_old rate_limits;
    v_row rate_limits;
    v_per interval;
BEGIN
    IF max_starts < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = format('max_starts must be >= 0 (0 removes the limit), got %s', max_starts);
    ELSIF per <= interval '0' OR per > interval '100 years' THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = format('per must be a positive interval of at most 100 years, got %s', per);
    ELSIF burst < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = format('burst must be >= 0, got %s', burst);
    END IF;
    PERFORM _rate_lock(scope, key);
    SELECT * INTO v_old FROM rate_limits AS l WHERE l.scope = _rate_configure.scope AND l.key = _rate_configure.key;
    IF max_starts = 0 THEN
        DELETE FROM rate_limits AS l WHERE l.scope = _rate_configure.scope AND l.key = _rate_configure.key;
        PERFORM _rate_release(scope, key);
        RETURN NULL;
    ELSIF max_starts IS NULL AND per IS NULL AND burst IS NULL THEN
        RETURN v_old;
    ELSIF coalesce(max_starts, v_old.max_starts) IS NULL OR coalesce(per, v_old.per) IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('%s %s has no rate limit yet: a new one needs max_starts and per, got max_starts %s, per %s',
                             scope, _shown(key), coalesce(max_starts::text, 'NULL'), coalesce(per::text, 'NULL'));
    END IF;
    v_per := coalesce(per, v_old.per);
    IF v_per / coalesce(max_starts, v_old.max_starts) < interval '1 microsecond' THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('max_starts %s per %s is more than one start a microsecond', coalesce(max_starts, v_old.max_starts), v_per);
    END IF;
    INSERT INTO rate_limits AS l (scope, key, max_starts, per, burst)
    VALUES (scope, key, coalesce(max_starts, v_old.max_starts), v_per, coalesce(burst, v_old.burst, 0))
    ON CONFLICT (scope, key) DO UPDATE
       SET max_starts = EXCLUDED.max_starts, per = EXCLUDED.per, burst = EXCLUDED.burst, updated_at = now()
    RETURNING l.* INTO v_row;
    PERFORM _rate_release(scope, key);
    RETURN v_row;
END;
$$;

-- The jobs a claim held back for a key whose limit changed: due now, so the next claims take them with the
-- new limit's tokens (and hold back again what it cannot start), not at the old limit's times.
CREATE OR REPLACE FUNCTION pgjobs._rate_release(scope text, key text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_queues text[];
BEGIN
    IF scope <> 'key' THEN
        RETURN;
    END IF;
    -- SKIP LOCKED: a held job a claim has locked is that claim's (and a wait here, under the key's lock,
    -- for a claim that waits for the key's lock would be a deadlock).
    WITH held AS (
        SELECT j.id FROM jobs_live AS j
         WHERE j.rate_key = _rate_release.key AND j.state = 'scheduled' AND j.run_at = j.rate_held_until
           FOR UPDATE SKIP LOCKED
    ), upd AS (
        UPDATE jobs_live AS j SET run_at = now(), rate_held_until = NULL
          FROM held WHERE j.id = held.id
        RETURNING j.queue
    )
    SELECT array_agg(DISTINCT upd.queue) INTO v_queues FROM upd;
    IF v_queues IS NOT NULL THEN
        PERFORM _wake(v_queues);
    END IF;
END;
$$;

-- configure_rate_limit(key, max_starts, per, burst): at most max_starts starts of jobs whose rate_key is
-- `key` in any window of length per (+ burst), across every worker; max_starts 0 removes the limit.
CREATE OR REPLACE FUNCTION pgjobs.configure_rate_limit(key text, max_starts int, per interval DEFAULT NULL,
                                                       burst int DEFAULT 0)
RETURNS pgjobs.rate_limits
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    PERFORM _check_name('key', key);  -- limits: checks.sql
    IF max_starts IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = 'max_starts must not be NULL (0 removes the limit)';
    ELSIF max_starts > 0 AND per IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = format('per must not be NULL for max_starts %s', max_starts);
    ELSIF burst IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = 'burst must not be NULL (0: none)';
    END IF;
    RETURN _rate_configure('key', key, max_starts, per, burst);
END;
$$;

-- Every limit with its state now: the tokens a claim could take now and when the next token frees.
CREATE OR REPLACE FUNCTION pgjobs.list_rate_limits()
RETURNS TABLE (scope text, key text, max_starts int, per interval, burst int, tokens int, next_token_at timestamptz)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- (all n tokens asked for: n rows of the log a limit, a read for display)
    RETURN QUERY
    SELECT l.scope, l.key, l.max_starts, l.per, l.burst, w.tokens,
           CASE WHEN w.tokens > 0 THEN now() ELSE w.next_at END
      FROM rate_limits AS l
     CROSS JOIN LATERAL _rate_window(l.scope, l.key, now(), l.max_starts + l.burst) AS w
     ORDER BY l.scope, l.key;
END;
$$;

-- explain's gate (explain.sql): the limit that holds the job back, its tokens being gone, or its
-- held-back time; NULL when none does.
CREATE OR REPLACE FUNCTION pgjobs._explain_rate(j pgjobs.jobs)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    w record;
BEGIN
    -- held back by a claim (_rate_hold): its run_at is the time the claim gave it
    IF j.state = 'scheduled' AND j.run_at = j.rate_held_until AND j.run_at > now() THEN
        RETURN jsonb_build_object('reason', 'rate_limited', 'scope', 'key', 'rate_key', j.rate_key,
                                  'next_token_at', greatest(_next_token_at('key', j.rate_key), now()),  -- (NULL: the limit is gone)
                                  'held_until', j.run_at);
    END IF;
    IF j.rate_key IS NOT NULL THEN
        w := _rate_window('key', j.rate_key, now(), 1);
        IF w.tokens = 0 THEN
            RETURN jsonb_build_object('reason', 'rate_limited', 'scope', 'key', 'rate_key', j.rate_key,
                                      'next_token_at', w.next_at);
        END IF;
    END IF;
    w := _rate_window('queue', j.queue, now(), 1);
    IF w.tokens = 0 THEN
        RETURN jsonb_build_object('reason', 'rate_limited', 'scope', 'queue', 'queue', j.queue, 'next_token_at', w.next_at);
    END IF;
    RETURN NULL;
END;
$$;

-- Maintenance's step (_maintain_history, maintain.sql): deletes the log rows no claim reads again: those
-- below s - n + 1 of each limit (s its newest seq, n = max_starts + burst), and every row of a limit that is
-- gone (10,000 a pass). What a pass deletes is the starts since the last one.
CREATE OR REPLACE FUNCTION pgjobs._rate_prune()
RETURNS TABLE (action text, target text, rows bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    r   record;
    v_n bigint := 0;
    v_k bigint;
BEGIN
    -- Per limit, an index range at the old end of rate_starts_pkey, below every range a claim reads.
    FOR r IN SELECT l.scope, l.key, l.max_starts + l.burst AS n FROM rate_limits AS l LOOP
        DELETE FROM rate_starts AS x
         WHERE x.scope = r.scope AND x.key = r.key
           AND x.seq <= (SELECT y.seq FROM rate_starts AS y WHERE y.scope = r.scope AND y.key = r.key
                          ORDER BY y.seq DESC LIMIT 1) - r.n;
        GET DIAGNOSTICS v_k = ROW_COUNT;
        v_n := v_n + v_k;
    END LOOP;
    -- The rows of removed limits.
    DELETE FROM rate_starts AS x
     WHERE x.ctid = ANY (ARRAY(SELECT y.ctid FROM rate_starts AS y
                                WHERE NOT EXISTS (SELECT 1 FROM rate_limits AS l WHERE l.scope = y.scope AND l.key = y.key)
                                LIMIT 10000));
    GET DIAGNOSTICS v_k = ROW_COUNT;
    v_n := v_n + v_k;
    IF v_n > 0 THEN
        action := 'rate_prune'; target := 'rate_starts'; rows := v_n;
        RETURN NEXT;
    END IF;
END;
$$;
