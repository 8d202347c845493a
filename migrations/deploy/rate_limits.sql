-- Deploy pgjobs:rate_limits to pg
-- requires: claim_floors
-- Rate limits (../../sql/rate_limits.sql, ../../docs/design/claim.md "Where flow control sits"): at most
-- max_starts starts per `per` (+ burst) for a key that jobs name in rate_key, or for a whole queue.
-- Every statement here is in place under load: new columns without a default rewrite nothing, and the
-- indexes are on a column no existing row has set, so they are built from an empty set of entries.
BEGIN;
ALTER TABLE pgjobs.jobs ADD COLUMN rate_key text;
-- The run_at a claim gave a job it held back for its key's next token (a job whose run_at is still this is
-- held back by its limit, not scheduled by its producer: explain tells the two apart by it).
ALTER TABLE pgjobs.jobs ADD COLUMN rate_held_until timestamptz;

-- The limits. scope 'key': jobs whose rate_key is `key`; scope 'queue': every job of queue `key`.
CREATE TABLE pgjobs.rate_limits (
    scope      text NOT NULL CHECK (scope IN ('key', 'queue')),
    key        text NOT NULL CHECK (key <> ''),
    max_starts int NOT NULL CHECK (max_starts > 0),
    per        interval NOT NULL CHECK (per > interval '0'),
    burst      int NOT NULL DEFAULT 0 CHECK (burst >= 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);

-- A limit's theoretical arrival time (GCRA), one row inserted by every claim that takes tokens and never
-- updated: the newest row of a key is found by one backward descent of rate_tats_newest, so no row is
-- rewritten per claim (a held snapshot would turn the versions of one hot row into a walk). Old rows are
-- deleted by maintenance (_rate_prune, from _maintain_history), at the far end of the descent.
CREATE TABLE pgjobs.rate_tats (
    scope    text NOT NULL,
    key      text NOT NULL,
    tat      timestamptz NOT NULL,
    taken    int NOT NULL,
    taken_at timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
CREATE INDEX rate_tats_newest ON pgjobs.rate_tats (scope, key, tat);

-- The queues that ever had a job with a rate_key (enqueue notes them): a claim of other queues never takes
-- the rated path, whatever keys have limits. Never emptied: a queue noted once stays noted.
CREATE TABLE pgjobs.rate_queues (
    queue text PRIMARY KEY
);

-- The pending jobs of a key in claim order: what a claim holds back when the key ran out of tokens,
-- without reading any other queue's or key's jobs. Partial: jobs without a rate_key never enter it.
CREATE INDEX jobs_rate_pending_idx ON pgjobs.jobs_live (rate_key, priority, run_at, id)
    WHERE rate_key IS NOT NULL AND state OPERATOR(pg_catalog.=) 'pending';
-- The jobs a claim held back, by key and time: the end of a key's line of held jobs (the next one is
-- held after it) and explain's reads.
CREATE INDEX jobs_rate_held_idx ON pgjobs.jobs_live (rate_key, run_at)
    WHERE rate_key IS NOT NULL AND state OPERATOR(pg_catalog.=) 'scheduled';

-- configure_queue gains max_starts and per (sql/admin.sql creates the new signature); the old one goes,
-- so a call by name resolves to one function.
DROP FUNCTION IF EXISTS pgjobs.configure_queue(text, int, boolean, boolean, real, int, int, int, text, interval);
-- enqueue gains rate_key (sql/enqueue.sql).
DROP FUNCTION IF EXISTS pgjobs.enqueue(text, jsonb, text, timestamptz, smallint, int, text, boolean, text, jsonb);
COMMIT;
