-- Revert pgjobs:claim
BEGIN;
DROP SEQUENCE pgjobs.fair_cursor_epoch, pgjobs.fair_gate_f, pgjobs.fair_gate_s, pgjobs.fair_gate_u,
              pgjobs.fair_gate_a, pgjobs.served_seq_seq, pgjobs.claim_floor_epoch;
DROP TABLE pgjobs.fair_counts, pgjobs.fair_queues, pgjobs.fair_groups, pgjobs.group_cursors;
DROP INDEX pgjobs.jobs_group_later_idx;
COMMIT;
