-- Deploy pgjobs:claim_floor to pg
-- The claim floor's signal (sql/claim.sql, "Scan floors"): a claimer session keeps, in its own session
-- settings, where its last claim found the first live row of each queue, and starts its next index scan
-- there instead of at the front of jobs_pending_idx, where a held snapshot keeps every claimed job's dead
-- entry. Any statement that makes a row claimable with a key that may sort below such a floor (an old
-- run_at, a lease moved into the past) draws a value from this sequence; a claimer that sees it moved
-- scans from the front again. A sequence, not a table: nextval is not transactional, leaves no dead
-- tuple and takes no row lock, so the signal costs nothing under the very snapshot it works around.
BEGIN;
CREATE SEQUENCE pgjobs.claim_floor_epoch AS bigint;
COMMIT;
