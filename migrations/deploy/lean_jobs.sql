-- Deploy pgjobs:lean_jobs to pg
-- jobs.batch_id loses its foreign key. Every insert queued a referential check per row even when
-- batch_id is NULL (nearly always): a tenth of a bulk enqueue's server time. Nothing needs it:
-- batch ids are only written by pgjobs' own functions (enqueue_many(as_batch) creates the batch in
-- the same transaction; add_to_batch needs an active member, so the batch is executing and cannot
-- be deleted), and the functions that delete batches (delete_batch, purge) delete their members
-- in the same statement sequence, under the batch's row lock.
--
-- The claim indexes end in id, so no two entries are equal and deduplication never merges any:
-- turned off, a leaf page split no longer first scans the page for duplicates.
BEGIN;
ALTER TABLE pgjobs.jobs DROP CONSTRAINT jobs_batch_id_fkey;
ALTER INDEX pgjobs.jobs_pending_idx SET (deduplicate_items = off);
ALTER INDEX pgjobs.jobs_group_idx SET (deduplicate_items = off);
COMMIT;
