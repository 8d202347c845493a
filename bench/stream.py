"""The status-stream suite (``python -m bench --only stream``): the worker suite's subscriber rows alone.

One worker process at concurrency 50 runs N no-op jobs at full speed, without and with one live subscriber
(``bench/_follower.py``: ``client.subscribe(queue=...)`` in a separate process) and the probe (bench/worker.py's
:class:`~bench.worker.Probe`: an event every 2-8 ms whose commit instant is known), alternating, ``rounds``
times each (the probe runs in both, so that the ratio is the subscriber's cost alone). Figures: the
throughput with the subscriber against without (bar 0.9x), and the delivery time
commit -> subscriber p50 (bar 10 ms) and p99 (bar 50 ms), plus the worker's own events from their ``at``.

``BENCH_STREAM_TRACE=1`` also splits the delivery time (the notes): the follower times each read_events
round trip and each hint's arrival, and the database counts the stream functions' calls and time
(``track_functions``, which costs every function call a clock read: the throughput rows of a traced run are
not comparable with an untraced one).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from . import worker
from .common import connect, figure, median, percentile, server_settings

FUNCTIONS = ("_append_events", "_read_events", "_tick_events", "_wait_stream_lock", "_mark_follower")


def _split(runs: list[worker.Delivery]) -> list[str]:
    """Where each probe's delivery time went, from the follower's trace (see _follower.py)."""
    parts: dict[str, list[float]] = {k: [] for k in ("wait", "statement", "convert", "commit", "build", "hand")}
    missed = 0  # reads that started after the commit but did not return the probe
    why: dict[str, int] = {}
    reads_n: list[int] = []
    for r in runs:
        if r.trace is None:
            continue
        reads = sorted(r.trace["reads"])
        reads_n += [int(x[5]) for x in reads]
        for job_id, c in r.probe_commits.items():
            got = r.received.get(job_id)
            if got is None:
                continue
            # The read that delivered it: the last one that ended before the receipt.
            done = [x for x in reads if x[4] <= got + 1e-6]
            if not done:
                continue
            t0, t1, t2, t3, t4, _, reason = done[-1]
            for k, v in zip(parts, (t0 - c, t1 - t0, t2 - t1, t3 - t2, t4 - t3, got - t4), strict=True):
                parts[k].append(v)
            missed += sum(1 for x in reads if c < x[0] < t0)
            why[reason] = why.get(reason, 0) + 1
    n = len(parts["wait"])
    if not n:
        return []
    text = "; ".join(
        f"{k} {percentile(v, 50) * 1000:.1f}/{percentile(v, 99) * 1000:.1f}/{sum(v) / n * 1000:.1f}"
        for k, v in parts.items()
    )
    return [
        f"split over {n} probes (ms, p50/p99/mean): {text} (wait: commit -> start of the read that returned it; "
        "statement: read_events' tick and read and the transfer; convert: psycopg's rows; commit: the tick's "
        "WAL flush; build: StatusEvents; hand: to the consumer)",
        f"reads that started after a probe's commit but did not return it: {missed} "
        f"({missed / n:.2f} per probe); the delivering read was woken by: {why}",
        f"follower reads: {len(reads_n)}, rows per read p50 {percentile(reads_n, 50):.0f}, "
        f"max {max(reads_n) if reads_n else 0}",
    ]


def _functions(dsn: str) -> list[str]:
    with connect(dsn) as conn:
        rows = conn.execute(
            "SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions"
            " WHERE schemaname = 'pgjobs' AND funcname = ANY (%s) ORDER BY funcname",
            [list(FUNCTIONS)],
        ).fetchall()
    return [
        f"{name}: {calls} calls, mean total {total / calls * 1000:.0f} us, self {own / calls * 1000:.0f} us"
        for name, calls, total, own in rows
        if calls
    ]


def idle_delivery(dsn: str, seconds: float) -> list[float]:
    """Commit -> receipt with no worker running: probes 20-40 ms apart, so the follower has gone idle (its last
    read empty: writers hint) before each one. The hint path: writer's NOTIFY, wake-up, tick, read."""
    out = Path(f"/tmp/pgjobs-bench-idle-{os.getpid()}.json")
    with connect(dsn) as conn:
        # Ids for the last run's events (nobody followed it: only maintenance ticked, every 5 s). A follower
        # starts at the head of the log as it was before its first read ticked, so it would first read
        # those (up to 5 s of a worker at full speed), and the first probes would measure that.
        conn.execute("SELECT count(*) FROM pgjobs.maintain()")
    follow = worker._start_follower(dsn, out)
    probe = worker.Probe(dsn, spacing=(0.02, 0.04))
    try:
        with connect(dsn) as conn:
            worker._wait_follower(conn, follow)
        probe.start()
        time.sleep(seconds)
        probe.stop()
        time.sleep(0.5)
        got = worker._stop_follower(follow, out)
    except BaseException:
        follow.kill()
        raise
    received = {int(k): float(v) for k, v in got["probes"].items()}
    return [received[i] - c for i, c in probe.commits.items() if i in received]


def run(dsn: str, quick: bool = False) -> dict[str, Any]:
    n = 10_000 if quick else 50_000
    rounds = 1 if quick else int(os.environ.get("BENCH_STREAM_ROUNDS", "3"))
    trace = bool(os.environ.get("BENCH_STREAM_TRACE"))
    if trace:
        os.environ["BENCH_FOLLOWER_TRACE"] = "1"
        with connect(dsn) as conn:
            db = conn.execute("SELECT current_database()").fetchone()
            assert db is not None
            conn.execute(f'ALTER DATABASE "{db[0]}" SET track_functions = pl')
    alone: list[float] = []
    followed: list[float] = []
    worker.DELIVERIES.clear()
    fn_notes: list[str] = []
    for r in range(rounds):
        for sub in (False, True) if r % 2 == 0 else (True, False):
            if trace and sub:
                with connect(dsn) as conn:
                    conn.execute("SELECT pg_stat_reset()")
            (followed if sub else alone).append(worker.throughput(dsn, n, 1, 50, "all", True, sub, with_probe=True))
            if trace and sub:
                fn_notes += _functions(dsn)
    idle = idle_delivery(dsn, 2.0 if quick else 6.0)
    no_sub, with_sub = median(alone), median(followed)
    figures = [
        figure("worker no-op jobs/s, 1 process, concurrency 50, no subscriber", no_sub, "jobs/s"),
        figure(
            "worker no-op jobs/s, the same with one subscriber following the queue", with_sub, "jobs/s",
            baseline=no_sub, baseline_name="no subscriber", bar=0.9,
            note="the subscriber is a separate process (client.subscribe(queue=...)) on the same 2 cores",
        ),
        *worker.delivery_figures(worker.DELIVERIES),
        figure(
            "status event delivery p50 (commit -> idle subscriber: the hint path)",
            percentile(idle, 50) * 1000 if idle else float("nan"), "ms", note=f"{len(idle)} probes, no worker",
        ),
        figure(
            "status event delivery p99 (commit -> idle subscriber: the hint path)",
            percentile(idle, 99) * 1000 if idle else float("nan"), "ms",
        ),
    ]  # fmt: skip
    runs = worker.DELIVERIES
    cpu_f = sum(r.cpu.get("follower", 0.0) for r in runs)
    cpu_b = sum(r.cpu.get("backend", 0.0) for r in runs)
    notes = [
        f"median of {rounds} run(s) each, alternating; {n:,} jobs per run",
        f"the subscriber's CPU per run: {cpu_f / max(1, len(runs)):.2f} s in its process, "
        f"{cpu_b / max(1, len(runs)):.2f} s in its backend",
        "2 cores shared by PostgreSQL, the worker, the subscriber and the bench itself",
    ]
    if trace:
        notes += _split(worker.DELIVERIES) + fn_notes
    return {
        "suite": "stream",
        "figures": figures,
        "notes": notes,
        "samples": {"no subscriber": alone, "subscriber": followed, "idle_delivery_ms": [x * 1000 for x in idle]},
        "cpu": [r.cpu for r in runs],
        "traces": [r.trace for r in worker.DELIVERIES if r.trace is not None],
        "server": server_settings(dsn),
    }
