-- Argument limits: one helper per kind of check, each raising PJ002 with a message that
-- names the argument and echoes its value (cut to 100 characters, so an 8,000-byte name does not make
-- an 8,000-byte error). The limits keep every value inside what PostgreSQL can store, index and notify
-- (btree rows of about 2,700 bytes, NOTIFY payloads under 8,000 bytes, timestamps up to year 294276):
--
--   names          kind, queue, worker: 1 to 1,000 bytes; schedule name: 1 to 200 bytes (the unique key
--                  of each of its runs, 'schedule:<name>@<time>', must stay within the key limit)
--   keys           unique_key, group_key: at most 1,000 bytes (kind + unique_key and queue + group_key
--                  stay far below the btree limit)
--   intervals      at most 100 years either way (leases, ages, backoffs)
--   timestamps     finite, in years 1 to 9999 as ISO 8601 writes them (run_at, retry_at, next_run_at, ...):
--                  '9999-12-31' still means "far future"; 'infinity' and year 294276 are refused
--   arrays         one-dimensional, at most 100,000 elements
--   counts         max_jobs 1 to 10,000; max_rows up to 100,000
--
-- Hot paths do not call these for ordinary arguments: they test the same limits inline (the constants
-- below, each marked "limits: checks.sql") and call the helper only to word the error.

-- A value as an error message shows it: quoted, cut to 100 characters, with its size when cut.
CREATE OR REPLACE FUNCTION pgjobs._shown(value text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF value IS NULL THEN
        RETURN 'NULL';
    ELSIF length(value) > 100 THEN
        RETURN format('%s... (%s bytes)', quote_literal(left(value, 100)), octet_length(value));
    END IF;
    RETURN quote_literal(value);
END;
$$;

-- A name or key: non-empty (unless `nullable`, which also lets NULL through) and at most max_bytes.
CREATE OR REPLACE FUNCTION pgjobs._check_name(label text, value text, max_bytes int DEFAULT 1000,
                                              nullable boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF value IS NULL OR value = '' THEN
        IF NOT nullable THEN
            RAISE EXCEPTION USING ERRCODE = 'PJ002',
                MESSAGE = format('%s must be a non-empty string, got %s', label, _shown(value));
        END IF;
    ELSIF octet_length(value) > max_bytes THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('%s must be at most %s bytes, got %s', label, max_bytes, _shown(value));
    END IF;
END;
$$;

-- An interval within 100 years either way; `positive`: > 0, `non_negative`: >= 0.
CREATE OR REPLACE FUNCTION pgjobs._check_interval(label text, value interval, positive boolean DEFAULT false,
                                                  non_negative boolean DEFAULT false, nullable boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF value IS NULL THEN
        IF NOT nullable THEN
            RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = format('%s must not be NULL', label);
        END IF;
    ELSIF positive AND value <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('%s must be a positive interval, got %s', label, value);
    ELSIF non_negative AND value < interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = format('%s must not be negative, got %s', label, value);
    -- Measured in seconds, where a year is 365.25 days: compared as intervals, '100 years' is 1,200
    -- months of 30 days (36,000 days), so '36500 days' (under 100 calendar years) would be refused.
    ELSIF abs(extract(epoch FROM value)) > extract(epoch FROM interval '100 years') THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('%s must be at most 100 years, got %s', label, value);
    END IF;
END;
$$;

-- A point in time: finite, in years 1 to 9999 (NULL passes unless not `nullable`).
CREATE OR REPLACE FUNCTION pgjobs._check_time(label text, value timestamptz, nullable boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF value IS NULL THEN
        IF NOT nullable THEN
            RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = format('%s must not be NULL', label);
        END IF;
    ELSIF NOT (value >= '0001-01-01 00:00:00+00' AND value < '10000-01-01 00:00:00+00') THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('%s must be a finite time in years 1 to 9999, got %s', label, value);
    END IF;
END;
$$;

-- The same test as an expression, for callers that check many values in one statement.
CREATE OR REPLACE FUNCTION pgjobs._time_ok(value timestamptz)
RETURNS boolean
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT value IS NULL OR (value >= '0001-01-01 00:00:00+00' AND value < '10000-01-01 00:00:00+00');
$$;

-- An array: one-dimensional and at most 100,000 elements (NULL passes when `nullable`).
CREATE OR REPLACE FUNCTION pgjobs._check_array(label text, value anyarray, nullable boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF value IS NULL THEN
        IF NOT nullable THEN
            RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = format('%s must not be NULL', label);
        END IF;
    ELSIF array_ndims(value) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('%s must be a one-dimensional array, got %s dimensions: %s', label, array_ndims(value),
                             _shown(value::text));
    ELSIF cardinality(value) > 100000 THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('%s must have at most 100000 elements, got %s', label, cardinality(value));
    END IF;
END;
$$;

-- A count within [lo, hi].
CREATE OR REPLACE FUNCTION pgjobs._check_count(label text, value bigint, lo bigint, hi bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF value IS NULL OR value < lo OR value > hi THEN
        RAISE EXCEPTION USING ERRCODE = 'PJ002',
            MESSAGE = format('%s must be between %s and %s, got %s', label, lo, hi, coalesce(value::text, 'NULL'));
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION pgjobs._not_found(what text, id bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'PJ003', MESSAGE = format('%s %s not found', what, coalesce(id::text, 'NULL'));
END;
$$;

-- claim()'s arguments (claim.sql), for the calls that fail its inline tests: each bad one named.
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
    -- (the limits: above)
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

