-- Verify pgjobs:fairness on pg
BEGIN;
SELECT queue, ungrouped_seq, ungrouped_served_at, ungrouped_empty, ring_from, discover_after, discover_found, discover_productive, seen_max_id, quiet_claims, updated_at FROM pgjobs.fair_queues WHERE false;
SELECT 1 / count(*) FROM pg_class WHERE relname = 'served_seq_seq' AND relkind = 'S';
SELECT 1 / count(*) FROM pg_indexes WHERE schemaname = 'pgjobs' AND indexname = 'jobs_group_later_idx';
SELECT 1 / count(*) FROM pg_indexes WHERE schemaname = 'pgjobs' AND indexname = 'group_cursors_seq_idx';
ROLLBACK;
