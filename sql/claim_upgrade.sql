-- What the previous release's claim calls while an upgrade commits under it. A worker's call of
-- _claim_once that began before `pgjobs migrate` installed sql/ runs on with the body it began with,
-- and its later statements look up the helpers that body names; a helper the install dropped would end
-- that call with 42883 (tests/ops/test_upgrade_under_load.py). These keep the previous release's
-- signatures (so the install replaces them in place) and send that body down its scan from the front, a
-- claim that is correct without any floor. Nothing of this release calls them.

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
    why := 'new';
    from_front := true;
    epoch := 0;
    rq := queues;
    rp := array_fill(-32768::smallint, ARRAY[v_n]);
    rt := array_fill('-infinity'::timestamptz, ARRAY[v_n]);
    ri := array_fill(0::bigint, ARRAY[v_n]);
    rh := array_fill(32768, ARRAY[v_n]);
    lf := rt;
END;
$$;

CREATE OR REPLACE FUNCTION pgjobs._claim_floor_save(key text, queues text[], from_front boolean, why text, epoch bigint,
                                                    t0 timestamptz, pq text[], pp smallint[], pt timestamptz[],
                                                    pi bigint[], exhausted boolean, no_expired boolean, wasted bigint)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN true;
END;
$$;

CREATE OR REPLACE FUNCTION pgjobs._claim_lease_due(floor text)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN true;
END;
$$;

CREATE OR REPLACE FUNCTION pgjobs._claim_floor_visits()
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    RETURN 0;
END;
$$;

-- (the previous release's _claim_routed takes its plain queues here; they are told by _claim_take)
CREATE OR REPLACE FUNCTION pgjobs._claim_plain(worker text, queues text[], max_jobs int, lease interval,
                                               kind_limits jsonb)
RETURNS pgjobs.claimed_job[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_plan claim_plan := _claim_plan(queues, max_jobs, kind_limits);
BEGIN
    IF v_plan.seq IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT array_agg(c) FROM _claim_take(worker, queues, max_jobs, lease, kind_limits, '{}', v_plan) AS c);
END;
$$;
