"""Fair claim throughput: claim + complete on a fair queue with 1, 100 and 10,000 groups, each as a ratio to
the plain (unfair) path measured in the same run, round by round.

Every measurement is the SQL hot path a worker runs: ``claim(worker, queues, max_jobs)`` then
``complete_many(ids, lease_tokens)``, each in its own autocommit transaction, on 1 and 4 connections and
with claim sizes 10 and 100. The queues are filled with INSERT ... SELECT (the enqueue path is not what
this suite measures): the plain queue holds 400,000 jobs, the 1- and 100-group fair queues 300,000 each,
the 10,000-group queue 1,000,000 (100 per group); ``quick`` uses fewer. Before each round every queue is
topped up to that depth again (outside the timed part), so no queue runs dry in a later setting (a queue
that ran out measured how fast an empty queue answers, and the plain queue did, at claim 100 on 4
connections) and every setting sees the same backlog. Each round runs the plain queue
and the three fair queues for the same duration, in an order that flips every round; the figures are
medians over the rounds.

Before each round the jobs table, the fair ring and the active ledger are vacuumed (outside the timed
part), as autovacuum would on a busy queue: without it, this run's own backlog of claimed jobs, which both
paths walk past until VACUUM, would decide the figures more than the claim paths do.

Both sides run with ``jit = off``: on tables this size a generic plan's estimate can pass
``jit_above_cost``, and JIT compiling a claim costs far more than running it; left on, it would measure the
compiler, not the claim paths (the fair path turns it off itself).

Bars: fair claim throughput with 100 groups at least 50 % of the plain path, with 10,000 groups
at least 25 %.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from .common import connect, figure, median

PLAIN = "bench_plain"
FAIR = {1: "bench_fair_1", 100: "bench_fair_100", 10_000: "bench_fair_10000"}
# the depth of each queue at the start of every round (topped up before each); --quick uses a fifth, and
# 200,000 jobs for 10,000 groups
JOBS = {PLAIN: 400_000, FAIR[1]: 300_000, FAIR[100]: 300_000, FAIR[10_000]: 1_000_000}
QUICK_JOBS = {PLAIN: 100_000, FAIR[1]: 60_000, FAIR[100]: 60_000, FAIR[10_000]: 200_000}
BARS = {100: 0.5, 10_000: 0.25}


def _queues() -> list[tuple[str, int]]:
    return [(PLAIN, 0), *[(q, g) for g, q in FAIR.items()]]


def _insert(conn: psycopg.Connection[Any], queue: str, groups: int, n: int) -> None:
    conn.execute(
        "INSERT INTO pgjobs.jobs (kind, queue, group_key, payload)"
        " SELECT 'bench', %(q)s, CASE WHEN %(g)s > 0 THEN 'tenant-' || (i %% %(g)s) END, '{}'"
        " FROM generate_series(1, %(n)s) AS i",
        {"q": queue, "g": groups, "n": n},
    )


def _fill(dsn: str, jobs: dict[str, int]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for queue, groups in _queues():
            _insert(conn, queue, groups, jobs[queue])
            if groups:
                conn.execute("SELECT pgjobs.configure_queue(queue => %s, fair => true)", (queue,))
        conn.execute("VACUUM ANALYZE pgjobs.jobs")


def _top_up(dsn: str, jobs: dict[str, int]) -> None:
    """Every queue back to its starting depth (outside the timed part; the groups keep their even spread)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for queue, groups in _queues():
            row = conn.execute(
                "SELECT count(*) FROM pgjobs.jobs WHERE state = 'pending' AND queue = %s", (queue,)
            ).fetchone()
            missing = jobs[queue] - (row[0] if row else 0)
            if missing > 0:
                _insert(conn, queue, groups, missing)


def _vacuum(dsn: str) -> None:
    """What autovacuum does on a busy queue table, done before each round (outside the timed part): both
    paths walk their indexes past the entries of jobs already claimed until VACUUM removes them, and a shared
    bench server (or a starved autovacuum) would otherwise make the figures a measure of that backlog."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM pgjobs.jobs")
        # what the fair claim writes besides jobs: its ring (a row per claim) and the active ledger
        conn.execute("VACUUM pgjobs.fair_rings, pgjobs.cap_ledger")


def _measure(dsn: str, queue: str, size: int, conns: int, seconds: float) -> float:
    """Jobs claimed and completed per second on `queue` by `conns` connections for about `seconds`."""
    done: list[int] = []
    ready = threading.Barrier(conns + 1)
    deadline: list[float] = []

    def work() -> None:
        with connect(dsn, options="-c jit=off") as conn:
            n = 0
            ready.wait()
            stop = deadline[0]
            while time.perf_counter() < stop:
                rows = conn.execute(
                    "SELECT id, lease_token FROM pgjobs.claim(worker => 'bench', queues => %s, max_jobs => %s)",
                    ([queue], size),
                ).fetchall()
                if not rows:
                    break
                conn.execute(
                    "SELECT pgjobs.complete_many(ids => %s, lease_tokens => %s)",
                    ([r[0] for r in rows], [r[1] for r in rows]),
                )
                n += len(rows)
            done.append(n)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(conns)]
    for t in threads:
        t.start()
    deadline.append(time.perf_counter() + seconds)  # set before the barrier opens
    t0 = time.perf_counter()
    ready.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    return sum(done) / elapsed if elapsed > 0 else 0.0


def run(dsn: str, quick: bool = False) -> dict[str, Any]:
    seconds = 0.5 if quick else 1.5
    rounds = 3 if quick else 5
    combos = [(10, 1), (100, 1), (10, 4), (100, 4)]
    jobs = QUICK_JOBS if quick else JOBS
    _fill(dsn, jobs)
    # warm up: plans cached, the rings of the fair queues written
    for queue in [PLAIN, *FAIR.values()]:
        _measure(dsn, queue, 100, 1, 0.3 if quick else 1.0)

    figures = []
    raw: dict[str, Any] = {}
    for size, conns in combos:
        names = [PLAIN, *FAIR.values()]
        samples: dict[str, list[float]] = {q: [] for q in names}
        for r in range(rounds):
            _top_up(dsn, jobs)
            _vacuum(dsn)
            for q in names if r % 2 == 0 else list(reversed(names)):
                samples[q].append(_measure(dsn, q, size, conns, seconds))
        base = median(samples[PLAIN])
        raw[f"claim {size}, {conns} conn"] = samples
        figures.append(
            figure(f"plain claim+complete, claim {size}, {conns} conn", base, "jobs/s", note="unfair fast path")
        )
        for groups, q in FAIR.items():
            figures.append(
                figure(
                    f"fair claim+complete, {groups} group{'s' if groups > 1 else ''}, claim {size}, {conns} conn",
                    median(samples[q]),
                    "jobs/s",
                    baseline=base,
                    baseline_name=f"plain, claim {size}, {conns} conn",
                    bar=BARS.get(groups),
                )
            )
    return {
        "suite": "fairness",
        "figures": figures,
        "notes": [
            "SQL claim + complete_many per batch, autocommit, jit off on both sides, VACUUM before each round; "
            "medians of alternating rounds "
            f"({rounds} x {seconds} s per queue and setting).",
            f"queued at the start: plain {jobs[PLAIN]:,} ungrouped jobs; fair with 1 group {jobs[FAIR[1]]:,}, "
            f"100 groups {jobs[FAIR[100]]:,}, 10,000 groups {jobs[FAIR[10_000]]:,}.",
        ],
        "samples": raw,
    }
