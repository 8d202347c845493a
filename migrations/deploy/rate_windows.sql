-- Deploy pgjobs:rate_windows to pg
-- requires: fair_ring
-- Rate limits as an exact sliding window (../../sql/rate_limits.sql, ../../docs/design/claim.md "Where flow
-- control sits"): a log of the starts of each limit, one row a token, in place of the theoretical arrival
-- times of GCRA. In place under load, and exact across the switch:
-- * every limit's advisory lock first (the claims' order: queue limits, then keys, each by name), so no claim
--   of a limit is between its check and its commit while the log is seeded;
-- * the log is seeded from each limit's TAT. Under GCRA the k-th newest start happened at or before
--   TAT - k T (each start moved TAT by at least T past itself), and before the seed is written (every claim
--   that took tokens committed before the locks were granted; now(), this transaction's start, comes before
--   its lock waits and is no bound). So rows at min(TAT - k T, the seed's time) are no earlier than the
--   starts they stand for: the window's check is as strict as the starts require (the first new start is
--   allowed at TAT - burst T, as GCRA would). Rows older than per and a minute before the seed's time are
--   left out: no window a claim checks reaches them (a claim whose transaction began before the seed, within
--   that minute, checks at its own earlier time);
-- * the two functions the old claim path calls to count and take tokens become wrappers of the window's, so
--   a claim between this commit and the install of ../../sql/ counts in the log (that install drops them
--   once the calls running at its commit have ended);
-- * rate_tats stays, holding one row a limit whose TAT is a window ahead of the last statement here: a call
--   that began in an old body before this commit (PL/pgSQL keeps a body it compiled through a lock wait: a
--   claim queued on a limit's lock runs the old _rate_state after it) reads it and finds no token. Dropped
--   here, it would fail that claim with 42P01, an error a worker does not retry.
BEGIN;
-- A limit's starts: seq is consecutive per limit (written under the limit's lock), started_at never
-- decreases along it. Insert-only on the claim path; maintenance deletes the rows below the newest n.
CREATE TABLE pgjobs.rate_starts (
    scope      text NOT NULL,
    key        text NOT NULL,
    seq        bigint NOT NULL,
    started_at timestamptz NOT NULL,
    PRIMARY KEY (scope, key, seq)
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

SELECT count(pg_advisory_xact_lock(hashtextextended('pgjobs.rate|' || l.scope || '|' || l.key, 0)))
  FROM (SELECT l.scope, l.key FROM pgjobs.rate_limits AS l
         ORDER BY l.scope = 'key', l.key) AS l;

-- (one time for every row: the times must not decrease along seq)
WITH c AS MATERIALIZED (SELECT clock_timestamp() AS at)
INSERT INTO pgjobs.rate_starts (scope, key, seq, started_at)
SELECT l.scope, l.key, l.max_starts + l.burst - g.k + 1,
       least(t.tat - g.k * (l.per / l.max_starts), c.at)
  FROM c
 CROSS JOIN pgjobs.rate_limits AS l
 CROSS JOIN LATERAL (SELECT max(x.tat) AS tat FROM pgjobs.rate_tats AS x
                      WHERE x.scope = l.scope AND x.key = l.key) AS t
 CROSS JOIN LATERAL generate_series(1, l.max_starts + l.burst) AS g(k)
 WHERE t.tat - g.k * (l.per / l.max_starts) > c.at - l.per - interval '1 minute';

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

CREATE OR REPLACE FUNCTION pgjobs._rate_state(scope text, key text, at timestamptz,
                                              OUT tokens int, OUT tat timestamptz, OUT t interval, OUT burst int)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    w     record;
    v_max int;
BEGIN
    SELECT l.max_starts, l.burst INTO v_max, burst
      FROM rate_limits AS l WHERE l.scope = _rate_state.scope AND l.key = _rate_state.key;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    w := _rate_window(scope, key, at, v_max + burst);
    t := w.per / v_max;
    tokens := w.tokens;
    tat := CASE WHEN w.tokens > 0 THEN at ELSE w.next_at END + burst * t;   -- (so TAT - burst T is the next token)
END;
$$;

CREATE OR REPLACE FUNCTION pgjobs._take_tokens(scope text, key text, n int, at timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    PERFORM _rate_take(scope, key, n, at);
    RETURN NULL;
END;
$$;

-- Last, so that the commit follows at once: a TAT a window ahead of it.
DELETE FROM pgjobs.rate_tats;
INSERT INTO pgjobs.rate_tats (scope, key, tat, taken)
SELECT l.scope, l.key, clock_timestamp() + l.per + l.burst * (l.per / l.max_starts), 0 FROM pgjobs.rate_limits AS l;
COMMIT;
