-- Notifications. pg_notify is transactional: listeners hear nothing until commit, so a job is
-- always persisted before anyone is told about it. NOTIFY is not durable either: every
-- consumer heals a missed notification by polling, so these are latency hints, never truth.
--
-- Cost: a transaction that notified takes a cluster-wide lock at commit. Hence at most one
-- wake per queue per call and status events coalesced into arrays.

-- pgjobs_wake: payload is the queue name; sent whenever a job becomes claimable now.
-- (PL/pgSQL: a SQL function that cannot be inlined is parsed and planned again on every call.)
CREATE OR REPLACE FUNCTION pgjobs._wake(queues text[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    IF cardinality(queues) = 1 THEN
        IF queues[1] IS NOT NULL THEN
            PERFORM pg_notify('pgjobs_wake', queues[1]);
        END IF;
    ELSIF cardinality(queues) > 1 THEN
        PERFORM pg_notify('pgjobs_wake', q) FROM (SELECT DISTINCT unnest(queues) AS q) AS s WHERE q IS NOT NULL;
    END IF;
END;
$$;

-- pgjobs_status: one small JSON object per transition ({"id","state","queue","kind","attempt",
-- "batch_id"}); many transitions of one call go out as JSON arrays cut by size (about 6,000
-- bytes each), safely below NOTIFY's 8000-byte payload limit whatever the kind and queue
-- names: pg_notify raises on a longer payload, which would fail the transition itself, so an
-- event with an outsized name carries it cut to 200 characters (subscribers re-read the job).
-- A queue's status_events setting filters: 'all', 'terminal' (only succeeded/failed/cancelled)
-- or 'none'.
CREATE OR REPLACE FUNCTION pgjobs._notify_status(events jsonb)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    IF events IS NULL OR jsonb_array_length(events) = 0 THEN
        RETURN;
    END IF;
    PERFORM pg_notify('pgjobs_status',
                      CASE WHEN count(*) = 1 THEN min(c.t)
                           ELSE '[' || string_agg(c.t, ', ' ORDER BY c.n) || ']' END)
       FROM (SELECT f.n, f.t, sum(octet_length(f.t) + 2) OVER (ORDER BY f.n) / 6000 AS chunk
               FROM (SELECT x.n,
                            CASE WHEN octet_length(x.e::text) <= 1000 THEN x.e::text
                                 ELSE (x.e || jsonb_build_object('kind', left(x.e ->> 'kind', 200),
                                                                 'queue', left(x.e ->> 'queue', 200)))::text
                            END AS t
                       FROM jsonb_array_elements(events) WITH ORDINALITY AS x(e, n)
                       LEFT JOIN queues AS q ON q.queue = x.e ->> 'queue'
                      WHERE q.status_events IS NULL OR q.status_events = 'all'
                         OR (q.status_events = 'terminal'
                             AND x.e ->> 'state' IN ('succeeded', 'failed', 'cancelled'))) AS f) AS c
      GROUP BY c.chunk;
END;
$$;

-- The hot paths' form of _notify_status: the same events, filter and payloads, from parallel
-- arrays (the columns a transition's RETURNING gives). Each event's JSON text is built by
-- concatenation, which costs a tenth of jsonb_build_object + jsonb_agg + re-reading the jsonb
-- array; it is byte for byte what jsonb::text prints for the same object (keys in jsonb's order,
-- shortest first), and an event over 1000 bytes has its names cut to 200 characters, as in
-- _notify_status. The status_events filter reads the queues table once, not once per event.
-- Arrays hold as many events as surely fit in 6,000 bytes (from the longest event), which
-- spares the per-event sort and window pass of cutting by running size.
CREATE OR REPLACE FUNCTION pgjobs._notify_status_rows(ids bigint[], states pgjobs.job_state[], queues text[],
                                                      kinds text[], attempts int[], batch_ids bigint[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_none     text[];
    v_terminal text[];
    v_events   text[];
    v_longest  int;
    v_mode     text;
BEGIN
    IF ids IS NULL OR cardinality(ids) = 0 THEN
        RETURN;
    ELSIF cardinality(ids) = 1 THEN
        -- One event (the single-job transitions): no set to build.
        SELECT q.status_events INTO v_mode FROM queues AS q WHERE q.queue = _notify_status_rows.queues[1];
        IF ids[1] IS NOT NULL
           AND (v_mode IS NULL OR v_mode = 'all'
                OR (v_mode = 'terminal' AND states[1] IN ('succeeded', 'failed', 'cancelled'))) THEN
            PERFORM pg_notify('pgjobs_status', _status_event(ids[1], states[1], _notify_status_rows.queues[1],
                                                             kinds[1], attempts[1], batch_ids[1]));
        END IF;
        RETURN;
    END IF;
    SELECT array_agg(q.queue) FILTER (WHERE q.status_events = 'none'),
           array_agg(q.queue) FILTER (WHERE q.status_events = 'terminal')
      INTO v_none, v_terminal
      FROM queues AS q
     WHERE q.status_events <> 'all' AND q.queue = ANY (_notify_status_rows.queues);
    -- A plain scan, filter and aggregate keep the events in the order given.
    SELECT array_agg(x.t), max(octet_length(x.t))
      INTO v_events, v_longest
      FROM (SELECT '{"id": ' || u.id || ', "kind": ' || to_json(u.kind)::text
                   || ', "queue": ' || to_json(u.queue)::text || ', "state": "' || u.state::text
                   || '", "attempt": ' || u.attempt || ', "batch_id": ' || coalesce(u.batch_id::text, 'null') || '}' AS t
              FROM unnest(ids, states, _notify_status_rows.queues, kinds, attempts, batch_ids)
                   AS u(id, state, queue, kind, attempt, batch_id)
             WHERE u.id IS NOT NULL
               AND (v_none IS NULL OR u.queue <> ALL (v_none))
               AND (v_terminal IS NULL OR u.queue <> ALL (v_terminal)
                    OR u.state IN ('succeeded', 'failed', 'cancelled'))
            OFFSET 0) AS x;
    IF v_longest > 1000 THEN
        -- Some event carries an outsized name (rare): those events get their names cut.
        SELECT array_agg(CASE WHEN octet_length(x.t) <= 1000 THEN x.t
                              ELSE '{"id": ' || x.id || ', "kind": ' || to_json(left(x.kind, 200))::text
                                   || ', "queue": ' || to_json(left(x.queue, 200))::text || x.rest END),
               max(CASE WHEN octet_length(x.t) <= 1000 THEN octet_length(x.t)
                        ELSE octet_length('{"id": ' || x.id || ', "kind": ' || to_json(left(x.kind, 200))::text
                                          || ', "queue": ' || to_json(left(x.queue, 200))::text || x.rest) END)
          INTO v_events, v_longest
          FROM (SELECT r.id, r.kind, r.queue, r.rest,
                       '{"id": ' || r.id || ', "kind": ' || to_json(r.kind)::text
                       || ', "queue": ' || to_json(r.queue)::text || r.rest AS t
                  FROM (SELECT u.id, u.kind, u.queue,
                               ', "state": "' || u.state::text || '", "attempt": ' || u.attempt
                               || ', "batch_id": ' || coalesce(u.batch_id::text, 'null') || '}' AS rest
                          FROM unnest(ids, states, _notify_status_rows.queues, kinds, attempts, batch_ids)
                               AS u(id, state, queue, kind, attempt, batch_id)
                         WHERE u.id IS NOT NULL
                           AND (v_none IS NULL OR u.queue <> ALL (v_none))
                           AND (v_terminal IS NULL OR u.queue <> ALL (v_terminal)
                                OR u.state IN ('succeeded', 'failed', 'cancelled'))
                        OFFSET 0) AS r
                OFFSET 0) AS x;
    END IF;
    PERFORM _notify_status_texts(v_events, v_longest);
END;
$$;

-- One event's text, for the single-job transitions (same bytes as _notify_status_rows builds).
CREATE OR REPLACE FUNCTION pgjobs._status_event(id bigint, state pgjobs.job_state, queue text, kind text,
                                                attempt int, batch_id bigint)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    v_rest text := ', "state": "' || state::text || '", "attempt": ' || attempt
                   || ', "batch_id": ' || coalesce(batch_id::text, 'null') || '}';
    v_t    text := '{"id": ' || id || ', "kind": ' || to_json(kind)::text || ', "queue": ' || to_json(queue)::text || v_rest;
BEGIN
    IF octet_length(v_t) <= 1000 THEN
        RETURN v_t;
    END IF;
    RETURN '{"id": ' || id || ', "kind": ' || to_json(left(kind, 200))::text
           || ', "queue": ' || to_json(left(queue, 200))::text || v_rest;
END;
$$;

-- Sends event texts on pgjobs_status: one event alone as an object, more as JSON arrays of as
-- many events as surely fit in 6,000 bytes given the longest (`longest`, in bytes), safely
-- below NOTIFY's 8000-byte payload limit.
CREATE OR REPLACE FUNCTION pgjobs._notify_status_texts(events text[], longest int)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    v_n   int := coalesce(cardinality(events), 0);
    v_per int := greatest(1, 6000 / (coalesce(longest, 6000) + 2));
BEGIN
    IF v_n = 0 THEN
        RETURN;
    ELSIF v_n = 1 THEN
        PERFORM pg_notify('pgjobs_status', events[1]);
    ELSIF v_n <= v_per THEN
        PERFORM pg_notify('pgjobs_status', '[' || array_to_string(events, ', ') || ']');
    ELSE
        PERFORM pg_notify('pgjobs_status',
                          CASE WHEN i = v_n THEN events[i]
                               ELSE '[' || array_to_string(events[i:i + v_per - 1], ', ') || ']' END)
           FROM generate_series(1, v_n, v_per) AS i;
    END IF;
END;
$$;
