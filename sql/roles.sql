-- pgjobs: the role matrix. Applied by the migrator LAST, after every other file of sql/, in
-- the same transaction that (re)created the functions: no function is ever visible with PUBLIC's EXECUTE.
--
-- Four NOLOGIN group roles, cluster-wide (roles are shared by every database of a server):
--   pgjobs_producer  enqueue, enqueue_many, enqueue_staged, enqueue_arrays, the status of jobs and batches
--   pgjobs_worker    claim, every lease-token call, parent results, heartbeat and reaping, and the
--                    scheduler's calls (workers run the scheduler: code-defined schedules are upserted
--                    and pruned, due ones materialised)
--   pgjobs_reader    status, stats, lists, events
--   pgjobs_admin     everything public (the three sets above included): cancel, retry, delete, purge,
--                    configure_queue, schedules, maintain_history
-- Internal functions (name starting with `_`) are granted to nobody: they run only inside the public
-- functions, which are SECURITY DEFINER (they run as the owner of the schema, so no role needs any table
-- privilege; a caller can change rows only through the checks of a public function).
--
-- A public function missing from the matrix below is granted to pgjobs_admin only (safe default); the
-- test suite (tests/sql/test_roles.py) fails on any public function it does not know, so a new function
-- gets classified on purpose.

DO $roles$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['pgjobs_producer', 'pgjobs_worker', 'pgjobs_reader', 'pgjobs_admin'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) r) THEN
            BEGIN
                EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                -- another database of this server is being migrated at the same time and created it first
                NULL;
            END;
        END IF;
    END LOOP;
END
$roles$;

DO $grants$
DECLARE
    f record;
    matrix constant jsonb := '{
        "enqueue": ["pgjobs_producer"],
        "enqueue_many": ["pgjobs_producer"],
        "enqueue_staged": ["pgjobs_producer"],
        "enqueue_arrays": ["pgjobs_producer"],
        "job_status": ["pgjobs_producer", "pgjobs_reader"],
        "batch_status": ["pgjobs_producer", "pgjobs_reader"],
        "status_snapshot": ["pgjobs_producer", "pgjobs_reader"],
        "explain": ["pgjobs_producer", "pgjobs_reader"],
        "signal": ["pgjobs_producer"],
        "durable_status": ["pgjobs_producer", "pgjobs_reader"],
        "list_rate_limits": ["pgjobs_reader", "pgjobs_worker"],

        "claim": ["pgjobs_worker"],
        "renew_lease": ["pgjobs_worker"],
        "renew_leases": ["pgjobs_worker"],
        "checkpoint": ["pgjobs_worker"],
        "progress": ["pgjobs_worker"],
        "complete": ["pgjobs_worker"],
        "complete_many": ["pgjobs_worker"],
        "fail": ["pgjobs_worker"],
        "dead_letter": ["pgjobs_worker"],
        "release": ["pgjobs_worker"],
        "ack_cancel": ["pgjobs_worker"],
        "add_to_batch": ["pgjobs_worker"],
        "record_step": ["pgjobs_worker"],
        "job_steps": ["pgjobs_worker"],
        "sleep_until": ["pgjobs_worker"],
        "await_signal": ["pgjobs_worker"],
        "parent_results": ["pgjobs_worker"],
        "parent_results_many": ["pgjobs_worker"],
        "worker_heartbeat": ["pgjobs_worker"],
        "vacuum_due": ["pgjobs_worker"],
        "reap_workers": ["pgjobs_worker"],
        "deregister_worker": ["pgjobs_worker"],
        "next_due_at": ["pgjobs_worker"],
        "next_due_within": ["pgjobs_worker"],
        "capped_queues": ["pgjobs_worker"],
        "retry_backoff": ["pgjobs_worker"],
        "upsert_schedule": ["pgjobs_worker"],
        "prune_code_schedules": ["pgjobs_worker"],
        "due_schedules": ["pgjobs_worker"],
        "materialize_schedule": ["pgjobs_worker"],
        "materialize_schedules": ["pgjobs_worker"],
        "next_schedule_at": ["pgjobs_worker"],

        "batch_graph": ["pgjobs_reader"],
        "stats": ["pgjobs_reader"],
        "list_jobs": ["pgjobs_reader"],
        "list_workers": ["pgjobs_reader"],
        "unhandled_kinds": ["pgjobs_worker", "pgjobs_reader"],
        "list_queues": ["pgjobs_reader"],
        "count_jobs": ["pgjobs_reader"],
        "list_schedules": ["pgjobs_reader"],
        "get_schedule": ["pgjobs_reader"],
        "read_events": ["pgjobs_reader"],
        "stream_bounds": ["pgjobs_reader"],
        "stream_head": ["pgjobs_reader"],

        "dashboard_jobs": ["pgjobs_reader"],
        "dashboard_count_jobs": ["pgjobs_reader"],
        "dashboard_state_counts": ["pgjobs_reader"],
        "dashboard_queues": ["pgjobs_reader"],
        "dashboard_throughput": ["pgjobs_reader"],
        "dashboard_groups": ["pgjobs_reader"],
        "fair_ring_groups": ["pgjobs_reader"],
        "dashboard_workers": ["pgjobs_reader"]
    }';
BEGIN
    EXECUTE 'REVOKE ALL ON SCHEMA pgjobs FROM PUBLIC';
    EXECUTE 'GRANT USAGE ON SCHEMA pgjobs TO pgjobs_producer, pgjobs_worker, pgjobs_reader, pgjobs_admin';
    -- no table or sequence privilege for anyone but the owner: the functions are the only way in
    EXECUTE 'REVOKE ALL ON ALL TABLES IN SCHEMA pgjobs FROM PUBLIC, pgjobs_producer, pgjobs_worker, '
            'pgjobs_reader, pgjobs_admin';
    EXECUTE 'REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgjobs FROM PUBLIC, pgjobs_producer, pgjobs_worker, '
            'pgjobs_reader, pgjobs_admin';
    -- Per-schema default privileges can only add to the global ones (PostgreSQL cannot revoke PUBLIC's
    -- EXECUTE for one schema); this file revoking it from every function, in the transaction that created
    -- them, is what closes the window.
    EXECUTE 'REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pgjobs FROM PUBLIC';
    FOR f IN
        SELECT p.oid::pg_catalog.regprocedure AS sig, p.proname::text AS name
          FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace OPERATOR(pg_catalog.=) 'pgjobs'::pg_catalog.regnamespace
           AND p.prokind OPERATOR(pg_catalog.=) 'f'
    LOOP
        IF pg_catalog.left(f.name, 1) OPERATOR(pg_catalog.=) '_' THEN
            -- internal: callable only from inside the public functions (as the owner); never SECURITY
            -- DEFINER themselves, and no role may call them (calling _propagate directly could settle a
            -- batch with a member still pending)
            EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM pgjobs_producer, pgjobs_worker, '
                                      'pgjobs_reader, pgjobs_admin', f.sig);
            CONTINUE;
        END IF;
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY DEFINER', f.sig);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO pgjobs_admin', f.sig);
        IF matrix ? f.name THEN
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', f.sig,
                (SELECT pg_catalog.string_agg(pg_catalog.quote_ident(g), ', ')
                   FROM pg_catalog.jsonb_array_elements_text(matrix -> f.name) AS g));
        END IF;
    END LOOP;
END
$grants$;
