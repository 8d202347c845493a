"""Rate limits at the limit's speed: ``python -m bench --only rate_limits``.

Four worker processes (``bench._worker_app``, concurrency 50 each, the default poll interval) are given a
backlog of no-op jobs limited to 50 starts a second, by their rate key or by their queue's limit, and run for
``SECONDS``. The starts are read back from SQL (each job's ``first_started_at``: the now() of the claim that
took its token). Two figures a case, as ratios to the limit:

* the mean rate over the limit (the bar: at least 0.95): the starts from the first up to, not including,
  the last one's time, over that span. For starts one at a time (a GCRA schedule) that is
  (starts - 1) / (last - first); a window's starts come in batches (the slots a batch took free together),
  and (starts - 1) / span would count the last batch without its time (the notes give it too);
* the most starts in any window of one second (sliding over the starts), over max_starts + burst: never
  above 1, or the limit was exceeded.

The notes give how many jobs were held back at least once (``rate_held_until`` set), and the rows of the
limiter left: the window's log of starts (one a start, less what the workers' maintenance deleted: it keeps
the newest max_starts + burst), or, on a GCRA build (a baseline run), its TAT rows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from .common import figure

HERE = Path(__file__).resolve().parent
LIMIT = 50
WORKERS = 4
CONCURRENCY = 50
# (name, key limit's burst or None for a queue limit)
CASES: list[tuple[str, int | None]] = [
    ("key, burst 0", 0),
    ("key, burst 1", 1),
    ("key, burst 5", 5),
    ("queue, burst 0", None),
]


def _start(dsn: str, queue: str) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "bench._worker_app", dsn, queue, str(CONCURRENCY)]
    return [
        subprocess.Popen(cmd, cwd=HERE.parent, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(WORKERS)
    ]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def most_in_a_window(times: list[datetime], seconds: float) -> int:
    """The most starts in any half-open window [t, t + seconds)."""
    ts = sorted(t.timestamp() for t in times)
    best, lo = 0, 0
    for hi, t in enumerate(ts):
        while ts[lo] <= t - seconds:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def _has_log(conn: psycopg.Connection[Any]) -> bool:
    """Whether the schema has the window's log (a GCRA build has its TAT rows instead: a baseline run)."""
    row = conn.execute("SELECT to_regclass('pgjobs.rate_starts') IS NOT NULL").fetchone()
    return bool(row and row[0])


def _one(dsn: str, i: int, burst: int | None, seconds: float, backlog: int) -> tuple[list[datetime], int, int]:
    """One case on a queue of its own: (the starts, jobs held back at least once, log rows left)."""
    queue = f"rate_{i}"
    key = f"api_{i}" if burst is not None else None
    with psycopg.connect(dsn, autocommit=True) as conn:
        if key is not None:
            conn.execute("SELECT pgjobs.configure_rate_limit(%s, %s, '1 second', %s)", (key, LIMIT, burst))
        else:
            conn.execute("SELECT pgjobs.configure_queue(%s, max_starts => %s, per => '1 second')", (queue, LIMIT))
        specs = [{"kind": "noop", "queue": queue, "rate_key": key} for _ in range(backlog)]
        for at in range(0, backlog, 5000):
            conn.execute("SELECT count(*) FROM pgjobs.enqueue_many(%s)", [Jsonb(specs[at : at + 5000])])
        procs = _start(dsn, queue)
        try:
            time.sleep(seconds)
        finally:
            _stop(procs)
        starts = [
            r[0]
            for r in conn.execute(
                "SELECT first_started_at FROM pgjobs.jobs WHERE queue = %s AND first_started_at IS NOT NULL", [queue]
            )
        ]
        limiter = "pgjobs.rate_starts" if _has_log(conn) else "pgjobs.rate_tats"
        row = conn.execute(
            "SELECT (SELECT count(*) FROM pgjobs.jobs WHERE queue = %s AND rate_held_until IS NOT NULL),"
            f" (SELECT count(*) FROM {limiter} WHERE key = %s)",
            (queue, key or queue),
        ).fetchone()
        assert row is not None
        return starts, int(row[0]), int(row[1])


def run(dsn: str, quick: bool = False) -> dict[str, Any]:
    seconds = 10.0 if quick else 60.0
    backlog = 1_000 if quick else 10_000
    figures = []
    notes = []
    raw: dict[str, Any] = {}
    for i, (name, burst) in enumerate(CASES):
        starts, held, logged = _one(dsn, i, burst, seconds, backlog)
        ts = sorted(starts)
        span = (ts[-1] - ts[0]).total_seconds() if len(ts) > 1 else float("nan")
        before_last = sum(1 for t in ts if t < ts[-1])
        mean = before_last / span if span and span > 0 else float("nan")
        mean_old = (len(ts) - 1) / span if span and span > 0 else float("nan")
        most = most_in_a_window(ts, 1.0)
        allowed = LIMIT + (burst or 0)
        raw[name] = {
            "starts": len(ts),
            "span_s": span,
            "mean_per_s": mean,
            "starts_minus_1_per_s": mean_old,
            "most_in_1s": most,
        }
        figures.append(
            figure(f"{name}: mean starts/s vs limit {LIMIT}/s", mean, "/s", baseline=float(LIMIT),
                   baseline_name=f"limit ({LIMIT}/s)", bar=0.95, bar_kind="min")
        )  # fmt: skip
        figures.append(
            figure(f"{name}: most starts in any 1 s vs {allowed}", float(most), "starts", baseline=float(allowed),
                   baseline_name=f"max_starts + burst ({allowed})", bar=1.0, bar_kind="max")
        )  # fmt: skip
        notes.append(
            f"{name}: {len(ts)} starts over {span:.1f} s by {WORKERS} workers x {CONCURRENCY}; "
            f"(starts - 1) / span {mean_old / LIMIT:.3f} of the limit; {held} jobs held back at least once; "
            f"{logged} rows of the limiter left (one a start, or a claim under GCRA, less what maintenance deleted)"
        )
    return {"suite": "rate_limits", "figures": figures, "notes": notes, "raw": raw}
