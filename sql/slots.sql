-- Insert-only logs in two slots: claim_floors (claim.sql) and fair_rings (fair.sql) are partitioned by a
-- slot, 0 or 1, and a writer puts its row in slot (seq / window) % 2. Readers want only the newest row of a
-- key (one backward index descent), so the other slot can go whole: space comes back by TRUNCATE, never by
-- DELETE + VACUUM, which a held snapshot would stop.

-- Empties the slot the writers left (1 - cur) after copying into the current one the newest row of each key
-- that has no newer row there. NOWAIT: while a transaction still holds the other slot, a later writer of the
-- window tries again; the newest row of every key survives either way. `keys` are the log's key columns.
CREATE OR REPLACE FUNCTION pgjobs._slots_rotate(log text, keys text[], cur smallint)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgjobs, pg_temp
AS $$
DECLARE
    v_other text := log || '_' || (1 - cur);
    v_cols  text;
    v_has   boolean;
BEGIN
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM pgjobs.%I)', v_other) INTO v_has;
    IF NOT v_has THEN
        RETURN;
    END IF;
    SELECT string_agg(format('o.%I', a.attname), ', ' ORDER BY a.attnum) INTO v_cols
      FROM pg_attribute AS a
     WHERE a.attrelid = format('pgjobs.%I', log)::regclass AND a.attnum > 0 AND NOT a.attisdropped
       AND a.attname <> 'slot';
    EXECUTE format('LOCK TABLE pgjobs.%I IN ACCESS EXCLUSIVE MODE NOWAIT', v_other);
    EXECUTE format($q$
        INSERT INTO pgjobs.%1$I (slot, %2$s)
        SELECT %3$s, %4$s
          FROM (SELECT DISTINCT ON (%5$s) x.* FROM pgjobs.%6$I AS x ORDER BY %5$s, x.seq DESC) AS o
         WHERE NOT EXISTS (SELECT 1 FROM pgjobs.%7$I AS h WHERE (%8$s) AND h.seq > o.seq)$q$,
        log, replace(v_cols, 'o.', ''), cur, v_cols,
        (SELECT string_agg(format('x.%I', k), ', ') FROM unnest(keys) AS k), v_other, log || '_' || cur,
        (SELECT string_agg(format('h.%1$I = o.%1$I', k), ' AND ') FROM unnest(keys) AS k));
    EXECUTE format('TRUNCATE pgjobs.%I', v_other);
EXCEPTION WHEN lock_not_available THEN
    NULL;  -- a later writer of the window tries again
END;
$$;
