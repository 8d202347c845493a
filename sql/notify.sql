-- Notifications. pg_notify is transactional: listeners hear nothing until commit, so a job is
-- always persisted before anyone is told about it. NOTIFY is not durable either: every
-- consumer heals a missed notification by polling, so these are latency hints, never truth.
--
-- Cost: a transaction that notified takes a cluster-wide lock at commit. Hence at most one
-- wake per queue per call and status events coalesced into arrays.

-- pgjobs_wake: payload is the queue name; sent whenever a job becomes claimable now.
CREATE OR REPLACE FUNCTION pgjobs._wake(queues text[])
RETURNS void
LANGUAGE sql
SET search_path = pgjobs, pg_catalog
AS $$
    SELECT pg_notify('pgjobs_wake', q) FROM (SELECT DISTINCT unnest(queues) AS q) AS s WHERE q IS NOT NULL;
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
SET search_path = pgjobs, pg_catalog
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
