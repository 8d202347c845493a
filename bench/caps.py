"""Capped queues at the cap's speed: ``python -m bench --only caps``.

One worker (concurrency 10, the default poll interval) is given 20 jobs of 0.2 s on a queue with no cap, with
``max_active => 5``, fair with ``max_active_per_group => 5`` on one group, and fair with
``max_active_per_group => 1`` on two groups. A capped queue runs at the speed of its cap when every end of a
job lets a worker with free slots claim again at once; it runs at the speed of the poll when a claim cut short
by the cap waits for the poll.

Each figure is the seconds from the enqueue (the jobs' ``created_at``) to the last completion
(``completed_at``), the median over the rounds, beside the ideal (jobs / min(concurrency, cap) rounds of
0.2 s); its bar is the issue's target, at most twice the ideal plus 0.5 s, as a ratio to the ideal. The
notes give the worker's claims by what started them, and the jobs they took (``poll``: a claim the poll
fallback started; a capped queue at its cap's speed needs none; ``ended``: the worker's own end of a job of the
capped queue; ``wake``: a ``pgjobs_wake``, its own completions' included).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import anyio
import psycopg
from psycopg.types.json import Jsonb

import pgjobs

from .common import figure, median

JOBS = 20
SECONDS = 0.2
CONCURRENCY = 10
# (name, configure_queue arguments, groups the jobs are spread over, jobs that may run at once)
CASES: list[tuple[str, dict[str, Any], list[str | None], int]] = [
    ("no cap", {}, [None], CONCURRENCY),
    ("max_active 5", {"max_active": 5}, [None], 5),
    ("fair, max_active_per_group 5, one group", {"fair": True, "max_active_per_group": 5}, ["g"], 5),
    ("fair, max_active_per_group 1, two groups", {"fair": True, "max_active_per_group": 1}, ["a", "b"], 2),
]

app = pgjobs.App()


@app.job("sleep")
async def sleep(payload: Any, ctx: pgjobs.JobContext) -> None:
    await anyio.sleep(SECONDS)


def ideal(at_once: int) -> float:
    return math.ceil(JOBS / min(CONCURRENCY, at_once)) * SECONDS


def _setup(dsn: str, queue: str, config: dict[str, Any]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if config:
            args = ", ".join(f"{k} => %({k})s" for k in config)
            conn.execute(f"SELECT pgjobs.configure_queue(queue => %(queue)s, {args})", {"queue": queue, **config})


async def _enqueue(dsn: str, queue: str, groups: list[str | None]) -> None:
    specs = [{"kind": "sleep", "queue": queue, "group_key": groups[i % len(groups)]} for i in range(JOBS)]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("SELECT count(*) FROM pgjobs.enqueue_many(jobs => %s)", [Jsonb(specs)])


def _span(dsn: str, queue: str) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM max(completed_at) - min(created_at))::float8, count(*) FILTER"
            " (WHERE state <> 'succeeded') FROM pgjobs.jobs WHERE queue = %s",
            [queue],
        ).fetchone()
    assert row is not None and row[1] == 0, f"queue {queue}: {row}"
    return float(row[0])


def _one(
    dsn: str, queue: str, config: dict[str, Any], groups: list[str | None]
) -> tuple[float, Counter[str], Counter[str]]:
    """One round of one case on a queue of its own: (seconds, the worker's claims and the jobs they took, by
    trigger)."""
    _setup(dsn, queue, config)
    worker = pgjobs.Worker(app, dsn, {queue: CONCURRENCY}, scheduler=False, vacuum=False)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(30):
                while worker.claim_calls < 1:  # started, and its first claim (an empty one) answered
                    await anyio.sleep(0.01)
            await _enqueue(dsn, queue, groups)
            try:
                with anyio.fail_after(300):
                    while worker.completed < JOBS:
                        await anyio.sleep(0.01)
            finally:
                worker.stop()

    anyio.run(main)
    claims: Counter[str] = Counter(getattr(worker, "claims_by_trigger", {}))
    jobs: Counter[str] = Counter(getattr(worker, "claimed_by_trigger", {}))
    return _span(dsn, queue), claims, jobs


def run(dsn: str, quick: bool = False) -> dict[str, Any]:
    rounds = 1 if quick else 3
    figures = []
    notes = []
    raw: dict[str, list[float]] = {}
    for i, (name, config, groups, at_once) in enumerate(CASES):
        samples: list[float] = []
        claims: Counter[str] = Counter()
        jobs: Counter[str] = Counter()
        for r in range(rounds):
            took, made, took_jobs = _one(dsn, f"caps_{i}_{r}", config, groups)
            samples.append(took)
            claims += made
            jobs += took_jobs
        raw[name] = samples
        best = ideal(at_once)
        figures.append(
            figure(
                f"{JOBS} jobs of {SECONDS} s, {name}", median(samples), "s", baseline=best,
                baseline_name=f"ideal ({best:.1f} s)", bar=(2 * best + 0.5) / best, bar_kind="max",
            )
        )  # fmt: skip
        if claims:
            told = ", ".join(f"{k} {v} ({jobs[k]} jobs)" for k, v in sorted(claims.items()))
            notes.append(f"{name}: claims by trigger over {rounds} round(s): {told}")
    return {"suite": "caps", "figures": figures, "notes": notes, "raw": raw}
