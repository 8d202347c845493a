-- Job graphs: dependencies between jobs and batches, and their propagation.
-- Interim: dependency graphs and batches are not accepted yet (the workflows work adds them),
-- so no job has dependents and propagation has nothing to do.

CREATE OR REPLACE FUNCTION pgjobs._enqueue_graph(jobs jsonb, as_batch boolean, parent bigint)
RETURNS TABLE (ref text, id bigint, created boolean, batch_id bigint)
LANGUAGE plpgsql
SET search_path = pgjobs, pg_catalog
AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'PJ002', MESSAGE = 'depends_on and as_batch are not supported yet';
END;
$$;

CREATE OR REPLACE FUNCTION pgjobs._propagate(ids bigint[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pgjobs, pg_catalog
AS $$
BEGIN
    RETURN;
END;
$$;

CREATE OR REPLACE FUNCTION pgjobs._add_continuations(parent bigint, specs jsonb)
RETURNS void
LANGUAGE plpgsql
SET search_path = pgjobs, pg_catalog
AS $$
BEGIN
    PERFORM _check_specs(specs, 'continuations');
    PERFORM * FROM enqueue_many(specs);
END;
$$;

-- A retried job reopens what its settlement closed (batch counters, children).
CREATE OR REPLACE FUNCTION pgjobs._reopen(ids bigint[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pgjobs, pg_catalog
AS $$
BEGIN
    RETURN;
END;
$$;

-- Purges settled batches whose members are all past their age; returns members removed.
CREATE OR REPLACE FUNCTION pgjobs._purge_batches(succeeded_before interval, failed_before interval)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pgjobs, pg_catalog
AS $$
BEGIN
    RETURN 0;
END;
$$;
