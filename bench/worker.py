"""The worker suite: jobs through the real worker (``pgjobs.Worker`` in worker processes), end to end.

* **Throughput**: N no-op jobs are enqueued into a paused queue, the worker process(es) start and go idle,
  the queue is unpaused (and woken); the figure is N / (last ``completed_at`` - the unpause), both server
  timestamps. Configurations: one process at concurrency 10 and 50, two processes at 50 each; status
  events ``all`` (the default) and ``none`` (``configure_queue(status_events => 'none')``). Each runs
  ``rounds`` times, alternating; the median is reported. One more (informational) configuration runs the
  single process with ``durable_completions=False``, and one with a live subscriber: a separate process
  (``bench/_follower.py``) following the queue with ``client.subscribe(queue=...)``, which also gives the
  event delivery figures (receipt time minus the event's ``at``; every event must arrive).
* **Wake latency**: an idle worker (one process, concurrency 10); 200 times, one job is enqueued (one
  autocommit ``enqueue`` call) and the handler returns ``time.time()`` at its start, stored as the job's
  result; the sample is that minus the server's clock at the end of the enqueue statement, which commits
  right after it (see :func:`wake_latency`).
  Between samples the bench waits (reading the status stream on each pgjobs_status hint, not polling) for
  the job to finish and a random 5-25 ms more, so the worker is asleep on its LISTEN connection each time.

The machine has 2 cores shared by PostgreSQL, the worker process(es) and this bench.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from .common import Figure, connect, figure, median, percentile, server_settings

QUEUE = "bench"
LATENCY_QUEUE = "latency"
PROBE_KIND = "probe"
HERE = Path(__file__).resolve().parent
BAR_JOBS_PER_S = 10_000.0
BAR_P50_MS = 2.0
BAR_P99_MS = 20.0


def _start_workers(
    dsn: str, n: int, queue: str, concurrency: int, durable: bool = True
) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "bench._worker_app", dsn, queue, str(concurrency)]
    if not durable:
        cmd.append("non-durable-completions")
    return [
        subprocess.Popen(cmd, cwd=HERE.parent, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(n)
    ]


def _wait_ready(conn: psycopg.Connection[Any], procs: list[subprocess.Popen[bytes]], timeout: float = 30) -> None:
    """Until every process registered (worker_heartbeat) and listens."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgjobs-listen:%%'"
            " AND datname = current_database()"
        ).fetchone()
        if row is not None and row[0] >= len(procs):
            time.sleep(0.3)  # the claimers' first (empty) claims
            return
        for p in procs:
            if p.poll() is not None:
                err = p.stderr.read().decode(errors="replace")[-2000:] if p.stderr else ""
                raise RuntimeError(f"bench worker exited with {p.returncode}: {err}")
        time.sleep(0.05)
    raise RuntimeError("bench workers did not start in time")


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


def _fill(conn: psycopg.Connection[Any], n: int, groups: int = 0) -> None:
    """n no-op jobs on QUEUE; with ``groups``, spread over that many group keys (a fair queue's)."""
    conn.execute("TRUNCATE pgjobs.jobs CASCADE")
    conn.execute("DELETE FROM pgjobs.workers")
    for done in range(0, n, 5000):
        spec = [
            {"kind": "noop", "queue": QUEUE, **({"group_key": f"g{i % groups}"} if groups else {})}
            for i in range(done, min(n, done + 5000))
        ]
        conn.execute("SELECT count(*) FROM pgjobs.enqueue_many(%s::jsonb)", [json.dumps(spec)])
    conn.execute("VACUUM ANALYZE pgjobs.jobs")


def _start_follower(dsn: str, out: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "bench._follower", dsn, QUEUE, PROBE_KIND, str(out)]
    return subprocess.Popen(cmd, cwd=HERE.parent, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_follower(conn: psycopg.Connection[Any], proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Until the follower has subscribed: its LISTEN connection made its first read (from the head of the log)
    and waits. (A fixed sleep is not enough on a loaded machine: events committed before it subscribes would
    wait for its start-up, and their delays would measure that.)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgjobs-subscribe'"
            " AND datname = current_database() AND state = 'idle' AND query LIKE '%%read_events%%'"
        ).fetchone()
        if row is not None and row[0] >= 1:
            return
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
            raise RuntimeError(f"the follower exited with {proc.returncode}: {err}")
        time.sleep(0.02)
    raise RuntimeError("the follower did not subscribe in time")


def _stop_follower(proc: subprocess.Popen[bytes], out: Path) -> dict[str, Any]:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise RuntimeError("the follower did not stop") from None
    if not out.exists():
        err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
        raise RuntimeError(f"the follower wrote nothing: {err}")
    data: dict[str, Any] = json.loads(out.read_text())
    out.unlink()
    return data


class Probe(threading.Thread):
    """Commits a status event every 2-8 ms while the worker runs, and knows each one's commit instant: the
    server's clock_timestamp() at the end of an autocommit ``enqueue`` (a PROBE_KIND job in the worker's
    queue, scheduled an hour ahead: nothing wakes or claims it), committed with synchronous_commit off, so
    the commit and its visibility to readers follow at once. The follower's receipt time of that job's
    event minus this is the delivery time from commit (the figure the bar is about); the worker's own
    events only carry their transaction's start."""

    def __init__(self, dsn: str, spacing: tuple[float, float] = (0.002, 0.008)) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.spacing = spacing
        self.commits: dict[int, float] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        with connect(self.dsn) as conn:
            conn.execute("SET synchronous_commit = off")
            while not self.stopping.wait(random.uniform(*self.spacing)):
                row = conn.execute(
                    "SELECT e.id, extract(epoch FROM clock_timestamp())::float8"
                    " FROM pgjobs.enqueue(kind => %s, queue => %s, run_at => now() + interval '1 hour') AS e",
                    [PROBE_KIND, QUEUE],
                ).fetchone()
                assert row is not None
                self.commits[int(row[0])] = float(row[1])

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)


class Delivery:
    """One follower run: events of the worker seen (every job's active and succeeded: 2 per job), their
    delays from ``at``, the probes' delays from their commit, the probes committed and received."""

    def __init__(self, jobs: int, got: dict[str, Any], probe: Probe) -> None:
        self.jobs = jobs
        self.events = int(got["events"])
        self.from_at = [float(d) for d in got["delays"]]
        received = {int(k): float(v) for k, v in got["probes"].items()}
        self.received = received
        self.probe_commits = dict(probe.commits)
        self.probes = len(probe.commits)
        self.probes_seen = sum(1 for i in probe.commits if i in received)
        self.from_commit = [received[i] - c for i, c in probe.commits.items() if i in received]
        self.trace: dict[str, Any] | None = got.get("trace")
        self.cpu: dict[str, float] = got.get("cpu") or {}

    @property
    def complete(self) -> bool:
        return self.events >= 2 * self.jobs and self.probes_seen == self.probes


DELIVERIES: list[Delivery] = []  # per follower run


def throughput(
    dsn: str,
    n_jobs: int,
    processes: int,
    concurrency: int,
    events: str,
    durable: bool = True,
    follower: bool = False,
    groups: int = 0,
    with_probe: bool | None = None,
    max_active: int | None = None,
) -> float:
    """Jobs/s for one configuration (see the module docstring); ``groups``: a fair queue with that many;
    ``max_active``: the queue capped at that many active jobs (None: no cap; each call sets or lifts it).
    ``with_probe`` (default: with the follower) runs :class:`Probe` during the run: the stream suite runs it
    without the follower too, so that the ratio of the two runs measures the subscriber alone, not the
    probe's 200 enqueues a second on the same cores."""
    with connect(dsn) as conn:
        conn.execute(
            "SELECT pgjobs.configure_queue(%s, paused => true, status_events => %s, fair => %s, max_active => %s)",
            [QUEUE, events, groups > 0, max_active or 0],
        )
        conn.execute("TRUNCATE pgjobs.stream_followers")
        _fill(conn, n_jobs, groups)
        conn.execute("SELECT count(*) FROM pgjobs.maintain()")  # the fill's events ticked: not the follower's
        procs = _start_workers(dsn, processes, QUEUE, concurrency, durable)
        out = Path(f"/tmp/pgjobs-bench-follower-{os.getpid()}.json")
        follow = _start_follower(dsn, out) if follower else None
        probe = Probe(dsn) if (follower if with_probe is None else with_probe) else None
        try:
            if follow is not None:
                _wait_follower(conn, follow)  # subscribed (it starts at the head of the log)
            _wait_ready(conn, procs)
            if probe is not None:
                probe.start()
            row = conn.execute(
                "SELECT now() FROM pgjobs.configure_queue(%s, paused => false), pg_notify('pgjobs_wake', %s)",
                [QUEUE, QUEUE],
            ).fetchone()
            assert row is not None
            t0 = row[0]
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                time.sleep(0.1)
                left = conn.execute(
                    "SELECT EXISTS (SELECT 1 FROM pgjobs.jobs WHERE state IN ('pending', 'active') AND queue = %s)",
                    [QUEUE],
                ).fetchone()
                if left is not None and not left[0]:
                    break
            else:
                raise RuntimeError("the bench jobs did not finish in 300 s")
            row = conn.execute(
                "SELECT count(*), extract(epoch FROM max(completed_at) - %s) FROM pgjobs.jobs"
                " WHERE state = 'succeeded' AND queue = %s",
                [t0, QUEUE],
            ).fetchone()
            assert row is not None
            done, seconds = int(row[0]), float(row[1])
            if done != n_jobs:
                raise RuntimeError(f"{done} of {n_jobs} bench jobs succeeded")
            if follow is not None and probe is not None:
                probe.stop()
                time.sleep(0.5)  # the last events on their way
                got = _stop_follower(follow, out)
                follow = None
                DELIVERIES.append(Delivery(n_jobs, got, probe))
            return n_jobs / seconds
        finally:
            if probe is not None:
                probe.stop()
            _stop(procs)
            if follow is not None:
                follow.kill()
                follow.wait(5)
            conn.execute("TRUNCATE pgjobs.stream_followers")


def _head(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT coalesce((SELECT newest_id FROM pgjobs.stream_head()), 0)").fetchone()
    return int(row[0]) if row else 0


def wake_latency(dsn: str, samples: int = 200) -> list[float]:
    """Seconds from enqueue commit to handler start, ``samples`` times, idle worker each time.

    The commit instant is the server's clock_timestamp() at the end of the enqueue statement, committed with
    synchronous_commit off: the commit follows at once, and the NOTIFY goes out with it. (With a durable
    commit the NOTIFY waits for the WAL flush; that is the producer's commit cost, not the worker's wake-up.
    And a client-side clock read after the call returns is late by however long the bench process waits
    for a core, which on a loaded 2-core machine is often more than the latency measured.)"""
    with connect(dsn) as conn:
        conn.execute("TRUNCATE pgjobs.jobs CASCADE")
        conn.execute("SET synchronous_commit = off")
        listen = psycopg.connect(dsn, autocommit=True)
        listen.execute("LISTEN pgjobs_status")
        procs = _start_workers(dsn, 1, LATENCY_QUEUE, 10)
        try:
            _wait_ready(conn, procs)
            out: list[float] = []
            cursor = _head(listen)
            for i in range(samples + 5):
                time.sleep(random.uniform(0.005, 0.025))
                row = conn.execute(
                    "SELECT e.id, extract(epoch FROM clock_timestamp())::float8"
                    " FROM pgjobs.enqueue(kind => 'stamp', queue => %s) AS e",
                    [LATENCY_QUEUE],
                    prepare=True,
                ).fetchone()
                assert row is not None
                job_id, committed = row
                started = None
                # Wait on the status stream's hints (reading read_events after each) rather than polling: the
                # bench then uses no CPU while the worker wakes up, claims and runs the job.
                deadline = time.monotonic() + 10
                while started is None and time.monotonic() < deadline:
                    rows = listen.execute(
                        "SELECT event_id, state::text FROM pgjobs.read_events(after_id => %s, job_ids => ARRAY[%s])",
                        [cursor, job_id],
                    ).fetchall()
                    for event_id, state in rows:
                        cursor = max(cursor, event_id)
                        if state == "succeeded":
                            r = conn.execute("SELECT result FROM pgjobs.jobs WHERE id = %s", [job_id]).fetchone()
                            started = float(r[0]) if r is not None else None
                    if started is None:
                        for _ in listen.notifies(timeout=0.5, stop_after=1):
                            pass
                if started is None:
                    raise RuntimeError(f"latency job {job_id} did not run")
                if i >= 5:  # the first few warm up the prepared statements
                    out.append(started - committed)
            return out
        finally:
            _stop(procs)
            listen.close()


def _figures(names: list[str], tput: dict[str, float], p50: float, p99: float) -> list[Figure]:
    """The suite's table rows (names: the configurations, in run()'s order)."""
    one_all = tput[names[1]]
    one_none = tput[names[2]]
    two_all = tput[names[3]]
    two_none = tput[names[4]]
    figures: list[Figure] = [
        figure(
            "worker no-op jobs/s, " + names[0], tput[names[0]], "jobs/s",
            note="informational (the bar is for one process; concurrency 10 caps each claim at 10 jobs)",
        ),
        figure(
            "worker no-op jobs/s, " + names[1], one_all, "jobs/s",
            baseline=BAR_JOBS_PER_S, baseline_name="the bar: 10,000 jobs/s", bar=1.0,
        ),
        figure(
            "worker no-op jobs/s, " + names[2], one_none, "jobs/s",
            baseline=BAR_JOBS_PER_S, baseline_name="the bar: 10,000 jobs/s", bar=1.0,
        ),
        figure(
            "worker no-op jobs/s, " + names[3], two_all, "jobs/s",
            baseline=one_all, baseline_name="one process (events all)", bar=1.0,
            note="two processes must do more than one",
        ),
        figure(
            "worker no-op jobs/s, " + names[4], two_none, "jobs/s",
            baseline=one_none, baseline_name="one process (events none)", bar=1.0,
        ),
        figure(
            "worker no-op jobs/s, " + names[5], tput[names[5]], "jobs/s",
            baseline=one_all, baseline_name="durable completions (the default)",
            note="informational: completions committed without waiting for the WAL flush (opt-in)",
        ),
        figure(
            "worker no-op jobs/s, " + names[6], tput[names[6]], "jobs/s",
            baseline=one_all, baseline_name="no subscriber", bar=0.9,
            note="the subscriber is a separate process (client.subscribe(queue=...)) on the same 2 cores",
        ),
        *delivery_figures(DELIVERIES),
        figure(
            "wake latency p50 (enqueue commit -> handler start, idle worker)", p50, "ms",
            baseline=BAR_P50_MS, baseline_name="the bar: 2 ms", bar=1.0, bar_kind="max",
        ),
        figure(
            "wake latency p99 (enqueue commit -> handler start, idle worker)", p99, "ms",
            baseline=BAR_P99_MS, baseline_name="the bar: 20 ms", bar=1.0, bar_kind="max",
        ),
    ]  # fmt: skip
    return figures


def delivery_figures(runs: list[Delivery]) -> list[Figure]:
    """The subscriber's delivery rows: commit -> receipt (the probes; the bars), and the worker's own events
    from their ``at`` (transaction start -> receipt: informational, it also counts the transaction)."""
    commit = [d for r in runs for d in r.from_commit]
    at = [d for r in runs for d in r.from_at]
    complete = bool(runs) and all(r.complete for r in runs)
    note = f"{len(commit)} probe commits" + ("; every event delivered" if complete else "; EVENTS MISSING")

    def ms(xs: list[float], p: float) -> float:
        return percentile(xs, p) * 1000 if xs else float("nan")

    return [
        figure(
            "status event delivery p50 (commit -> subscriber, worker at full speed)", ms(commit, 50), "ms",
            baseline=10.0, baseline_name="the bar: 10 ms", bar=1.0, bar_kind="max", note=note,
        ),
        figure(
            "status event delivery p99 (commit -> subscriber, worker at full speed)", ms(commit, 99), "ms",
            baseline=50.0, baseline_name="the bar: 50 ms", bar=1.0, bar_kind="max",
        ),
        figure(
            "status event delivery p50 (the worker's events: transaction start -> subscriber)", ms(at, 50), "ms",
            note="informational: `at` is the transition's now(), so this includes its statement and commit",
        ),
        figure(
            "status event delivery p99 (the worker's events: transaction start -> subscriber)", ms(at, 99), "ms",
        ),
    ]  # fmt: skip


def run(dsn: str, quick: bool = False) -> dict[str, Any]:
    n50 = 10_000 if quick else 50_000
    n10 = 5_000 if quick else 20_000
    rounds = 1 if quick else 5
    configs = [
        ("1 process, concurrency 10, status events all", 1, 10, "all", n10, True, False),
        ("1 process, concurrency 50, status events all", 1, 50, "all", n50, True, False),
        ("1 process, concurrency 50, status events none", 1, 50, "none", n50, True, False),
        ("2 processes, concurrency 50 each, status events all", 2, 50, "all", n50, True, False),
        ("2 processes, concurrency 50 each, status events none", 2, 50, "none", n50, True, False),
        ("1 process, concurrency 50, status events all, durable_completions=False", 1, 50, "all", n50, False, False),
        ("1 process, concurrency 50, status events all, one subscriber following the queue", 1, 50, "all", n50,
         True, True),
    ]  # fmt: skip
    samples: dict[str, list[float]] = {c[0]: [] for c in configs}
    DELIVERIES.clear()
    for r in range(rounds):
        for name, procs, conc, events, n, durable, follower in configs if r % 2 == 0 else reversed(configs):
            samples[name].append(throughput(dsn, n, procs, conc, events, durable, follower))
    tput = {name: median(v) for name, v in samples.items()}
    lat = wake_latency(dsn, 50 if quick else 200)
    p50, p99 = percentile(lat, 50) * 1000, percentile(lat, 99) * 1000

    figures = _figures([c[0] for c in configs], tput, p50, p99)
    return {
        "suite": "worker",
        "figures": figures,
        "notes": [
            f"throughput: median of {rounds} run(s) per configuration, alternating; {n50:,} jobs "
            f"({n10:,} at concurrency 10) enqueued into a paused queue, timed from the unpause to the last "
            "completed_at (server clock)",
            f"wake latency over {len(lat)} samples: min {min(lat) * 1000:.2f} ms, max {max(lat) * 1000:.2f} ms",
            "2 cores shared by PostgreSQL, the worker process(es) and the bench itself",
        ],
        "samples": {"throughput": samples, "wake_latency_ms": [x * 1000 for x in lat]},
        "server": server_settings(dsn),
    }
