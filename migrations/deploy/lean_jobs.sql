-- Deploy pgjobs:lean_jobs to pg
-- Less work per row written to jobs, for what the hot paths do most (insert, claim, complete):
--
-- * jobs.batch_id loses its foreign key. Every insert queued a referential check per row even
--   when batch_id is NULL (nearly always): a tenth of a bulk enqueue's server time. Nothing needs
--   it: batch ids are only written by pgjobs' own functions (enqueue_many(as_batch) creates the
--   batch in the same transaction; add_to_batch needs an active member, so the batch is executing
--   and cannot be deleted), and the functions that delete batches (delete_batch, purge) delete
--   their members in the same statement sequence, under the batch's row lock.
-- * jobs_leased_by_idx goes: every claim added an entry to it, and its only readers (reap_workers,
--   list_workers) find a worker's jobs among the active ones, which jobs_active_idx holds.
-- * The four CHECK constraints become one: each statement that writes jobs compiles every CHECK
--   expression anew, and a single-row enqueue paid that four times.
-- * The claim indexes end in id, so no two entries are equal and deduplication never merges any:
--   turned off, a leaf page split no longer first scans the page for duplicates.
-- * has_dependents now holds on every job with a job-level dependent (batch members created with
--   their children were left unflagged, and every member's edges were looked up at completion):
--   existing parents get it here.
BEGIN;
UPDATE pgjobs.jobs AS j SET has_dependents = true
 WHERE NOT j.has_dependents AND EXISTS (SELECT 1 FROM pgjobs.edges AS e WHERE e.parent_job_id = j.id);
ALTER TABLE pgjobs.jobs DROP CONSTRAINT jobs_batch_id_fkey;
DROP INDEX pgjobs.jobs_leased_by_idx;
ALTER TABLE pgjobs.jobs
    DROP CONSTRAINT jobs_kind_not_empty,
    DROP CONSTRAINT jobs_queue_not_empty,
    DROP CONSTRAINT jobs_max_attempts_positive,
    DROP CONSTRAINT jobs_active_has_lease,
    ADD CONSTRAINT jobs_valid CHECK (kind <> '' AND queue <> '' AND max_attempts >= 1
                                     AND (state OPERATOR(pg_catalog.<>) 'active' OR lease_token IS NOT NULL));
ALTER INDEX pgjobs.jobs_pending_idx SET (deduplicate_items = off);
ALTER INDEX pgjobs.jobs_group_idx SET (deduplicate_items = off);
COMMIT;
