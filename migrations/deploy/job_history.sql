-- Deploy pgjobs:job_history to pg
-- requires: event_log
-- Live jobs apart from finished ones, finished history in time slices (functions and design notes in
-- ../../sql/history.sql):
--
--   pgjobs.jobs                      PARTITION BY LIST (state): every job, same columns, still updatable
--   |- pgjobs.jobs_live              waiting, scheduled, pending, active: the table that was pgjobs.jobs,
--   |                                attached in place (no rewrite: its rows, jobs_pkey, the claim indexes
--   |                                and its autovacuum settings stay as they were; the identity moves to
--   |                                the parent, with the same sequence name and the next value)
--   |- pgjobs.jobs_succeeded         succeeded, PARTITION BY RANGE (completed_at)
--   |  |- jobs_succeeded_upto        MINVALUE .. the start of the slice this change ran in (the history
--   |  |                             that existed before it)
--   |  |- jobs_succeeded_<from>      one time slice each (history_settings.slice, 1 day), made ahead
--   |  '- jobs_succeeded_default     anything else (NULL completed_at, beyond the slices made): an
--   |                                insert never fails
--   '- pgjobs.jobs_failed            failed, cancelled: the same shape (purge's failed_before covers both)
--
-- A terminal UPDATE moves the row out of jobs_live (PostgreSQL deletes and inserts it), so jobs_live
-- holds only live rows and its indexes stay small; history is insert-only and goes by whole slices.
--
-- What a partitioned table cannot have, and what replaces it:
-- * A primary key on id alone (a unique index must include the partition key): jobs_live keeps
--   jobs_pkey; each history slice has an index on id (children of jobs_succeeded_id_idx and
--   jobs_failed_id_idx). Ids stay unique through the identity sequence, which hands each out once.
-- * The unique index jobs_unique_key_idx (kind, unique_key): replaced by pgjobs.job_keys, one row per
--   key held, PRIMARY KEY (kind, unique_key): its index still decides enqueue races. A key of a
--   unique_live_only job is released when the job ends (trigger jobs_release_key on the history trees),
--   every key when its job is deleted or purged.
-- * Foreign keys to jobs(id) (edges.child_id, edges.parent_job_id, continuation_holds.job_id and
--   sibling_id, all ON DELETE CASCADE): dropped; the functions that delete jobs (delete, purge,
--   delete_batch, retention) delete those rows themselves (_forget_jobs).
BEGIN;

-- Nothing may write to jobs while it is converted (workers wait, then carry on against the new layout), nor
-- draw an id: the identity moves from the old table to the new parent (same sequence name, next value).
-- The locks are taken together, and given up together after 100 ms: enqueue_many draws its ids before it
-- inserts (holding the sequence, wanting the table) and enqueue the other way round, so waiting for one lock
-- while holding another could deadlock with a producer or a worker. Up to 2 minutes of tries.
CREATE TEMPORARY TABLE job_history_ids ON COMMIT DROP AS SELECT 0::bigint AS next_id;
DO $$
DECLARE
    v_timeout text := pg_catalog.current_setting('lock_timeout');
BEGIN
    FOR i IN 1..1200 LOOP
        BEGIN
            PERFORM pg_catalog.set_config('lock_timeout', '100ms', true);
            -- Every table this change alters, at once: a claim reads queues and then jobs, a completion
            -- writes jobs and then reads queues and edges; waiting for one of them while holding another
            -- deadlocked with those (seen in tests/ops/test_migrations.py under load).
            LOCK TABLE pgjobs.queues, pgjobs.jobs, pgjobs.edges, pgjobs.continuation_holds IN ACCESS EXCLUSIVE MODE;
            ALTER SEQUENCE pgjobs.jobs_id_seq NO CYCLE;   -- (a no-op that locks out nextval)
            PERFORM pg_catalog.set_config('lock_timeout', v_timeout, true);
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_catalog.set_config('lock_timeout', v_timeout, true);
            IF i = 1200 THEN
                RAISE;
            END IF;
            PERFORM pg_catalog.pg_sleep(0.01 + pg_catalog.random() * 0.09);
        END;
    END LOOP;
END;
$$;
UPDATE job_history_ids SET next_id = (SELECT CASE WHEN s.is_called THEN s.last_value + 1 ELSE s.last_value END
                                         FROM pgjobs.jobs_id_seq AS s);
ALTER TABLE pgjobs.jobs ALTER COLUMN id DROP IDENTITY;

CREATE TABLE pgjobs.history_settings (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    slice     interval NOT NULL DEFAULT '1 day',   -- the time span of one history partition
    premake   int NOT NULL DEFAULT 3,              -- how many slices exist ahead of the current one
    CONSTRAINT history_settings_valid CHECK (slice >= interval '1 minute' AND premake BETWEEN 1 AND 100)
);
INSERT INTO pgjobs.history_settings DEFAULT VALUES;

-- The history slices: which partition covers which completion times (lower inclusive, upper exclusive;
-- lower NULL: from MINVALUE).
CREATE TABLE pgjobs.history_partitions (
    name       text PRIMARY KEY,
    tree       text NOT NULL CHECK (tree IN ('succeeded', 'failed')),
    lower      timestamptz,
    upper      timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    checked_at    timestamptz,   -- queue retention: when the slice's queues were last read
    next_check_at timestamptz    -- and when one of them will next pass its retention
);
CREATE INDEX history_partitions_upper_idx ON pgjobs.history_partitions (tree, upper);

-- Per-queue retention, applied by maintenance (NULL: keep until purge).
ALTER TABLE pgjobs.queues ADD COLUMN retention interval;
ALTER TABLE pgjobs.queues ADD CONSTRAINT queues_retention CHECK (retention IS NULL OR retention >= interval '0');

-- The unique keys, moved out of the jobs index.
CREATE TABLE pgjobs.job_keys (
    kind       text NOT NULL,
    unique_key text NOT NULL,
    job_id     bigint NOT NULL,
    PRIMARY KEY (kind, unique_key)
);
CREATE INDEX job_keys_job_idx ON pgjobs.job_keys (job_id);
INSERT INTO pgjobs.job_keys (kind, unique_key, job_id)
SELECT j.kind, j.unique_key, j.id FROM pgjobs.jobs AS j
 WHERE j.unique_key IS NOT NULL
   AND (NOT j.unique_live_only OR j.state OPERATOR(pg_catalog.=) ANY ('{waiting,scheduled,pending,active}'));

ALTER TABLE pgjobs.edges DROP CONSTRAINT edges_child_id_fkey, DROP CONSTRAINT edges_parent_job_id_fkey;
ALTER TABLE pgjobs.continuation_holds DROP CONSTRAINT continuation_holds_job_id_fkey,
                                      DROP CONSTRAINT continuation_holds_sibling_id_fkey;
DROP INDEX pgjobs.jobs_unique_key_idx;

-- The old table becomes the live partition, in place.
ALTER TABLE pgjobs.jobs RENAME TO jobs_live;
CREATE TABLE pgjobs.jobs (
    -- BY DEFAULT (not ALWAYS): enqueue_many reserves ids with nextval() so that
    -- dependencies inside one call can point at jobs not inserted yet.
    id               bigint GENERATED BY DEFAULT AS IDENTITY,
    kind             text NOT NULL,
    queue            text NOT NULL DEFAULT 'default',
    payload          jsonb NOT NULL DEFAULT '{}',
    meta             jsonb NOT NULL DEFAULT '{}',
    state            pgjobs.job_state NOT NULL DEFAULT 'pending',
    priority         smallint NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    attempt          int NOT NULL DEFAULT 0,
    max_attempts     int NOT NULL DEFAULT 20,
    lease_token      uuid,
    leased_by        text,
    lease_expires_at timestamptz,
    first_started_at timestamptz,
    completed_at     timestamptz,
    last_error       text,
    errors           jsonb NOT NULL DEFAULT '[]',
    checkpoint       jsonb,
    progress         jsonb,
    result           jsonb,
    unique_key       text,
    unique_live_only boolean NOT NULL DEFAULT false,
    group_key        text,
    batch_id         bigint,
    remaining_deps   int NOT NULL DEFAULT 0,
    failed_deps      int NOT NULL DEFAULT 0,
    schedule_name    text,
    cancel_requested boolean NOT NULL DEFAULT false,
    has_dependents   boolean NOT NULL DEFAULT false,
    CONSTRAINT jobs_valid CHECK (kind <> '' AND queue <> '' AND max_attempts >= 1
                                 AND (state OPERATOR(pg_catalog.<>) 'active' OR lease_token IS NOT NULL))
) PARTITION BY LIST (state);

SELECT pg_catalog.setval('pgjobs.jobs_id_seq', i.next_id, false) FROM job_history_ids AS i;

CREATE TABLE pgjobs.jobs_succeeded PARTITION OF pgjobs.jobs FOR VALUES IN ('succeeded')
    PARTITION BY RANGE (completed_at);
CREATE TABLE pgjobs.jobs_failed PARTITION OF pgjobs.jobs FOR VALUES IN ('failed', 'cancelled')
    PARTITION BY RANGE (completed_at);
CREATE INDEX jobs_succeeded_id_idx ON pgjobs.jobs_succeeded (id);
CREATE INDEX jobs_failed_id_idx ON pgjobs.jobs_failed (id);
CREATE INDEX jobs_succeeded_batch_idx ON pgjobs.jobs_succeeded (batch_id) WHERE batch_id IS NOT NULL;
CREATE INDEX jobs_failed_batch_idx ON pgjobs.jobs_failed (batch_id) WHERE batch_id IS NOT NULL;
CREATE TABLE pgjobs.jobs_succeeded_default PARTITION OF pgjobs.jobs_succeeded DEFAULT;
CREATE TABLE pgjobs.jobs_failed_default PARTITION OF pgjobs.jobs_failed DEFAULT;

-- The slices: the history so far (up to the current slice), the current one and those ahead.
DO $$
DECLARE
    v_slice interval := (SELECT s.slice FROM pgjobs.history_settings AS s);
    v_ahead int := (SELECT s.premake FROM pgjobs.history_settings AS s);
    v_start timestamptz := pg_catalog.date_bin(v_slice, pg_catalog.now(), '2000-01-01 00:00:00+00');
    v_tree text;
    v_name text;
BEGIN
    FOREACH v_tree IN ARRAY ARRAY['succeeded', 'failed'] LOOP
        v_name := 'jobs_' || v_tree || '_upto';
        EXECUTE pg_catalog.format('CREATE TABLE pgjobs.%I PARTITION OF pgjobs.%I FOR VALUES FROM (MINVALUE) TO (%L)',
                                  v_name, 'jobs_' || v_tree, v_start);
        INSERT INTO pgjobs.history_partitions (name, tree, lower, upper) VALUES (v_name, v_tree, NULL, v_start);
        FOR i IN 0..v_ahead LOOP
            v_name := 'jobs_' || v_tree || '_'
                      || pg_catalog.to_char((v_start + i * v_slice) AT TIME ZONE 'UTC', 'YYYYMMDD"t"HH24MI');
            EXECUTE pg_catalog.format('CREATE TABLE pgjobs.%I PARTITION OF pgjobs.%I FOR VALUES FROM (%L) TO (%L)',
                                      v_name, 'jobs_' || v_tree, v_start + i * v_slice, v_start + (i + 1) * v_slice);
            INSERT INTO pgjobs.history_partitions (name, tree, lower, upper)
            VALUES (v_name, v_tree, v_start + i * v_slice, v_start + (i + 1) * v_slice);
        END LOOP;
    END LOOP;
END;
$$;

-- The finished rows move to their history slice; the live ones stay where they are.
WITH moved AS (
    DELETE FROM pgjobs.jobs_live AS j
     WHERE j.state OPERATOR(pg_catalog.=) ANY ('{succeeded,failed,cancelled}')
    RETURNING j.*)
INSERT INTO pgjobs.jobs SELECT * FROM moved;
ALTER TABLE pgjobs.jobs ATTACH PARTITION pgjobs.jobs_live FOR VALUES IN ('waiting', 'scheduled', 'pending', 'active');
-- jobs_batch_idx stays on jobs_live; history slices have their own (above).

-- The trigger that releases unique_live_only keys (jobs_release_key) is created with its function by
-- ../../sql/history.sql: the migrator re-creates every routine, and a trigger goes with its function.

-- History is insert-only (until retention drops whole slices): analyze it now and then, no more.
ALTER TABLE pgjobs.jobs_succeeded_default SET (autovacuum_vacuum_insert_scale_factor = 0.2);
ALTER TABLE pgjobs.jobs_failed_default SET (autovacuum_vacuum_insert_scale_factor = 0.2);

COMMIT;
