"""Workflows: what graph bookkeeping costs.

Three measurements, each against a baseline in the same run (rounds alternate A/B so neither side
always goes first):

1. Insert: one ``enqueue_many(as_batch => true)`` of ``n`` members plus a fan-in job depending on all
   of them, against one ``enqueue_many`` of ``n`` independent jobs.
2. Settle: draining those jobs with ``claim(max_jobs => 100)`` + ``complete_many`` (one connection),
   each completion updating the batch counters and the fan-in's edges, against the same for ``n``
   independent jobs. Bar: at most 1.5x.
3. The no-edge completion path: ``complete_many`` of independent jobs with this code, against the
   same in a second database whose graph functions are the interim placeholders of before the
   workflows work (``_propagate`` a no-op). Bar: within 10 %.

``run(dsn, n)`` prints nothing and returns the figures (see bench/common.py for the shape).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

from .common import alternate, connect, figure, fresh_database, median

CLAIM_SIZE = 100
NO_EDGE_ROUNDS = 7

# sql/graph.sql as it was before the workflows work: no graph, so nothing to propagate.
_BEFORE_GRAPH_SQL = """
CREATE OR REPLACE FUNCTION pgjobs._propagate(ids bigint[]) RETURNS void LANGUAGE plpgsql
SET search_path = pgjobs, pg_catalog AS $$ BEGIN RETURN; END; $$;
CREATE OR REPLACE FUNCTION pgjobs._reopen(ids bigint[]) RETURNS void LANGUAGE plpgsql
SET search_path = pgjobs, pg_catalog AS $$ BEGIN RETURN; END; $$;
"""


def _drain(conn: psycopg.Connection[Any], queue: str) -> tuple[float, float, int]:
    """Claims and completes everything in ``queue``; returns (total seconds, seconds in complete_many, jobs)."""
    done = 0
    in_complete = 0.0
    t0 = time.perf_counter()
    while True:
        rows = conn.execute(
            "SELECT id, lease_token FROM pgjobs.claim(worker => 'bench', queues => %s::text[], max_jobs => %s)",
            ([queue], CLAIM_SIZE),
        ).fetchall()
        if not rows:
            break
        t1 = time.perf_counter()
        got = conn.execute(
            "SELECT pgjobs.complete_many(ids => %s::bigint[], lease_tokens => %s::uuid[])",
            ([r[0] for r in rows], [r[1] for r in rows]),
        ).fetchone()
        in_complete += time.perf_counter() - t1
        done += int(got[0]) if got else 0
    return time.perf_counter() - t0, in_complete, done


def _insert(conn: psycopg.Connection[Any], specs: list[dict[str, Any]], as_batch: bool) -> float:
    t0 = time.perf_counter()
    conn.execute("SELECT count(*) FROM pgjobs.enqueue_many(jobs => %s, as_batch => %s)", (Jsonb(specs), as_batch))
    return time.perf_counter() - t0


def _independent_specs(n: int, queue: str) -> list[dict[str, Any]]:
    return [{"kind": "resize", "queue": queue, "payload": {"image": i}} for i in range(n)]


def _fan_specs(n: int, queue: str) -> list[dict[str, Any]]:
    specs: list[dict[str, Any]] = [
        {"kind": "resize", "queue": queue, "ref": f"r{i}", "payload": {"image": i}} for i in range(n)
    ]
    specs.append({"kind": "zip", "queue": queue, "ref": "zip", "depends_on": [{"ref": f"r{i}"} for i in range(n)]})
    return specs


@contextlib.contextmanager
def _before_database(dsn: str) -> Iterator[str | None]:
    """A second database with the pre-workflows graph functions, or None when one cannot be created."""
    try:
        with fresh_database(make_conninfo(dsn, dbname="postgres"), "wf_before") as before:
            with psycopg.connect(before, autocommit=True) as conn:
                conn.execute(_BEFORE_GRAPH_SQL)
            yield before
    except psycopg.errors.InsufficientPrivilege:
        yield None


def run(dsn: str, n: int = 10_000, quick: bool = False) -> dict[str, Any]:
    if quick:
        n = min(n, 2_000)
    rounds = 3 if quick else 5
    counter = iter(range(1_000_000))
    figures = []
    raw: dict[str, Any] = {"n": n, "claim_size": CLAIM_SIZE, "rounds": rounds}

    with connect(dsn) as conn:
        conn.execute("SET synchronous_commit = off")  # the same for both sides; measures the server work

        def cycle(fan: bool) -> dict[str, float]:
            queue = f"wf_{'fan' if fan else 'ind'}_{next(counter)}"
            specs = _fan_specs(n, queue) if fan else _independent_specs(n, queue)
            insert = _insert(conn, specs, as_batch=fan)
            settle, in_complete, done = _drain(conn, queue)
            assert done == len(specs), (done, len(specs))
            conn.execute("VACUUM ANALYZE pgjobs.jobs")  # every cycle starts from the same table state
            return {"insert": insert, "settle": settle, "complete": in_complete}

        cycle(False)
        cycle(True)  # warm-up: plans cached, tables and indexes sized
        results: dict[str, list[dict[str, float]]] = {"independent": [], "fan": []}
        samples = alternate(
            {
                "independent": lambda: _keep(results["independent"], cycle(False)),
                "fan": lambda: _keep(results["fan"], cycle(True)),
            },
            rounds,
        )
        del samples
        ind = {k: median([r[k] for r in results["independent"]]) for k in ("insert", "settle", "complete")}
        fan = {k: median([r[k] for r in results["fan"]]) for k in ("insert", "settle", "complete")}
        raw["independent"], raw["fan_in_batch"] = results["independent"], results["fan"]

    figures.append(
        figure(
            f"insert: batch of {n:,} + fan-in job",
            fan["insert"],
            "s",
            baseline=ind["insert"],
            baseline_name=f"{n:,} independent jobs",
            note="one enqueue_many each",
        )
    )
    # Rounds run back to back in pairs, so a pair shares the machine's load of the moment: the median of
    # the per-pair ratios resists a noisy machine better than a ratio of medians.
    pair_ratios = [f["settle"] / i["settle"] for f, i in zip(results["fan"], results["independent"], strict=True)]
    raw["settle_pair_ratios"] = pair_ratios
    figures.append(
        figure(
            f"settle: batch of {n:,} + fan-in (claim {CLAIM_SIZE} + complete_many)",
            fan["settle"],
            "s",
            baseline=ind["settle"],
            baseline_name=f"{n:,} independent jobs",
            ratio=median(pair_ratios),
            bar=1.5,
            bar_kind="max",
            note=f"counters, edges and the fan-in release, per complete_many call; ratio: median of {rounds} "
            "back-to-back pairs",
        )
    )

    # The no-edge completion path against the code of before, in a second database.
    with _before_database(dsn) as before:
        if before is None:
            notes = ["no-edge path: could not create a second database for the before-code baseline"]
        else:
            notes = []
            with connect(dsn) as now_conn, connect(before) as before_conn:
                for c in (now_conn, before_conn):
                    c.execute("SET synchronous_commit = off")

                def no_edge(c: psycopg.Connection[Any]) -> float:
                    queue = f"wf_plain_{next(counter)}"
                    _insert(c, _independent_specs(n, queue), as_batch=False)
                    _total, in_complete, _done = _drain(c, queue)
                    c.execute("VACUUM ANALYZE pgjobs.jobs")
                    return in_complete

                no_edge(now_conn)
                no_edge(before_conn)
                path = alternate(
                    {"now": lambda: no_edge(now_conn), "before": lambda: no_edge(before_conn)}, NO_EDGE_ROUNDS
                )
            raw["no_edge_complete_many_s"] = path
            figures.append(
                figure(
                    f"no-edge completion path: complete_many of {n:,} independent jobs",
                    min(path["now"]),
                    "s",
                    baseline=min(path["before"]),
                    baseline_name="same, graph functions of before the workflows work",
                    bar=1.10,
                    bar_kind="max",
                    note=f"time inside complete_many only; best of {NO_EDGE_ROUNDS} alternating rounds (the code path "
                    f"is the same, so what differs is noise; medians: {median(path['now']):.3f} s vs "
                    f"{median(path['before']):.3f} s)",
                )
            )

    return {
        "suite": "workflows",
        "figures": figures,
        "notes": [
            f"{n:,} jobs per side, claim size {CLAIM_SIZE}, one connection, synchronous_commit off on both sides",
            *notes,
        ],
        "raw": raw,
    }


def _keep(into: list[dict[str, float]], result: dict[str, float]) -> float:
    into.append(result)
    return result["settle"]
