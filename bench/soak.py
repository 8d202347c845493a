"""``python -m bench soak``: a fixed offered rate through one worker process for minutes, and how it holds up.

First the worker's clean maximum is measured (a fresh database, 20,000 no-op jobs, one process at concurrency
50, on the same kind of queue as the soak's: plain, fair, capped, or fair and capped), unless ``--rate`` gives the
offered rate; the soak offers 60 % of it (``--share``) for ``--minutes`` (default 10) on a fresh database: a
producer thread enqueues every 100 ms, one worker process (the real ``pgjobs.Worker``, concurrency 50) runs the
jobs, and a probe claims one job every 200 ms to time a claim under the same table (its job is completed at
once). Every 10 s it prints:

* completion rate (jobs/s run in the window: the worker process's count of its handlers' runs, plus the probe's),
* claim p50/p99: the probe's claim call, and the wait of the job it got (now - run_at: the queue delay),
* queue depth (jobs enqueued and not yet run: the producer's count less the worker's and the probe's; the
  worker writes its count every 200 ms, so a window's depth may read up to 0.2 s of the offered rate high).
  Not a ``count(*)`` over the jobs table: a held snapshot makes that a scan of every dead version (113 ms and
  25,000 blocks read from outside shared_buffers 70 s into a hold at 11,800 jobs/s, growing with the hold),
  which the worker would pay for on the same 2 cores. The exact count is taken once, at the end (a 10-minute
  hold: 1,261,448 counted against 1,261,476 from the counters),
* ``n_dead_tup`` and total size of every pgjobs table (partitions summed into their parent, but for the slots
  of ``fair_rings`` and ``claim_floors``, which are emptied one at a time by TRUNCATE and shown apart): those
  over 16 kB or with dead tuples, and on a capped or fair queue ``cap_ledger`` and ``cap_checkpoints`` always
  (the active ledger its claims read and its jobs' moves write: sql/caps.sql).

``--idle-tx SECONDS`` holds a foreign snapshot (``BEGIN; SELECT txid_current();`` then nothing) for that long
in the middle of the run, and the end prints the soak's bars over whole periods: the probe's claim p50/p99
over every claim before the snapshot and over every claim while it was held (a 10 s window's p99 of some 50
probe claims is its slowest claim), and the share of the offered rate done in the last 20 s of the hold.
``--fair`` runs on a fair queue with 100 groups. ``--capped N`` caps the queue at ``max_active => N`` (N is 40
when omitted: under the worker's concurrency of 50, so the cap binds); with ``--fair`` the queue is both fair and
capped. The first line printed names the kind of queue, and the results record it (``fair``, ``capped``,
``queue_kind``). ``--functions`` adds a third line per window: the pgjobs PL/pgSQL functions with the most self
time in it, over every session (the worker's claimer above all): where a claimer that falls behind spends its
time. Results go to
``bench/results/soak-<timestamp>.json`` (``--json``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import psycopg
from psycopg import sql

from .common import connect, fresh_database, percentile
from .worker import HERE, throughput

QUEUE = "soak"
WINDOW = 10.0
GROUPS = 100  # --fair: the fair queue's groups
CAPPED = 40  # --capped without N: under the worker's concurrency (50), so the cap binds
LEDGER_TABLES = ("cap_ledger", "cap_checkpoints")  # shown in every window on a capped or fair queue
_TABLES_SQL = """
SELECT coalesce(CASE WHEN p.relname IN ('fair_rings', 'claim_floors') THEN c.relname END, p.relname, c.relname)
       AS tbl, sum(coalesce(s.n_dead_tup, 0))::bigint,
       sum(pg_total_relation_size(c.oid))::bigint, sum(coalesce(s.n_live_tup, 0))::bigint
  FROM pg_class AS c
  JOIN pg_namespace AS n ON n.oid = c.relnamespace AND n.nspname = 'pgjobs'
  LEFT JOIN pg_inherits AS i ON i.inhrelid = c.oid
  LEFT JOIN pg_class AS p ON p.oid = i.inhparent
  LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
 WHERE c.relkind = 'r'
 GROUP BY 1 ORDER BY 3 DESC
"""


def _cap(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"--capped must be at least 1 (max_active 0 is no cap), got {n}")
    return n


def _kind(fair: bool, capped: int | None) -> str:
    """The soak queue's kind, as the header says it."""
    kinds = ([f"fair ({GROUPS} groups)"] if fair else []) + ([f"max_active {capped}"] if capped else [])
    return ", ".join(kinds) or "plain"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default=os.environ.get("PGJOBS_DSN"), help="server (default $PGJOBS_DSN)")
    p.add_argument("--rate", type=float, help="offered jobs/s (default: --share of the clean maximum, measured)")
    p.add_argument("--share", type=float, default=0.6, help="share of the clean maximum to offer (default 0.6)")
    p.add_argument("--minutes", type=float, default=10.0, help="how long to offer the rate (default 10)")
    p.add_argument("--idle-tx", type=float, default=0.0, metavar="SECONDS", help="hold a snapshot that long, mid-run")
    p.add_argument("--fair", action="store_true", help="a fair queue with 100 groups")
    p.add_argument(
        "--capped",
        type=_cap,
        nargs="?",
        const=CAPPED,
        metavar="N",
        help=f"cap the queue at max_active N (N defaults to {CAPPED}: under the worker's concurrency of 50, so the"
        " cap binds; combines with --fair)",
    )
    p.add_argument("--concurrency", type=int, default=50, help="the worker's concurrency (default 50)")
    p.add_argument("--json", metavar="PATH", help="where to write the results")
    p.add_argument(
        "--trace", metavar="PATH", help="log the probe's PL/pgSQL function statistics per claim (JSON lines)"
    )
    p.add_argument(
        "--functions", action="store_true", help="per window, the pgjobs PL/pgSQL functions' self time (all sessions)"
    )
    return p


class Producer(threading.Thread):
    """Enqueues ``rate`` jobs/s in enqueue_many calls every 100 ms (the fractional rest carries over)."""

    def __init__(self, dsn: str, rate: float, fair: bool) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rate, self.fair = dsn, rate, fair
        self.stop = threading.Event()
        self.enqueued = 0
        self.behind = 0.0  # seconds the producer could not keep up with its schedule, in total

    def run(self) -> None:
        with connect(self.dsn) as conn:
            start = time.monotonic()
            tick = 0
            while not self.stop.is_set():
                tick += 1
                due = int(self.rate * tick * 0.1) - self.enqueued
                if due > 0:
                    n0 = self.enqueued
                    specs: list[dict[str, Any]] = [{"kind": "noop", "queue": QUEUE} for _ in range(due)]
                    if self.fair:
                        for i, spec in enumerate(specs):
                            spec["group_key"] = f"g{(n0 + i) % GROUPS}"
                    conn.execute("SELECT count(*) FROM pgjobs.enqueue_many(%s::jsonb)", [json.dumps(specs)])
                    self.enqueued += due
                wait = start + tick * 0.1 - time.monotonic()
                if wait > 0:
                    self.stop.wait(wait)
                else:
                    self.behind -= wait


_TRACE_SQL = "SELECT funcname, calls, self_time FROM pg_stat_xact_user_functions WHERE schemaname = 'pgjobs' ORDER BY 1"


def _trace(conn: psycopg.Connection[Any], log: IO[str], since: float, took: float) -> None:
    """One JSON line of --trace: the claim's time and, per pgjobs PL/pgSQL function, its calls and self time
    (ms) in the probe's session since the session's statistics were last flushed (at most once a second:
    diff consecutive lines; a line whose counts went down follows a flush). Ends the claim's transaction."""
    rows = conn.execute(_TRACE_SQL).fetchall()
    conn.execute("COMMIT")
    functions = {str(r[0]): [int(r[1]), round(float(r[2]), 2)] for r in rows}
    line = {"t": round(time.monotonic() - since, 2), "took_ms": round(took * 1000, 2), "functions": functions}
    log.write(json.dumps(line) + "\n")


class Probe(threading.Thread):
    """Claims one job every 200 ms (and completes it): the claim call's time and the job's queue delay. With
    ``trace`` (a path), each claim runs in a transaction that then reads the session's function statistics
    (_trace), so its time leaves out the commit."""

    def __init__(self, dsn: str, trace: Path | None = None) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.trace = trace
        self.stop = threading.Event()
        self.samples: list[tuple[float, float, float | None]] = []  # (monotonic, claim seconds, wait seconds)
        self.completed = 0

    def run(self) -> None:
        since = time.monotonic()
        with connect(self.dsn) as conn, self.trace.open("w") if self.trace else contextlib.nullcontext() as log:
            # (its own query's subplan is costed on jobs_live's primary key, which a held snapshot bloats: past
            # jit_above_cost it was JIT-compiled at every call, 8-10 ms of each claim timed for 100 s of a hold)
            conn.execute("SET jit = off")
            if log is not None:
                conn.execute("SET track_functions = 'pl'")
            while not self.stop.wait(0.2):
                if log is not None:
                    conn.execute("BEGIN")
                t0 = time.perf_counter()
                row = conn.execute(
                    # (the live states: with jobs partitioned by state, a lookup by id alone visits every
                    # history slice, and its Append over them costs enough to JIT-compile this query on
                    # every call, 20-30 ms: the probe would time its own JIT, not the claim)
                    "SELECT c.id, c.lease_token,"
                    " (SELECT extract(epoch FROM clock_timestamp() - j.run_at)::float8 FROM pgjobs.jobs AS j"
                    "   WHERE j.id = c.id AND j.state IN ('waiting', 'scheduled', 'pending', 'active'))"
                    " FROM pgjobs.claim(worker => 'probe', queues => ARRAY[%s], max_jobs => 1) AS c",
                    [QUEUE],
                ).fetchone()
                took = time.perf_counter() - t0
                if log is not None:
                    _trace(conn, log, since, took)
                wait = None if row is None or row[2] is None else float(row[2])
                self.samples.append((time.monotonic(), took, wait))
                if row is not None:
                    conn.execute("SELECT pgjobs.complete(id => %s, lease_token => %s)", [row[0], row[1]])
                    self.completed += 1


class IdleTx(threading.Thread):
    """``BEGIN; SELECT txid_current();`` then nothing for ``hold`` seconds, starting after ``delay``."""

    def __init__(self, dsn: str, delay: float, hold: float) -> None:
        super().__init__(daemon=True)
        self.dsn, self.delay, self.hold = dsn, delay, hold
        self.began: float | None = None
        self.ended: float | None = None

    def run(self) -> None:
        time.sleep(self.delay)
        with psycopg.connect(self.dsn) as conn:
            conn.execute("SELECT txid_current()")
            self.began = time.monotonic()
            time.sleep(self.hold)
            conn.rollback()
            self.ended = time.monotonic()


_FUNCTIONS_SQL = (
    "SELECT funcname, sum(calls)::bigint, sum(self_time)::float8 FROM pg_stat_user_functions"
    " WHERE schemaname = 'pgjobs' GROUP BY 1"
)


class Functions:
    """--functions: the database's PL/pgSQL function statistics (every session: the worker's claimer and completer,
    the probe, the producer; each backend flushes them at most once a second), as deltas per window: what the
    server's time went into while the worker kept up, and while it fell behind. Costs every call a clock read."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        db = conn.execute("SELECT current_database()").fetchone()
        conn.execute(sql.SQL("ALTER DATABASE {} SET track_functions = pl").format(sql.Identifier(db[0] if db else "")))
        self.conn = conn
        self.last = self._read()

    def _read(self) -> dict[str, tuple[int, float]]:
        return {str(r[0]): (int(r[1]), float(r[2])) for r in self.conn.execute(_FUNCTIONS_SQL).fetchall()}

    def window(self, top: int = 8) -> list[dict[str, Any]]:
        """The ``top`` functions by self time since the previous call: name, calls, self ms."""
        now = self._read()
        delta = [
            (name, c - self.last.get(name, (0, 0.0))[0], t - self.last.get(name, (0, 0.0))[1])
            for name, (c, t) in now.items()
        ]
        self.last = now
        delta.sort(key=lambda d: -d[2])
        return [{"function": n, "calls": c, "self_ms": round(t, 1)} for n, c, t in delta[:top] if c > 0]


def _depth(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pgjobs.jobs WHERE queue = %s AND state IN ('pending', 'active', 'scheduled')", [QUEUE]
    ).fetchone()
    return int(row[0]) if row else 0


def _ran(count_file: Path) -> int:
    """Jobs the worker's handlers have run (bench/_worker_app.py writes it every 200 ms)."""
    try:
        return int(count_file.read_text() or 0)
    except FileNotFoundError:
        return 0


def _start_worker(dsn: str, concurrency: int, log: Path, count_file: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["PGJOBS_BENCH_COUNT_FILE"] = str(count_file)
    cmd = [sys.executable, "-m", "bench._worker_app", dsn, QUEUE, str(concurrency)]
    with log.open("wb") as out:  # a file, not a pipe nobody reads: a chatty worker would block on a full pipe
        return subprocess.Popen(cmd, cwd=HERE.parent, env=env, stdout=subprocess.DEVNULL, stderr=out)


def _window(probe: Probe, since: float) -> dict[str, float | None]:
    got = [s for s in probe.samples if s[0] >= since]
    claims = [s[1] for s in got]
    waits = [s[2] for s in got if s[2] is not None]
    return {
        "claim_p50_ms": percentile(claims, 50) * 1000 if claims else None,
        "claim_p99_ms": percentile(claims, 99) * 1000 if claims else None,
        "wait_p50_ms": percentile(waits, 50) * 1000 if waits else None,
        "wait_p99_ms": percentile(waits, 99) * 1000 if waits else None,
    }


def _summary(probe: Probe, idle: IdleTx | None, windows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's bars over whole periods, not 10 s windows (a window's p99 of ~50 probe claims is its
    slowest claim): the probe's claim p50/p99 over every claim before the snapshot and over every claim
    while it was held, and what was done in the last 20 s of the hold against what was offered."""
    if idle is None or idle.began is None:
        return {}
    began, ended = idle.began, idle.ended if idle.ended is not None else float("inf")
    clean = [s[1] for s in probe.samples if s[0] < began]
    held = [s[1] for s in probe.samples if began <= s[0] < ended]
    last = [w for w in windows if w["snapshot_held"]][-2:]
    out: dict[str, Any] = {
        "clean_claim_p50_ms": percentile(clean, 50) * 1000 if clean else None,
        "clean_claim_p99_ms": percentile(clean, 99) * 1000 if clean else None,
        "held_claim_p50_ms": percentile(held, 50) * 1000 if held else None,
        "held_claim_p99_ms": percentile(held, 99) * 1000 if held else None,
        "held_end_done_share": sum(w["completed_per_s"] for w in last) / sum(w["offered_per_s"] for w in last)
        if last
        else None,
        "held_min_window_done_share": min(
            (w["completed_per_s"] / w["offered_per_s"] for w in windows if w["snapshot_held"] and w["offered_per_s"]),
            default=None,
        ),
    }
    if out["clean_claim_p99_ms"] and out["held_claim_p99_ms"]:
        out["held_p99_vs_clean"] = out["held_claim_p99_ms"] / out["clean_claim_p99_ms"]
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _print_window(w: dict[str, Any], always: tuple[str, ...] = ()) -> None:
    """A window's lines: rates, depth and the probe's figures; the tables' dead tuples and sizes (those over
    16 kB or with dead tuples, and the ``always`` ones); with --functions, the functions with the most self time."""
    print(
        f"t={w['t']:6.1f}s{' [snapshot held]' if w['snapshot_held'] else ''}  done {w['completed_per_s']:7.0f}/s"
        f" (offered {w['offered_per_s']:6.0f}/s)  depth {w['depth']:6d}  claim p50/p99"
        f" {_ms(w['claim_p50_ms'])}/{_ms(w['claim_p99_ms'])} ms  wait p50/p99"
        f" {_ms(w['wait_p50_ms'])}/{_ms(w['wait_p99_ms'])} ms",
        flush=True,
    )
    shown = (
        f"{t['table']} {t['dead']}d/{t['bytes'] // 1024}k"
        for t in w["tables"]
        if t["bytes"] > 16384 or t["dead"] > 0 or t["table"] in always
    )
    print("    " + "  ".join(shown), flush=True)
    if w.get("functions"):
        print("    fn: " + "  ".join(f"{f['function']} {f['calls']}x/{f['self_ms']:.0f}ms" for f in w["functions"]))


def _stop(producer: Producer, probe: Probe, worker: subprocess.Popen[bytes]) -> None:
    producer.stop.set()
    probe.stop.set()
    producer.join(10)
    probe.join(10)
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()


def soak(
    dsn: str,
    rate: float,
    minutes: float,
    idle_tx: float,
    fair: bool,
    concurrency: int,
    trace: Path | None = None,
    functions: bool = False,
    capped: int | None = None,
) -> dict[str, Any]:
    with connect(dsn) as conn:
        if fair or capped:
            conn.execute("SELECT pgjobs.configure_queue(%s, fair => %s, max_active => %s)", [QUEUE, fair, capped])
        always = LEDGER_TABLES if fair or capped else ()
        funcs = Functions(conn) if functions else None  # before the worker connects: its sessions track too
        worker_log = Path(f"/tmp/pgjobs-soak-worker-{os.getpid()}.log")
        count_file = Path(f"/tmp/pgjobs-soak-worker-{os.getpid()}.count")
        count_file.unlink(missing_ok=True)
        worker = _start_worker(dsn, concurrency, worker_log, count_file)
        producer, probe = Producer(dsn, rate, fair), Probe(dsn, trace)

        def ran_so_far() -> int:
            return _ran(count_file) + probe.completed

        total = minutes * 60
        idle = IdleTx(dsn, max(0.0, (total - idle_tx) / 2), idle_tx) if idle_tx > 0 else None
        windows: list[dict[str, Any]] = []
        try:
            time.sleep(2.0)  # the worker is up
            start = time.monotonic()
            producer.start()
            probe.start()
            if idle is not None:
                idle.start()
            last_ran, last_enq, last_t = ran_so_far(), 0, start
            while time.monotonic() - start < total:
                time.sleep(max(0.0, last_t + WINDOW - time.monotonic()))
                now = time.monotonic()
                ran, enq = ran_so_far(), producer.enqueued
                done, depth = ran - last_ran, max(0, enq - ran)
                held = idle is not None and idle.began is not None and (idle.ended is None or idle.ended > last_t)
                tables = [
                    {"table": t, "dead": d, "bytes": b, "live": live}
                    for t, d, b, live in conn.execute(_TABLES_SQL).fetchall()
                ]
                w: dict[str, Any] = {
                    "t": round(now - start, 1), "completed_per_s": done / (now - last_t),
                    "offered_per_s": (enq - last_enq) / (now - last_t), "depth": depth, "snapshot_held": held,
                    **_window(probe, last_t), "tables": tables,
                }  # fmt: skip
                if funcs is not None:
                    w["functions"] = funcs.window()
                windows.append(w)
                _print_window(w, always)
                last_ran, last_enq, last_t = ran, enq, now
        finally:
            _stop(producer, probe, worker)
        # the exact backlog, once (the windows' depth is the counters' difference): the two agree but for
        # jobs whose handler ran and whose completion did not commit before the worker stopped
        final_depth = _depth(conn)
        not_run = max(0, producer.enqueued - ran_so_far())
        print(f"end: {final_depth} jobs not terminal (counted), {not_run} not run (counters)")
        summary = _summary(probe, idle, windows)
        if summary:
            print(
                f"probe claim p50/p99: clean {_ms(summary['clean_claim_p50_ms'])}/{_ms(summary['clean_claim_p99_ms'])}"
                f" ms, held {_ms(summary['held_claim_p50_ms'])}/{_ms(summary['held_claim_p99_ms'])} ms"
                f" ({summary.get('held_p99_vs_clean', 0):.1f}x); done in the last 20 s held:"
                f" {summary['held_end_done_share'] or 0:.0%} of offered; the lowest 10 s window held:"
                f" {summary['held_min_window_done_share'] or 0:.0%}"
            )
    count_file.unlink(missing_ok=True)
    tail = worker_log.read_text(errors="replace")[-3000:] if worker_log.exists() else ""
    if tail:
        print(f"worker log ({worker_log}), last lines:\n{tail}")
    return {
        "windows": windows,
        "summary": summary,
        "final_depth": final_depth,
        "producer_behind_s": producer.behind,
        "worker_log_tail": tail,
    }


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if not args.dsn:
        print("soak needs --dsn or PGJOBS_DSN", file=sys.stderr)
        return 2
    kind = _kind(args.fair, args.capped)
    print(f"soak: queue {QUEUE!r}: {kind}; worker concurrency {args.concurrency}", flush=True)
    if args.capped is not None and args.capped >= args.concurrency:
        print(f"  (max_active {args.capped} >= concurrency {args.concurrency}: the cap does not bind)", flush=True)
    clean_max = None
    rate = args.rate
    if rate is None:
        with fresh_database(args.dsn, "soakmax") as dsn:
            # (the same kind of queue as the soak's: a fair queue of 100 groups, a cap, both; each is below the
            # plain queue's maximum)
            clean_max = throughput(
                dsn, 20_000, 1, args.concurrency, "all", groups=GROUPS if args.fair else 0, max_active=args.capped
            )
        rate = args.share * clean_max
        print(
            f"clean maximum ({kind}) {clean_max:.0f} jobs/s; offering {rate:.0f} jobs/s ({args.share:.0%})", flush=True
        )
    with fresh_database(args.dsn, "soak") as dsn:
        trace = Path(args.trace) if args.trace else None
        result = soak(
            dsn, rate, args.minutes, args.idle_tx, args.fair, args.concurrency, trace, args.functions, args.capped
        )
    result.update(
        clean_max=clean_max, rate=rate, minutes=args.minutes, idle_tx=args.idle_tx, fair=args.fair,
        capped=args.capped, queue_kind=kind, concurrency=args.concurrency,
    )  # fmt: skip
    out = Path(args.json) if args.json else HERE / "results" / f"soak-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    print(f"results: {out}")
    return 0
