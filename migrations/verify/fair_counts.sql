-- Verify pgjobs:fair_counts on pg
BEGIN;
SELECT queue, counted_at, payload FROM pgjobs.fair_counts WHERE false;
ROLLBACK;
