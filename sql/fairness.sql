-- Controlled claim path: queues with fair selection or concurrency caps (configure_queue).
-- Interim version: honours max_active only (serialised per queue); fair selection and
-- max_active_per_group arrive with the fairness work.
CREATE OR REPLACE FUNCTION pgjobs._claim_controlled(worker text, queues text[], max_jobs int, lease interval,
                                                    kind_limits jsonb)
RETURNS pgjobs.claimed_job[]
LANGUAGE plpgsql
SET search_path = pgjobs, pg_catalog
AS $$
#variable_conflict use_column
DECLARE
    v_q      record;
    v_room   int;
    v_rows   claimed_job[] := '{}';
    v_got    claimed_job[];
BEGIN
    FOR v_q IN SELECT c.queue, c.max_active FROM queues AS c WHERE c.queue = ANY (queues) ORDER BY c.queue LOOP
        EXIT WHEN cardinality(v_rows) >= max_jobs;
        v_room := max_jobs - cardinality(v_rows);
        IF v_q.max_active IS NOT NULL THEN
            -- Serialise claimers of a capped queue so the count below cannot go stale.
            PERFORM pg_advisory_xact_lock(hashtextextended('pgjobs.claim:' || v_q.queue, 0));
            v_room := least(v_room, v_q.max_active - (SELECT count(*) FROM jobs AS j
                                                        WHERE j.state = 'active' AND j.queue = v_q.queue
                                                          AND j.lease_expires_at >= now())::int);
        END IF;
        CONTINUE WHEN v_room <= 0;
        v_got := _claim_plain(worker, ARRAY[v_q.queue], v_room, lease, kind_limits);
        v_rows := v_rows || coalesce(v_got, '{}');
    END LOOP;
    RETURN v_rows;
END;
$$;
