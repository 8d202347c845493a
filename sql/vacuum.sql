-- Vacuum from the workers: the hot tables kept in shape when autovacuum cannot be relied on.
--
-- WHY. Each job leaves about two dead versions in jobs_live (its claim, then its move to history), and the
-- claim, lease and group indexes keep an entry for each until VACUUM removes them. Autovacuum does that,
-- where it runs: but a server may run with autovacuum = off (this project's own CI server does), or with a
-- table's autovacuum_enabled = false, or with autovacuum so far behind (its cost limits, one worker per
-- table, 1 minute naptime) that the dead versions pile up for minutes. Measured (bench/soak.py, 10 minutes
-- at 3,500 jobs/s offered, autovacuum off): jobs_live grew without bound, 3.3 million dead tuples and 725 MB
-- at the end, claims walking ever more dead entries.
--
-- WHAT. vacuum_due() lists the pgjobs tables that VACUUM should visit now: at least 1,000 dead tuples and a
-- tenth of the live ones (autovacuum's own rule, with its defaults scaled down for small hot tables), not
-- vacuumed (by anyone) in the last 10 seconds, when autovacuum will not do it: autovacuum off, the table's
-- autovacuum_enabled off, or its dead tuples 10 times past autovacuum's threshold (autovacuum is behind).
-- The workers (pgjobs/runtime/vacuum.py: one call per heartbeat, VACUUM (SKIP_LOCKED, ANALYZE) of each
-- table on an autocommit connection of its own, since VACUUM cannot run in a function or a transaction;
-- ANALYZE because autoanalyze does not run either: pgjobs/client/vacuum.py) and `pgjobs maintain` call it. Only tables the calling login role may vacuum are listed (PostgreSQL 15/16: the owner,
-- or a superuser; 17+: also the MAINTAIN privilege): a worker that logs in as a role without that lists
-- nothing, and the owner (a cron of `pgjobs maintain`, or autovacuum) must do it.
--
-- A held snapshot keeps the dead versions newer than it whatever VACUUM does (only TRUNCATE of a whole
-- partition gets around it: history.sql, stream.sql); vacuuming again while the oldest snapshot has not
-- moved would re-read the table for nothing, so the caller passes the oldest xmin it vacuumed under and a
-- table is listed again only once the horizon (the oldest backend_xmin in this database) moved past it.

-- The oldest snapshot in this database (what VACUUM can remove is older than it), as text: the xmin of the
-- oldest backend here, or '' when no backend holds one.
CREATE OR REPLACE FUNCTION pgjobs._vacuum_horizon()
RETURNS text
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
    SELECT coalesce((SELECT a.backend_xmin::text FROM pg_stat_activity AS a
                      WHERE a.datid = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
                        AND a.backend_xmin IS NOT NULL AND a.pid <> pg_backend_pid()
                      ORDER BY age(a.backend_xmin) DESC
                      LIMIT 1), '');
$$;

CREATE OR REPLACE FUNCTION pgjobs.vacuum_due(vacuumed_under text DEFAULT NULL)
RETURNS TABLE (relation text, dead_tuples bigint, live_tuples bigint, horizon text)  -- relation: a table of schema pgjobs
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_horizon text := _vacuum_horizon();
    v_auto    boolean := current_setting('autovacuum') = 'on';
    v_base    numeric := current_setting('autovacuum_vacuum_threshold')::numeric;
    v_scale   numeric := current_setting('autovacuum_vacuum_scale_factor')::numeric;
BEGIN
    -- Nothing removable has appeared since the caller's last pass: the same oldest snapshot still holds it.
    IF vacuumed_under IS NOT NULL AND vacuumed_under <> '' AND vacuumed_under = v_horizon THEN
        RETURN;
    END IF;
    -- (session_user: the function runs as its owner; VACUUM will run as the caller.)
    RETURN QUERY
    SELECT c.relname::text, s.n_dead_tup, s.n_live_tup, v_horizon
      FROM pg_class AS c
      JOIN pg_namespace AS n ON n.oid = c.relnamespace AND n.nspname = 'pgjobs'
      JOIN pg_stat_all_tables AS s ON s.relid = c.oid
     WHERE c.relkind = 'r'
       AND s.n_dead_tup >= 1000 + 0.1 * s.n_live_tup
       AND coalesce(greatest(s.last_vacuum, s.last_autovacuum), '-infinity') < now() - interval '10 seconds'
       AND (NOT v_auto
            OR coalesce(c.reloptions, '{}') && ARRAY['autovacuum_enabled=false', 'autovacuum_enabled=off']
            OR s.n_dead_tup > 10 * (v_base + v_scale * greatest(c.reltuples, 0)))
       AND (pg_has_role(session_user, c.relowner, 'USAGE')
            OR (SELECT r.rolsuper FROM pg_roles AS r WHERE r.rolname = session_user)
            -- (CASE: the privilege name is unknown before 17 and would raise)
            OR CASE WHEN current_setting('server_version_num')::int >= 170000
                    THEN has_table_privilege(session_user, c.oid, 'MAINTAIN') ELSE false END)
     ORDER BY s.n_dead_tup DESC;
END;
$$;
