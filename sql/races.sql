-- Lost races on moved rows: the one retry policy of every statement that can lock a row another
-- transaction moved between jobs_live and a history tree (history.sql's header, ROW MOVEMENT, says when
-- PostgreSQL raises 40001 for it and which statements handle it), and the row-by-row lock a set-based
-- lock falls back to after such a race. Every file above may call these; they call nothing of pgjobs.

-- The one policy for a lost race on a moved row (history.sql, ROW MOVEMENT), called from the EXCEPTION WHEN
-- serialization_failure block of every statement that handles it, inside a FOR i IN 1..20 loop: returns
-- when the statement may run again in a new snapshot; raises the 40001 again (same SQLSTATE and message)
-- on the 20th try, or outside READ COMMITTED, where a new statement keeps the old snapshot and the
-- caller must retry the transaction, as it always had to.
CREATE OR REPLACE FUNCTION pgjobs._lost_race(try int, message text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    IF try >= 20 OR current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION USING ERRCODE = 'serialization_failure', MESSAGE = message;
    END IF;
END;
$$;

-- The same for a lease-token call: true when the token still holds the job (the 40001 had another
-- cause: run the statement again); false when the row moved to history while the call waited on it
-- (the attempt ended: the token no longer holds the job, the call answers as for a stale token).
CREATE OR REPLACE FUNCTION pgjobs._lost_race_on_token(try int, message text, job_id bigint, token uuid)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    PERFORM _lost_race(try, message);
    RETURN EXISTS (SELECT 1 FROM jobs AS h
                    WHERE h.id = job_id AND h.lease_token = token
                      AND h.state::text = 'active' AND h.state = ANY ('{waiting,scheduled,pending,active}'::job_state[]));
END;
$$;

-- Jobs locked one at a time in id order, each lock in its own subtransaction: the fallback of a
-- set-based lock that lost a race (history.sql, ROW MOVEMENT). A statement that waits on several rows fails as
-- a whole when any of them moves to history while it waits, and while workers keep ending those rows (a
-- fan-in onto 200 running parents, cancel_batch of a batch whose members keep completing) every new try
-- can fail on the next one. Here each lock taken stays taken, so the call gets through; the id order is
-- the one every locker of several jobs keeps (no deadlock). Returns the jobs that exist. (A
-- subtransaction per row: only after a lost race.)
CREATE OR REPLACE FUNCTION pgjobs._lock_jobs_in_turn(ids bigint[])
RETURNS TABLE (id bigint, state pgjobs.job_state)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_id    bigint;
    v_state job_state;
BEGIN
    FOR v_id IN SELECT DISTINCT u.x FROM unnest(ids) AS u(x) WHERE u.x IS NOT NULL ORDER BY 1 LOOP
        FOR i IN 1..20 LOOP
            BEGIN
                SELECT j.state INTO v_state FROM jobs AS j WHERE j.id = v_id FOR NO KEY UPDATE;
                IF FOUND THEN
                    id := v_id;
                    state := v_state;
                    RETURN NEXT;
                END IF;
                EXIT;
            EXCEPTION WHEN serialization_failure THEN
                PERFORM _lost_race(i, SQLERRM);  -- (sql/history.sql, ROW MOVEMENT)
            END;
        END LOOP;
    END LOOP;
END;
$$;
