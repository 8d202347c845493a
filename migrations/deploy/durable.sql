-- Deploy pgjobs:durable to pg
-- requires: core
-- Durable execution (sql/durable.sql): a job's recorded steps, its sleeps and signal waits, and the
-- signals sent before anyone waited. No foreign keys to jobs (as for edges): the rows
-- go with their job in _forget_jobs / _forget_slice.
BEGIN;
CREATE TABLE pgjobs.job_steps (
    job_id  bigint NOT NULL,
    name    text NOT NULL,
    result  jsonb,
    bytes   int NOT NULL,            -- the result's size as JSON text (the per-job budget counts these)
    attempt int NOT NULL,            -- the attempt that recorded it
    done_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, name)
);
CREATE TABLE pgjobs.job_waits (
    job_id      bigint NOT NULL,
    name        text NOT NULL,
    key         text,                -- the signal key; NULL for a sleep
    since       timestamptz NOT NULL DEFAULT now(),
    until       timestamptz,         -- a sleep's end or a wait's timeout (NULL: no timeout)
    resolved_at timestamptz,
    outcome     text CHECK (outcome IN ('signal', 'timeout', 'slept')),
    payload     jsonb,
    PRIMARY KEY (job_id, name),
    CHECK ((resolved_at IS NULL) = (outcome IS NULL))
);
-- signal() finds the open waits of a key here.
CREATE INDEX job_waits_open_key ON pgjobs.job_waits (key, job_id) WHERE resolved_at IS NULL AND key IS NOT NULL;
CREATE TABLE pgjobs.signals (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key        text NOT NULL,
    payload    jsonb NOT NULL,
    sent_at    timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX signals_key ON pgjobs.signals (key, id);
CREATE INDEX signals_expiry ON pgjobs.signals (expires_at);
COMMIT;
