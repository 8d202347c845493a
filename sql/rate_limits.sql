-- Rate limits: at most max_starts attempts START in any window of length `per` (plus burst), counted across
-- every worker, for a key (jobs name it in rate_key) or for a whole queue. A retry is a start: every claim
-- of a job takes a token.
--
-- The algorithm is GCRA (docs/design/claim.md, "Where flow control sits"): per limit a theoretical arrival
-- time TAT and an emission interval T = per / max_starts. A start at `now` is allowed while
-- TAT - now <= burst * T, and moves TAT to max(TAT, now) + T; n starts at once move it by n * T. The next
-- token is due at TAT - burst * T. Whatever the order in which claims take their tokens, the starts in any
-- window of length per number at most max_starts + burst: each moves TAT by at least T, and a start is
-- allowed only while TAT is at most burst * T ahead of it.
--
-- Exact across the fleet: a claim reads and moves TAT under a transaction-level advisory lock on the limit,
-- in the transaction that leases the jobs. The new TAT is a row inserted (rate_tats), never an update: a
-- claim that rolls back takes its row, so its tokens, with it, and no row is rewritten per claim (under a
-- held snapshot the versions of a hot row become a walk; the newest TAT row is one backward index descent).
--
-- Where the claim calls in (the only lines the claim files hold of this):
-- * pgjobs.claim (claim.sql): `IF _rate_applies(queues)` sends the call through _claim_rated (claim.sql),
--   which takes the tokens here and the jobs through _claim_unrated;
-- * _next_due (claim.sql): a limited queue's next token time is a due time, so an idle worker's poller
--   wakes then, not at its poll interval;
-- * _maintain_history (maintain.sql): _rate_prune deletes the TAT rows no claim reads again.
--
-- Per-key limits hold back what they cannot start: a claim that took more jobs of a key than it has tokens
-- for undoes its own work (a subtransaction) and files the key's pending jobs as scheduled, one token
-- interval apart from its next token time on (rate_held_until = that run_at). A held job leaves the pending
-- index, so the claims that follow never read it again; it comes back as a due scheduled job when its time
-- comes, which is also the poller's next due time (no busy waiting, no poll-interval rhythm). The times
-- are estimates: a held job that comes due without a token is held again; only the tokens decide.

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

-- A limit's state at `at`: the tokens a claim may take now (NULL: no limit), the TAT, T and the burst.
-- Exact only under _rate_lock (the caller holds it); a read for display (explain) without it.
CREATE OR REPLACE FUNCTION pgjobs._rate_state(scope text, key text, at timestamptz,
                                              OUT tokens int, OUT tat timestamptz, OUT t interval, OUT burst int)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_max int;
    v_per interval;
BEGIN
    SELECT l.max_starts, l.per, l.burst INTO v_max, v_per, burst
      FROM rate_limits AS l WHERE l.scope = _rate_state.scope AND l.key = _rate_state.key;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    t := v_per / v_max;
    -- The newest row: one backward descent of rate_tats_newest.
    SELECT r.tat INTO tat FROM rate_tats AS r
     WHERE r.scope = _rate_state.scope AND r.key = _rate_state.key ORDER BY r.tat DESC LIMIT 1;
    tat := greatest(coalesce(tat, at), at);
    -- n starts allowed while (TAT + (n - 1) T) - at <= burst T.
    tokens := greatest(0, floor(burst + 1 - extract(epoch FROM tat - at) / extract(epoch FROM t)))::int;
END;
$$;

-- Takes n tokens of a limit at `at` (the caller holds _rate_lock and checked them): TAT moves to
-- max(TAT, at) + n T, as a new row.
CREATE OR REPLACE FUNCTION pgjobs._take_tokens(scope text, key text, n int, at timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    s record;
BEGIN
    IF n IS NULL OR n <= 0 THEN
        RETURN NULL;
    END IF;
    s := _rate_state(scope, key, at);
    IF s.t IS NULL THEN
        RETURN NULL;   -- no limit (removed meanwhile): nothing to count
    END IF;
    INSERT INTO rate_tats (scope, key, tat, taken) VALUES (scope, key, s.tat + n * s.t, n);
    RETURN s.tat + n * s.t;
END;
$$;

-- When a limit's next token is due: TAT - burst T (NULL: no limit; at or before `at`: one is available).
CREATE OR REPLACE FUNCTION pgjobs._next_token_at(scope text, key text, at timestamptz DEFAULT now())
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    s record;
BEGIN
    s := _rate_state(scope, key, at);
    RETURN s.tat - s.burst * s.t;
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
        v_tok := (_rate_state('key', r.key, now())).tokens;
        IF v_tok < r.n THEN
            v_short := v_short || jsonb_build_object(r.key, v_tok);
        END IF;
        v_n := v_n || jsonb_build_object(r.key, r.n);
    END LOOP;
    IF v_short <> '{}' THEN
        RETURN v_short;
    END IF;
    FOR r IN SELECT e.key, (e.value::text)::int AS n FROM jsonb_each(v_n) AS e ORDER BY e.key LOOP
        PERFORM _take_tokens('key', r.key, r.n, now());
    END LOOP;
    RETURN NULL;
END;
$$;

-- Holds back the jobs of keys that ran short ({"key": tokens}) in these queues: the first `tokens` of each
-- key in claim order stay (the claim's retry takes them), the next ones (up to `how_many` a key) are filed
-- as scheduled at the key's next token times, one T apart, after the ones held already. A pending job
-- leaves the pending index; a due scheduled one gets its new time; an active one with a lapsed lease keeps
-- its lease until then. SKIP LOCKED: a job another claim holds is that claim's.
CREATE OR REPLACE FUNCTION pgjobs._rate_hold(short jsonb, queues text[], how_many int)
RETURNS int
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    r      record;
    s      record;
    v_from timestamptz;
    v_last timestamptz;
    v_n    int := 0;
    v_k    int;
BEGIN
    -- (No lock of the key: the times are estimates, and a lock taken here, outside the claim's turn, would be
    -- held to the end of the transaction while the next turn locks other keys: an order of locks another
    -- claim could take the other way round.)
    FOR r IN SELECT e.key, (e.value::text)::int AS tokens FROM jsonb_each(short) AS e ORDER BY e.key LOOP
        s := _rate_state('key', r.key, now());
        CONTINUE WHEN s.t IS NULL;
        -- The first time no token is left for the jobs that stay: after the `tokens` the retry takes.
        v_from := s.tat + (r.tokens - s.burst) * s.t;
        SELECT max(j.run_at) INTO v_last FROM jobs_live AS j
         WHERE j.rate_key = r.key AND j.state = 'scheduled' AND j.run_at = j.rate_held_until;
        v_from := greatest(v_from, v_last + s.t, now());
        WITH cand AS (
            SELECT c.id, c.priority, c.run_at
              FROM (SELECT j.id, j.priority, j.run_at FROM jobs_live AS j
                     WHERE j.rate_key = r.key AND j.state = 'pending' AND j.queue = ANY (queues)
                     ORDER BY j.priority, j.run_at, j.id
                     LIMIT how_many + r.tokens
                       FOR UPDATE SKIP LOCKED) AS c
            -- due scheduled jobs and lapsed leases of the key: the few a claim takes from outside the index
            UNION ALL
            SELECT c.id, c.priority, c.run_at
              FROM (SELECT j.id, j.priority, j.run_at FROM jobs_live AS j
                     WHERE j.rate_key = r.key AND j.state = 'scheduled' AND j.run_at <= now()
                       AND j.queue = ANY (queues)
                     LIMIT how_many
                       FOR UPDATE SKIP LOCKED) AS c
            UNION ALL
            SELECT c.id, c.priority, c.run_at
              FROM (SELECT j.id, j.priority, j.run_at FROM jobs_live AS j
                     WHERE j.queue = ANY (queues) AND j.state = 'active' AND j.lease_expires_at < now()
                       AND j.rate_key = r.key
                     LIMIT how_many
                       FOR UPDATE SKIP LOCKED) AS c
        ), late AS (
            SELECT l.id, v_from + (l.n - r.tokens - 1) * s.t AS at
              FROM (SELECT c.id, row_number() OVER (ORDER BY c.priority, c.run_at, c.id) AS n FROM cand AS c) AS l
             WHERE l.n > r.tokens
        )
        UPDATE jobs_live AS j
           SET state = CASE WHEN j.state = 'active' THEN j.state ELSE 'scheduled' END,
               run_at = CASE WHEN j.state = 'active' THEN j.run_at ELSE late.at END,
               rate_held_until = CASE WHEN j.state = 'active' THEN j.rate_held_until ELSE late.at END,
               lease_expires_at = CASE WHEN j.state = 'active' THEN late.at ELSE j.lease_expires_at END
          FROM late WHERE j.id = late.id;
        GET DIAGNOSTICS v_k = ROW_COUNT;
        v_n := v_n + v_k;
    END LOOP;
    RETURN v_n;
END;
$$;

-- A limited queue's next token time in (lo, hi] (NULL: none): a due time for the poller (_next_due,
-- claim.sql). A token available already (its time passed while the last claim and this read were on their
-- way) with jobs pending: the next token interval from now, so the poller still wakes at the limit's pace,
-- never faster (one wake per interval while the queue has pending jobs a claim did not take).
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
                SELECT CASE WHEN s.tat - s.burst * s.t > lo THEN s.tat - s.burst * s.t
                            WHEN EXISTS (SELECT 1 FROM jobs AS j WHERE j.state = 'pending' AND j.queue = l.key)
                            THEN lo + s.t END AS at
                  FROM rate_limits AS l
                 CROSS JOIN LATERAL _rate_state(l.scope, l.key, lo) AS s
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

-- Every limit with its state now: tokens available and the next token's time.
CREATE OR REPLACE FUNCTION pgjobs.list_rate_limits()
RETURNS TABLE (scope text, key text, max_starts int, per interval, burst int, tokens int, next_token_at timestamptz)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT l.scope, l.key, l.max_starts, l.per, l.burst, s.tokens, greatest(s.tat - s.burst * s.t, now())
      FROM rate_limits AS l
     CROSS JOIN LATERAL _rate_state(l.scope, l.key, now()) AS s
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
    v_at timestamptz;
BEGIN
    -- held back by a claim (_rate_hold): its run_at is the time the claim gave it
    IF j.state = 'scheduled' AND j.run_at = j.rate_held_until AND j.run_at > now() THEN
        RETURN jsonb_build_object('reason', 'rate_limited', 'scope', 'key', 'rate_key', j.rate_key,
                                  'next_token_at', greatest(_next_token_at('key', j.rate_key), now()),  -- (NULL: the limit is gone)
                                  'held_until', j.run_at);
    END IF;
    IF j.rate_key IS NOT NULL AND (_rate_state('key', j.rate_key, now())).tokens = 0 THEN
        RETURN jsonb_build_object('reason', 'rate_limited', 'scope', 'key', 'rate_key', j.rate_key,
                                  'next_token_at', _next_token_at('key', j.rate_key));
    END IF;
    IF (_rate_state('queue', j.queue, now())).tokens = 0 THEN
        v_at := _next_token_at('queue', j.queue);
        RETURN jsonb_build_object('reason', 'rate_limited', 'scope', 'queue', 'queue', j.queue, 'next_token_at', v_at);
    END IF;
    RETURN NULL;
END;
$$;

-- Maintenance's step (_maintain_history, maintain.sql): deletes the TAT rows no claim reads again: all but
-- the newest of a limit, and every row of a limit that is gone (10,000 a pass). The rows below a limit's
-- newest are the claims since the last pass: the pass is bounded by the claim rate times its interval.
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
    -- Per limit, the rows below its newest: an index range at the old end of rate_tats_newest.
    FOR r IN SELECT l.scope, l.key FROM rate_limits AS l LOOP
        DELETE FROM rate_tats AS t
         WHERE t.scope = r.scope AND t.key = r.key
           AND t.tat < (SELECT x.tat FROM rate_tats AS x WHERE x.scope = r.scope AND x.key = r.key
                         ORDER BY x.tat DESC LIMIT 1);
        GET DIAGNOSTICS v_k = ROW_COUNT;
        v_n := v_n + v_k;
    END LOOP;
    -- The rows of removed limits (what is left is a row or so per limit: a short read).
    DELETE FROM rate_tats AS t
     WHERE t.ctid = ANY (ARRAY(SELECT x.ctid FROM rate_tats AS x
                                WHERE NOT EXISTS (SELECT 1 FROM rate_limits AS l WHERE l.scope = x.scope AND l.key = x.key)
                                LIMIT 10000));
    GET DIAGNOSTICS v_k = ROW_COUNT;
    v_n := v_n + v_k;
    IF v_n > 0 THEN
        action := 'rate_prune'; target := 'rate_tats'; rows := v_n;
        RETURN NEXT;
    END IF;
END;
$$;
