-- Verify pgjobs:claim
-- The change fair_ring replaces what this change created (and drops it): once it is deployed there is
-- nothing of this change left to verify.
BEGIN;
DO $$
BEGIN
    IF to_regclass('pgjobs.fair_rings') IS NOT NULL THEN
        RETURN;
    END IF;
    PERFORM 1 / (count(*) = 7)::int FROM pg_class
      WHERE relnamespace = 'pgjobs'::regnamespace AND relkind = 'S'
        AND relname IN ('claim_floor_epoch', 'served_seq_seq', 'fair_gate_a', 'fair_gate_u', 'fair_gate_s',
                        'fair_gate_f', 'fair_cursor_epoch');
    PERFORM 1 / count(*) FROM pg_indexes WHERE schemaname = 'pgjobs' AND indexname = 'jobs_group_later_idx';
    PERFORM queue, group_key, last_served_at, served_seq, floor_priority, floor_run_at, floor_id, floor_until,
            floor_epoch
       FROM pgjobs.group_cursors WHERE false;
    PERFORM 1 / (count(*) = 3)::int FROM pg_indexes
      WHERE schemaname = 'pgjobs'
        AND indexname IN ('group_cursors_seq_idx', 'group_cursors_new_key', 'group_cursors_key_idx');
    -- no index unique on the group alone (a stamp would check every earlier version of the cursor)
    PERFORM 1 / (count(*) = 0)::int FROM pg_index AS x
      WHERE x.indrelid = 'pgjobs.group_cursors'::regclass AND x.indisunique AND x.indpred IS NULL;
    PERFORM queue, group_key FROM pgjobs.fair_groups WHERE false;
    PERFORM queue, ungrouped_seq, ungrouped_served_at, ungrouped_empty, ring_from, discover_after, discover_found,
            discover_productive, seen_max_id, quiet_claims, updated_at
       FROM pgjobs.fair_queues WHERE false;
    PERFORM queue, counted_at, payload FROM pgjobs.fair_counts WHERE false;
END;
$$;
ROLLBACK;
