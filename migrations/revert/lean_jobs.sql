-- Revert pgjobs:lean_jobs from pg
BEGIN;
ALTER INDEX pgjobs.jobs_group_idx RESET (deduplicate_items);
ALTER INDEX pgjobs.jobs_pending_idx RESET (deduplicate_items);
ALTER TABLE pgjobs.jobs
    DROP CONSTRAINT jobs_valid,
    ADD CONSTRAINT jobs_kind_not_empty CHECK (kind <> ''),
    ADD CONSTRAINT jobs_queue_not_empty CHECK (queue <> ''),
    ADD CONSTRAINT jobs_max_attempts_positive CHECK (max_attempts >= 1),
    ADD CONSTRAINT jobs_active_has_lease CHECK (state OPERATOR(pg_catalog.<>) 'active' OR lease_token IS NOT NULL);
CREATE INDEX jobs_leased_by_idx ON pgjobs.jobs (leased_by) WHERE state OPERATOR(pg_catalog.=) 'active';
ALTER TABLE pgjobs.jobs ADD CONSTRAINT jobs_batch_id_fkey
    FOREIGN KEY (batch_id) REFERENCES pgjobs.batches (id) ON DELETE CASCADE;
COMMIT;
