-- Deploy pgjobs:claim_floors
-- requires: claim
-- The plain claim's exact shared floors (../../sql/claim.sql, "Floors"; docs/design/claim.md).
-- filed_xid is the transaction that last made a job claimable, changed its claim key or set its lease. A
-- claim reads the jobs filed since the snapshot of the previous claim's floor through jobs_filed_idx: one
-- probe per transaction that snapshot saw in progress, one range from its xmax. The column is added without
-- a default value for the rows already there (no rewrite of the table under load). Those rows were
-- committed before any claim reads a floor: the first claim of a key has no floor and scans from the front.
-- The trigger that keeps filed_xid on updates is created here with its function, in the transaction that adds
-- the column, so that no write committed after the column exists can leave it behind; ../../sql/claim.sql
-- defines both again (the installed revision of sql/ is their source).
BEGIN;
ALTER TABLE pgjobs.jobs ADD COLUMN filed_xid xid8;
ALTER TABLE pgjobs.jobs ALTER COLUMN filed_xid SET DEFAULT pg_catalog.pg_current_xact_id();
-- (filed_xid IS NOT NULL in the predicate: a read by queue and state alone, a count of a queue's active jobs,
-- never qualifies for this index, only a read of filings does.)
CREATE INDEX jobs_filed_idx ON pgjobs.jobs_live (queue, filed_xid)
    WHERE filed_xid IS NOT NULL AND state OPERATOR(pg_catalog.=) ANY ('{pending,scheduled,active}');

CREATE OR REPLACE FUNCTION pgjobs._job_filed()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
BEGIN
    NEW.filed_xid := pg_current_xact_id();
    RETURN NEW;
END;
$$;
CREATE TRIGGER jobs_filed BEFORE UPDATE ON pgjobs.jobs FOR EACH ROW
    WHEN (NEW.state OPERATOR(pg_catalog.=) ANY ('{pending,scheduled,active}')
          AND (NEW.state OPERATOR(pg_catalog.<>) OLD.state OR NEW.priority <> OLD.priority
               OR NEW.run_at <> OLD.run_at OR NEW.queue <> OLD.queue OR NEW.kind <> OLD.kind
               OR NEW.lease_expires_at < OLD.lease_expires_at
               OR (NEW.lease_expires_at IS NULL) <> (OLD.lease_expires_at IS NULL))
          AND NEW.filed_xid IS NOT DISTINCT FROM OLD.filed_xid)
    EXECUTE FUNCTION pgjobs._job_filed();

-- The floors: one row per claim and key (queue, kind set), never updated; the newest row of a key is one
-- backward descent of claim_floors_key. Two slots: rows go to slot (seq / 8192) % 2, and a claim that
-- crosses into the second half of a window copies the newest row of each key out of the other slot and
-- TRUNCATEs it, so space comes back by TRUNCATE, never DELETE + VACUUM, and a held snapshot cannot stop it.
-- snap: the snapshot the claim read the filings with; own: its own transaction (its later filings are in
-- neither snap's in-progress list nor past its xmax when it had an xid before snap). p, t, i: the first
-- pending job the claim saw (NULL: none); sched: the earliest scheduled run_at it saw; lease: the earliest
-- lease of an active job it saw.
CREATE TABLE pgjobs.claim_floors (
    slot  smallint NOT NULL,
    seq   bigint NOT NULL,
    queue text NOT NULL,
    kinds text NOT NULL,
    snap  pg_catalog.pg_snapshot NOT NULL,
    own   xid8 NOT NULL,
    p     smallint,
    t     timestamptz,
    i     bigint,
    sched timestamptz,
    lease timestamptz
) PARTITION BY LIST (slot);
CREATE TABLE pgjobs.claim_floors_0 PARTITION OF pgjobs.claim_floors FOR VALUES IN (0);
CREATE TABLE pgjobs.claim_floors_1 PARTITION OF pgjobs.claim_floors FOR VALUES IN (1);
CREATE INDEX claim_floors_key ON pgjobs.claim_floors (queue, kinds, seq);
CREATE SEQUENCE pgjobs.claim_floors_seq AS bigint;

-- One plain claim's plan, from _claim_plain to its locking statement (_claim_take): the candidate scans'
-- kinds and caps, the kinds of one scan for all listed kinds, the floors' key, the claim's seq, the
-- snapshot its starts were read with, and the starts per queue.
CREATE TYPE pgjobs.claim_plan AS (
    kinds     text[],
    caps      int[],
    any_kinds text[],
    key       text,
    seq       bigint,
    snap      pg_catalog.pg_snapshot,
    p         smallint[],
    t         timestamptz[],
    i         bigint[],
    s         timestamptz[],
    l         timestamptz[]
);
COMMIT;
