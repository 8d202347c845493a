"""``python -m bench.claim_models``: candidate structures for the claim, measured side by side.

Four plain-queue claims, each in a fresh migrated database of its own (the prototypes add a column, an
index or tables that would tax the others' writes):

* ``main``: ``pgjobs.claim`` as it is (session scan floors; sql/claim.sql).
* ``front``: the same statement shape without floors: every claim reads ``jobs_pending_idx`` from the front.
* ``floors``: exact shared floors. Every job carries ``filed_xid`` (the transaction that made it pending,
  indexed per queue); each claim appends ``(snapshot, first pending key)`` to an insert-only floor log and
  the next claim starts its scan at ``min(that key, keys filed since that snapshot)``, the filings found by
  the snapshot's in-progress list and its xmax as sql/stream.sql's ticks find inbox rows.
* ``lanes``: commit-ordered lanes (PgQ, awa). Producers append ``(queue, xid, job)`` to an inbox; a claim,
  one per queue at a time, ticks the inbox into a lane with dense positions and takes the lane from a
  cursor kept in an insert-only log. FIFO by commit order: priority and run_at are not seen.

Two figures per design:

1. Cost under a held snapshot: a session sits idle in a transaction that holds an xid; then 1,000 and
   20,000 jobs are claimed and completed, and after each a probe claim of one job is measured in blocks
   fetched and index entries returned (the claiming transaction's own statistics, no timers). A structure
   that is bounded by construction reads the same after 20,000 as after 1,000.
2. Throughput without a hold: claims of 50 completed with ``complete_many`` until a backlog is drained, on
   one connection, the designs taking turns round by round (the order flips every round); medians and the
   ratio to ``main``. And the enqueue side: ``enqueue_many`` of 1,000 jobs, the same way.

Prototype SQL lives in a schema ``proto`` of the design's own database, nothing of it in ``sql/``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from .common import connect, fresh_database

DESIGNS = ("main", "front", "floors", "floors_trigger", "lanes")

_FRONT = """
CREATE FUNCTION proto.claim(q text, n int) RETURNS TABLE (id bigint, lease_token uuid)
LANGUAGE sql SET search_path = pg_catalog, pgjobs SET plan_cache_mode = force_generic_plan AS $$
    WITH picked AS (
        SELECT j.id FROM jobs AS j WHERE j.state = 'pending' AND j.queue = q
         ORDER BY j.priority, j.run_at, j.id LIMIT n FOR UPDATE SKIP LOCKED)
    UPDATE jobs AS j SET state = 'active', attempt = j.attempt + 1, lease_token = gen_random_uuid(),
           leased_by = 'w', lease_expires_at = now() + '30 s', first_started_at = coalesce(j.first_started_at, now())
     WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked)) AND j.state = ANY ('{waiting,scheduled,pending,active}')
    RETURNING j.id, j.lease_token
$$;
"""

_FLOORS = """
ALTER TABLE pgjobs.jobs ADD COLUMN filed_xid xid8;
ALTER TABLE pgjobs.jobs ALTER COLUMN filed_xid SET DEFAULT pg_current_xact_id();
CREATE INDEX jobs_filed_idx ON pgjobs.jobs_live (queue, filed_xid) WHERE state = 'pending';
CREATE TABLE proto.floors (
    queue text NOT NULL, seq bigint GENERATED ALWAYS AS IDENTITY, snap pg_snapshot NOT NULL,
    fp smallint, ft timestamptz, fi bigint);
CREATE INDEX floors_newest ON proto.floors (queue, seq);
CREATE FUNCTION proto.claim(q text, n int) RETURNS TABLE (id bigint, lease_token uuid)
LANGUAGE plpgsql SET search_path = pg_catalog, pgjobs SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    f record;
    s record;
    v_p smallint; v_t timestamptz; v_i bigint;
BEGIN
    SELECT fl.snap, fl.fp, fl.ft, fl.fi INTO f FROM proto.floors AS fl
     WHERE fl.queue = q ORDER BY fl.seq DESC LIMIT 1;
    -- One statement: the snapshot recorded is the one the filings are read with.
    SELECT pg_current_snapshot() AS cur, m.p, m.t, m.i INTO s
      FROM (WITH filed AS MATERIALIZED (
                SELECT j.priority AS p, j.run_at AS t, j.id AS i
                  FROM pg_snapshot_xip(f.snap) AS x(xid)
                 CROSS JOIN LATERAL (SELECT j.priority, j.run_at, j.id FROM jobs AS j
                                      WHERE j.state = 'pending' AND j.queue = q AND j.filed_xid = x.xid
                                      OFFSET 0) AS j
                 WHERE f.snap IS NOT NULL
                UNION ALL
                SELECT j.priority, j.run_at, j.id FROM jobs AS j
                 WHERE f.snap IS NOT NULL AND j.state = 'pending' AND j.queue = q
                   AND j.filed_xid >= pg_snapshot_xmax(f.snap))
            SELECT * FROM filed ORDER BY 1, 2, 3 LIMIT 1) AS m RIGHT JOIN (SELECT 1) AS one ON true;
    IF f.snap IS NULL THEN
        v_p := -32768; v_t := '-infinity'; v_i := 0;           -- no floor yet: from the front
    ELSIF f.fp IS NULL OR (s.p IS NOT NULL AND (s.p, s.t, s.i) < (f.fp, f.ft, f.fi)) THEN
        v_p := coalesce(s.p, 32767); v_t := coalesce(s.t, 'infinity'); v_i := coalesce(s.i, 0);
    ELSE
        v_p := f.fp; v_t := f.ft; v_i := f.fi;
    END IF;
    -- The new floor: the first pending job this claim's scan sees, taken or not.
    INSERT INTO proto.floors (queue, snap, fp, ft, fi)
    SELECT q, s.cur, h.priority, h.run_at, h.id
      FROM (SELECT 1) AS one LEFT JOIN LATERAL (
            SELECT j.priority, j.run_at, j.id FROM jobs AS j
             WHERE j.state = 'pending' AND j.queue = q AND (j.priority, j.run_at, j.id) >= (v_p, v_t, v_i)
             ORDER BY j.priority, j.run_at, j.id LIMIT 1) AS h ON true;
    RETURN QUERY
    WITH picked AS (
        SELECT j.id FROM jobs AS j
         WHERE j.state = 'pending' AND j.queue = q AND (j.priority, j.run_at, j.id) >= (v_p, v_t, v_i)
         ORDER BY j.priority, j.run_at, j.id LIMIT n FOR UPDATE SKIP LOCKED)
    UPDATE jobs AS j SET state = 'active', attempt = j.attempt + 1, lease_token = gen_random_uuid(),
           leased_by = 'w', lease_expires_at = now() + '30 s', first_started_at = coalesce(j.first_started_at, now())
     WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked)) AND j.state = ANY ('{waiting,scheduled,pending,active}')
    RETURNING j.id, j.lease_token;
END;
$$;
"""

# floors, with filed_xid kept by a row trigger instead of by each statement: the trigger's cost.
_TRIGGER = """
CREATE FUNCTION proto.filed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.filed_xid := pg_current_xact_id();
    RETURN NEW;
END;
$$;
CREATE TRIGGER jobs_filed BEFORE UPDATE ON pgjobs.jobs FOR EACH ROW
  WHEN (NEW.state IN ('pending', 'scheduled', 'active')
        AND (NEW.state <> OLD.state OR NEW.priority <> OLD.priority OR NEW.run_at <> OLD.run_at
             OR NEW.lease_expires_at IS DISTINCT FROM OLD.lease_expires_at))
  EXECUTE FUNCTION proto.filed();
"""

_LANES = """
CREATE TABLE proto.inbox (queue text NOT NULL, xid xid8 NOT NULL DEFAULT pg_current_xact_id(), job_id bigint NOT NULL);
CREATE INDEX inbox_xid ON proto.inbox (queue, xid);
CREATE TABLE proto.ticks (queue text NOT NULL, seq bigint GENERATED ALWAYS AS IDENTITY, snap pg_snapshot NOT NULL,
                          last_pos bigint NOT NULL);
CREATE INDEX ticks_newest ON proto.ticks (queue, seq);
CREATE TABLE proto.lane (queue text NOT NULL, pos bigint NOT NULL, job_id bigint NOT NULL);
CREATE INDEX lane_pos ON proto.lane (queue, pos);
CREATE TABLE proto.cursors (queue text NOT NULL, seq bigint GENERATED ALWAYS AS IDENTITY, pos bigint NOT NULL);
CREATE INDEX cursors_newest ON proto.cursors (queue, seq);
CREATE FUNCTION proto.enqueue_many(jobs jsonb) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pgjobs AS $$
    INSERT INTO proto.inbox (queue, job_id)
    SELECT 'q', e.id FROM pgjobs.enqueue_many(jobs) AS e
$$;
CREATE FUNCTION proto.claim(q text, n int) RETURNS TABLE (id bigint, lease_token uuid)
LANGUAGE plpgsql SET search_path = pg_catalog, pgjobs SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    t record;
    v_cur bigint;
    v_ids bigint[];
    v_pos bigint[];
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('proto.lane:' || q));   -- one ticker and taker per queue
    SELECT tk.snap, tk.last_pos INTO t FROM proto.ticks AS tk WHERE tk.queue = q ORDER BY tk.seq DESC LIMIT 1;
    WITH s AS (SELECT pg_current_snapshot() AS cur),
    fresh AS (
        SELECT r.xid, r.job_id FROM s, (
               SELECT i.xid, i.job_id FROM proto.inbox AS i
                WHERE i.queue = q AND i.xid = ANY (ARRAY(SELECT pg_snapshot_xip(t.snap)))
               UNION ALL
               SELECT i.xid, i.job_id FROM proto.inbox AS i
                WHERE i.queue = q AND i.xid >= coalesce(pg_snapshot_xmax(t.snap), '0')) AS r
         WHERE pg_visible_in_snapshot(r.xid, s.cur)),
    lane AS (
        INSERT INTO proto.lane (queue, pos, job_id)
        SELECT q, coalesce(t.last_pos, 0) + row_number() OVER (ORDER BY fresh.xid, fresh.job_id), fresh.job_id
          FROM fresh RETURNING pos)
    INSERT INTO proto.ticks (queue, snap, last_pos)
    SELECT q, s.cur, coalesce((SELECT max(lane.pos) FROM lane), t.last_pos, 0) FROM s;
    SELECT c.pos INTO v_cur FROM proto.cursors AS c WHERE c.queue = q ORDER BY c.seq DESC LIMIT 1;
    SELECT array_agg(l.job_id ORDER BY l.pos), array_agg(l.pos ORDER BY l.pos) INTO v_ids, v_pos
      FROM (SELECT l.job_id, l.pos FROM proto.lane AS l WHERE l.queue = q AND l.pos > coalesce(v_cur, 0)
             ORDER BY l.pos LIMIT n) AS l;
    IF v_pos IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO proto.cursors (queue, pos) VALUES (q, v_pos[cardinality(v_pos)]);
    RETURN QUERY
    UPDATE jobs AS j SET state = 'active', attempt = j.attempt + 1, lease_token = gen_random_uuid(),
           leased_by = 'w', lease_expires_at = now() + '30 s', first_started_at = coalesce(j.first_started_at, now())
     WHERE j.id = ANY (v_ids) AND j.state = 'pending'
    RETURNING j.id, j.lease_token;
END;
$$;
"""

_COUNTS = """
SELECT coalesce(sum(pg_stat_get_xact_blocks_fetched(c.oid)), 0)::bigint,
       coalesce(sum(pg_stat_get_xact_tuples_returned(c.oid)) FILTER (WHERE c.relkind = 'i'), 0)::bigint
  FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace AND n.nspname IN ('pgjobs', 'proto')
 WHERE c.relkind IN ('r', 'i')
"""


class Design:
    """One design's database and its two calls: enqueue a chunk, claim (and complete) a batch."""

    def __init__(self, name: str, dsn: str) -> None:
        self.name, self.dsn = name, dsn
        self.conn = connect(dsn)
        self.conn.execute("CREATE SCHEMA proto")
        ddl = {"front": _FRONT, "floors": _FLOORS, "floors_trigger": _FLOORS + _TRIGGER, "lanes": _LANES}.get(name)
        if ddl:
            self.conn.execute(ddl, prepare=False)

    def enqueue(self, n: int) -> None:
        jobs = Jsonb([{"kind": "k", "queue": "q"} for _ in range(n)])
        if self.name == "lanes":
            self.conn.execute("SELECT proto.enqueue_many(%s)", (jobs,))
        else:
            self.conn.execute("SELECT count(*) FROM pgjobs.enqueue_many(%s)", (jobs,))

    def claim(self, n: int, conn: psycopg.Connection[Any] | None = None) -> list[tuple[int, Any]]:
        c = conn or self.conn
        if self.name == "main":
            rows = c.execute("SELECT id, lease_token FROM pgjobs.claim('w', '{q}', %s)", (n,)).fetchall()
        else:
            rows = c.execute("SELECT id, lease_token FROM proto.claim('q', %s)", (n,)).fetchall()
        return [(int(r[0]), r[1]) for r in rows]

    def complete(self, rows: list[tuple[int, Any]], conn: psycopg.Connection[Any] | None = None) -> None:
        if rows:
            (conn or self.conn).execute(
                "SELECT pgjobs.complete_many(%s, %s)", ([r[0] for r in rows], [r[1] for r in rows])
            )

    def work(self, jobs: int, per_claim: int = 50) -> int:
        done = 0
        while done < jobs:
            rows = self.claim(min(per_claim, jobs - done))
            if not rows:
                break
            self.complete(rows)
            done += len(rows)
        return done

    def probe(self) -> tuple[int, int]:
        """Blocks fetched and index entries returned by one claim of one job (completed in the same call)."""
        with self.conn.transaction():
            b = self.conn.execute(_COUNTS).fetchone()
            rows = self.claim(1)
            a = self.conn.execute(_COUNTS).fetchone()
        assert a is not None and b is not None and len(rows) == 1, f"{self.name}: probe claimed {len(rows)}"
        self.complete(rows)
        return int(a[0] - b[0]), int(a[1] - b[1])


@contextmanager
def designs(server: str, names: tuple[str, ...]) -> Iterator[dict[str, Design]]:
    with ExitStack() as stack:
        out = {}
        for name in names:
            dsn = stack.enter_context(fresh_database(server, f"claim_{name}"))
            out[name] = Design(name, dsn)
            stack.callback(out[name].conn.close)
        yield out


def held_snapshot_costs(
    server: str, names: tuple[str, ...], marks: tuple[int, ...]
) -> dict[str, list[tuple[int, int]]]:
    """Per design, the probe's (blocks, index entries) after each mark of jobs completed under a held snapshot."""
    out: dict[str, list[tuple[int, int]]] = {}
    with designs(server, names) as ds:
        for name, d in ds.items():
            for _ in range(marks[-1] // 1000 + 2):
                d.enqueue(1000)
            d.work(500)  # warm: plans made, floors engaged where a design has them
            d.probe()
            with psycopg.connect(d.dsn) as holder:
                holder.execute("SELECT pg_current_xact_id()")  # idle in transaction, holding an xid
                done, costs = 0, []
                for mark in marks:
                    done += d.work(mark - done)
                    costs.append(d.probe())
                holder.rollback()
            out[name] = costs
    return out


def throughput(server: str, names: tuple[str, ...], rounds: int, backlog: int) -> dict[str, dict[str, float]]:
    """Per design, median jobs/s of a drain (claim 50 + complete_many) and of enqueue_many(1,000)."""
    rates: dict[str, dict[str, list[float]]] = {n: {"claim": [], "enqueue": []} for n in names}
    with designs(server, names) as ds:
        for r in range(rounds):
            for name in names if r % 2 == 0 else tuple(reversed(names)):
                d = ds[name]
                t0 = time.perf_counter()
                for _ in range(backlog // 1000):
                    d.enqueue(1000)
                rates[name]["enqueue"].append(backlog / (time.perf_counter() - t0))
                d.conn.execute("VACUUM ANALYZE pgjobs.jobs_live")
                t0 = time.perf_counter()
                got = d.work(backlog)
                rates[name]["claim"].append(got / (time.perf_counter() - t0))
    return {n: {k: statistics.median(v) for k, v in per.items()} for n, per in rates.items()}


def race(server: str, names: tuple[str, ...], producers: int = 2, claimers: int = 2, txs: int = 60) -> dict[str, str]:
    """Per design: claimers racing producers whose transactions stay open 0-0.5 s and file jobs with random
    priorities and past run_at (keys below any floor). At quiescence every job must have been claimed exactly
    once (attempt 1, succeeded) and none left pending."""
    import random
    import threading

    out: dict[str, str] = {}
    with designs(server, names) as ds:
        for name, d in ds.items():
            stop = threading.Event()
            produced = [0]

            def produce(seed: int, d: Design = d, produced: list[int] = produced) -> None:
                rnd = random.Random(seed)
                with psycopg.connect(d.dsn) as c:
                    for _ in range(txs):
                        jobs = [
                            {
                                "kind": "k",
                                "queue": "q",
                                "priority": rnd.randint(0, 3),
                                "run_at": "2000-01-01T00:00:00Z" if rnd.random() < 0.1 else None,
                            }
                            for _ in range(5)
                        ]
                        for j in jobs:
                            if j["run_at"] is None:
                                del j["run_at"]
                        fn = "proto.enqueue_many" if d.name == "lanes" else "pgjobs.enqueue_many"
                        c.execute(f"SELECT {fn}(%s)", (Jsonb(jobs),))
                        time.sleep(rnd.random() * 0.5)
                        c.commit()
                        produced[0] += len(jobs)

            def claim_loop(d: Design = d, stop: threading.Event = stop) -> None:
                with connect(d.dsn) as c:
                    empty = 0
                    while empty < 20:
                        rows = d.claim(10, c)
                        d.complete(rows, c)
                        empty = 0 if rows or not stop.is_set() else empty + 1
                        if not rows:
                            time.sleep(0.01)

            threads = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
            takers = [threading.Thread(target=claim_loop) for _ in range(claimers)]
            for t in threads + takers:
                t.start()
            for t in threads:
                t.join()
            stop.set()
            for t in takers:
                t.join()
            row = d.conn.execute(
                "SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'succeeded'),"
                " count(*) FILTER (WHERE attempt <> 1), count(*) FROM pgjobs.jobs"
            ).fetchone()
            assert row is not None
            out[name] = f"produced {produced[0]}, left pending {row[0]}, succeeded {row[1]}, attempt != 1: {row[2]}"
    return out


def _table(title: str, head: list[str], rows: list[list[str]]) -> None:
    print(f"\n{title}")
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    for row in [head, *rows]:
        print("  ".join(x.rjust(w) for x, w in zip(row, widths, strict=True)))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.claim_models", description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default=os.environ.get("PGJOBS_DSN"), required=os.environ.get("PGJOBS_DSN") is None)
    p.add_argument("--designs", default=",".join(DESIGNS))
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--backlog", type=int, default=20000)
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--race", action="store_true", help="only the race of claimers and late producers")
    a = p.parse_args(argv)
    names = tuple(a.designs.split(","))
    if a.race:
        for name, line in race(a.dsn, names).items():
            print(f"{name:>7}: {line}")
        return
    marks = (1000, 20000)
    costs = held_snapshot_costs(a.dsn, names, marks)
    _table(
        "probe claim under a held snapshot: blocks fetched / index entries returned",
        ["design", *[f"after {m:,}" for m in marks], "ratio (blocks)"],
        [[n, *[f"{b}/{e}" for b, e in c], f"{c[-1][0] / max(c[0][0], 1):.2f}x"] for n, c in costs.items()],
    )
    if a.skip_throughput:
        return
    rates = throughput(a.dsn, names, a.rounds, a.backlog)
    base = rates.get("main") or next(iter(rates.values()))
    _table(
        f"throughput, medians of {a.rounds} alternating rounds (backlog {a.backlog:,}, 1 connection)",
        ["design", "claim+complete jobs/s", "vs main", "enqueue jobs/s", "vs main"],
        [
            [
                n,
                f"{r['claim']:,.0f}",
                f"{r['claim'] / base['claim']:.2f}x",
                f"{r['enqueue']:,.0f}",
                f"{r['enqueue'] / base['enqueue']:.2f}x",
            ]
            for n, r in rates.items()
        ],
    )


if __name__ == "__main__":
    main()
