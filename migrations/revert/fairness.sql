-- Revert pgjobs:fairness from pg
BEGIN;
ALTER INDEX pgjobs.group_cursors_pkey RESET (deduplicate_items);
ALTER TABLE pgjobs.group_cursors RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
                                        autovacuum_vacuum_cost_delay);
DROP TABLE pgjobs.fair_queues;
DROP SEQUENCE pgjobs.served_seq_seq;
DROP INDEX pgjobs.group_cursors_seq_idx;
DROP INDEX pgjobs.jobs_group_later_idx;
COMMIT;
