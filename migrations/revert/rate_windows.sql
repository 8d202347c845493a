-- Revert pgjobs:rate_windows from pg
-- Back to GCRA: each limit's TAT is set so that its first start comes per after the newest logged one (no
-- window holds a start of each side), under the limits' locks; the log goes, and the installed revision of
-- sql/ is marked stale: the next migrate installs every function again, whichever revision it brings.
BEGIN;
SELECT count(pg_advisory_xact_lock(hashtextextended('pgjobs.rate|' || l.scope || '|' || l.key, 0)))
  FROM (SELECT l.scope, l.key FROM pgjobs.rate_limits AS l
         ORDER BY l.scope = 'key', l.key) AS l;
INSERT INTO pgjobs.rate_tats (scope, key, tat, taken)
SELECT l.scope, l.key, x.started_at + l.per + l.burst * (l.per / l.max_starts), 0
  FROM pgjobs.rate_limits AS l
 CROSS JOIN LATERAL (SELECT s.started_at FROM pgjobs.rate_starts AS s
                      WHERE s.scope = l.scope AND s.key = l.key ORDER BY s.seq DESC LIMIT 1) AS x;
DROP TABLE pgjobs.rate_starts;
UPDATE pgjobs.sql_revision SET digest = 'stale: pgjobs:rate_windows reverted';
COMMIT;
