"""``python -m bench peers``: pgjobs and its peers side by side, in one run, on the same server.

Peers: procrastinate, pgqueuer (asyncpg) and awa (awa-pg), each through its own documented public API
and defaults (see :mod:`bench.peer_adapters`), each in a fresh database of its own; oban-py is skipped
below Python 3.12. A bare psycopg INSERT (one row per commit, and 1,000 rows per statement) is measured
beside them as the floor for the two enqueue phases. Install the peers with
``pip install -e '.[bench-peers]'``; a peer whose package is missing is skipped with a message.

Phases, each repeated ``--repeat`` times (the median is reported), the systems taking turns within each
repetition so that they share the machine's load:

* enqueue one by one: ``--n``/10 jobs, one call and one commit each, in turns of 50 calls per system.
* bulk: ``--n`` jobs in calls of 1,000 (pgjobs ``enqueue_many``, pgqueuer ``enqueue`` of lists,
  procrastinate ``batch_defer_async``, awa ``insert_many_copy``), taking turns call by call.
* processing with 1 and 2 worker processes: the workers start and are warmed up on an empty queue, then
  ``--n`` no-op jobs arrive in one call (one commit); the rate is the jobs between the first and the last
  handler start over that time, stamped by the handlers on the clock all processes share.
* pickup latency: one idle worker process; ``--samples`` times, one job is enqueued and the figure is its
  handler's start minus the moment the enqueue call returned (after its commit); p50 and p95.

Worker concurrency is the same for every system (``--concurrency``, default 10: pgjobs' and pgqueuer's
default; procrastinate's default of 1 would measure something else). The machine is shared: read the
ratios, which the turn-taking keeps comparable, more than the absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import multiprocessing
import multiprocessing.context
import os
import random
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .common import fresh_database, percentile
from .peer_adapters import ADAPTERS, missing, stamp

PEERS = ("pgjobs", "pgqueuer", "procrastinate", "awa", "oban")
PHASES = ("one_by_one", "bulk", "process_1", "process_2", "pickup_p50")
TITLES = {
    "one_by_one": "enqueue 1-by-1 jobs/s",
    "bulk": "bulk 1,000/call jobs/s",
    "process_1": "processing 1 proc jobs/s",
    "process_2": "processing 2 procs jobs/s",
    "pickup_p50": "pickup p50 ms",
}
CHUNK = 1000
_CTX = multiprocessing.get_context("spawn")


class Shared:
    """Counters the worker processes' handlers update (shared memory) and the bench reads."""

    def __init__(self, ctx: multiprocessing.context.SpawnContext) -> None:
        self.count = ctx.Value("q", 0)
        self.first = ctx.Value("d", 0.0, lock=False)
        self.last = ctx.Value("d", 0.0, lock=False)
        self.started = ctx.Event()
        self.stop = ctx.Event()

    def done(self) -> None:
        now = stamp()
        with self.count.get_lock():
            self.count.value += 1
            if self.first.value == 0.0:
                self.first.value = now
            self.last.value = now
        self.started.set()

    def zero(self) -> None:
        with self.count.get_lock():
            self.count.value = 0
            self.first.value = 0.0
            self.last.value = 0.0


def _child(name: str, dsn: str, concurrency: int, shared: Shared) -> None:
    asyncio.run(ADAPTERS[name]().work(dsn, concurrency, shared, shared.stop))


async def _wait_count(shared: Shared, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while shared.count.value < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {shared.count.value} of {n} jobs ran within {timeout:.0f} s")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def _workers(adapter: Any, name: str, dsn: str, procs: int, concurrency: int) -> Any:
    """``procs`` worker processes of ``name``, started and warmed up on an empty queue."""
    await adapter.reset()
    shared = Shared(_CTX)
    ps = [_CTX.Process(target=_child, args=(name, dsn, concurrency, shared), daemon=True) for _ in range(procs)]
    for p in ps:
        p.start()
    try:
        warm = 20 * procs
        for _ in range(warm):
            await adapter.enqueue_one()
        await _wait_count(shared, warm, 120)
        await asyncio.sleep(0.5)  # every worker back to idle
        shared.zero()
        yield shared
    finally:
        shared.stop.set()
        for p in ps:
            p.join(30)
            if p.is_alive():
                p.terminate()
                p.join(5)


async def _processing(adapter: Any, name: str, dsn: str, procs: int, n: int, concurrency: int) -> float:
    async with _workers(adapter, name, dsn, procs, concurrency) as shared:
        await adapter.enqueue_bulk(n)
        await _wait_count(shared, n, 600)
        return float((n - 1) / (shared.last.value - shared.first.value))


async def _pickup(adapter: Any, name: str, dsn: str, samples: int, concurrency: int) -> list[float]:
    out: list[float] = []
    loop = asyncio.get_running_loop()
    async with _workers(adapter, name, dsn, 1, concurrency) as shared:
        for i in range(samples + 3):
            await asyncio.sleep(random.uniform(0.005, 0.025))  # the worker is idle, waiting, each time
            shared.started.clear()
            await adapter.enqueue_one()
            returned = stamp()
            if not await loop.run_in_executor(None, shared.started.wait, 10.0):
                raise RuntimeError(f"{name}: a job was not picked up within 10 s")
            if i >= 3:
                out.append((shared.last.value - returned) * 1000)
    return out


async def _one_by_one(adapters: dict[str, Any], calls: int, turn: int = 50) -> dict[str, float]:
    spent = dict.fromkeys(adapters, 0.0)
    names = list(adapters)
    for t in range(max(1, calls // turn)):
        for name in names if t % 2 == 0 else reversed(names):
            a = adapters[name]
            t0 = time.perf_counter()
            for _ in range(turn):
                await a.enqueue_one()
            spent[name] += time.perf_counter() - t0
    done = max(1, calls // turn) * turn
    return {name: done / s for name, s in spent.items()}


async def _bulk(adapters: dict[str, Any], n: int) -> dict[str, float]:
    spent = dict.fromkeys(adapters, 0.0)
    names = list(adapters)
    calls = max(1, n // CHUNK)
    for c in range(calls):
        for name in names if c % 2 == 0 else reversed(names):
            t0 = time.perf_counter()
            await adapters[name].enqueue_bulk(CHUNK)
            spent[name] += time.perf_counter() - t0
    return {name: calls * CHUNK / s for name, s in spent.items()}


async def _run(server_dsn: str, names: list[str], args: argparse.Namespace) -> dict[str, Any]:
    samples: dict[str, dict[str, list[float]]] = {n: {p: [] for p in PHASES} for n in names}
    latencies: dict[str, list[float]] = {n: [] for n in names}
    errors: list[str] = []
    with contextlib.ExitStack() as stack:
        dsns = {n: stack.enter_context(fresh_database(server_dsn, f"peers_{n}", migrate=n == "pgjobs")) for n in names}
        adapters = {n: ADAPTERS[n]() for n in names}
        for n in names:
            await adapters[n].open(dsns[n])
        queues = [n for n in names if n != "bare"]
        try:
            for r in range(args.repeat):
                print(f"repeat {r + 1}/{args.repeat}", flush=True)
                if "enqueue" in args.phases:
                    for name, rate in (await _one_by_one(adapters, max(50, args.n // 10))).items():
                        samples[name]["one_by_one"].append(rate)
                    for name, rate in (await _bulk(adapters, args.n)).items():
                        samples[name]["bulk"].append(rate)
                order = queues if r % 2 == 0 else list(reversed(queues))
                for procs in (1, 2) if "process" in args.phases else ():
                    for name in order:
                        try:
                            rate = await _processing(adapters[name], name, dsns[name], procs, args.n, args.concurrency)
                        except Exception as exc:  # one broken peer must not hide the others' figures
                            errors.append(f"{name}: processing, {procs} proc(s): {type(exc).__name__}: {exc}")
                            print(f"  {errors[-1]}", flush=True)
                            continue
                        samples[name][f"process_{procs}"].append(rate)
                        print(f"  {name}: processing, {procs} proc(s): {rate:,.0f} jobs/s", flush=True)
                for name in order if "pickup" in args.phases else ():
                    try:
                        lat = await _pickup(adapters[name], name, dsns[name], args.samples, args.concurrency)
                    except Exception as exc:
                        errors.append(f"{name}: pickup: {type(exc).__name__}: {exc}")
                        print(f"  {errors[-1]}", flush=True)
                        continue
                    latencies[name].extend(lat)
                    samples[name]["pickup_p50"].append(percentile(lat, 50))
                for a in adapters.values():
                    await a.reset()
        finally:
            for a in adapters.values():
                await a.close()
    return {"samples": samples, "latency_ms": latencies, "errors": errors}


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _ratio(samples: dict[str, dict[str, list[float]]], a: str, b: str, phase: str) -> float | None:
    """Median over the repetitions of a's figure / b's in the same repetition: the systems took turns
    within a repetition, so this cancels most of the drift of a shared machine between repetitions."""
    pairs = [(x, y) for x, y in zip(samples[a][phase], samples[b][phase], strict=False) if y]
    return statistics.median(x / y for x, y in pairs) if pairs else None


def _table(names: list[str], samples: dict[str, dict[str, list[float]]]) -> list[str]:
    med = {n: {p: _median(samples[n][p]) for p in PHASES} for n in names}
    head = f"{'system':<16}" + "".join(f"{TITLES[p]:>30}" for p in PHASES)
    lines = [head, "-" * len(head)]
    for n in names:
        cells = []
        for p in PHASES:
            v = med[n][p]
            if v is None:
                cells.append(f"{'-':>30}")
                continue
            text = f"{v:,.2f}" if p == "pickup_p50" else f"{v:,.0f}"
            r = _ratio(samples, "pgjobs", n, p) if n != "pgjobs" and "pgjobs" in samples else None
            if r is not None:
                text += f"  (pgjobs/x {r:.2f})"
            cells.append(f"{text:>30}")
        lines.append(f"{n:<16}" + "".join(cells))
    return lines


def _bars(names: list[str], samples: dict[str, dict[str, list[float]]]) -> list[dict[str, Any]]:
    """The issue's bars, each a median of per-repetition ratios (see _ratio); against "the best peer" the
    peer is the one with the best median figure."""
    if "pgjobs" not in samples:
        return []
    med = {n: {p: _median(samples[n][p]) for p in PHASES} for n in names}
    peers = [n for n in names if n not in ("pgjobs", "bare")]
    out: list[dict[str, Any]] = []

    def bar(what: str, other: str, phase: str, need: float, kind: str = "min") -> None:
        ratio = _ratio(samples, "pgjobs", other, phase)
        if ratio is not None:
            passed = ratio >= need if kind == "min" else ratio < need
            out.append({"bar": f"{what} ({other})", "ratio": ratio, "need": need, "passed": passed})

    if "pgqueuer" in med:
        bar("one-by-one vs pgqueuer", "pgqueuer", "one_by_one", 1.3)
    if "bare" in med:
        bar("one-by-one vs bare one-row INSERT", "bare", "one_by_one", 0.8)
        bar("bulk vs bare 1,000-row INSERT", "bare", "bulk", 0.5)
    if peers:
        for phase, what in (
            ("bulk", "bulk"),
            ("process_1", "processing, 1 proc"),
            ("process_2", "processing, 2 procs"),
        ):
            best = max(peers, key=lambda n: med[n][phase] or 0.0)
            bar(f"{what} vs the best peer", best, phase, 2.0 if phase == "bulk" else 1.5)
        lowest = min(peers, key=lambda n: med[n]["pickup_p50"] or float("inf"))
        bar("pickup p50 vs the lowest peer's, below 1 passes", lowest, "pickup_p50", 1.0, "max")
    return out


def _spread(samples: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Per system and phase, (max - min) / median of the repetitions: how noisy the run was."""
    return {
        n: {p: (max(v) - min(v)) / statistics.median(v) for p, v in ph.items() if len(v) > 1 and statistics.median(v)}
        for n, ph in samples.items()
    }


@contextlib.contextmanager
def _server(dsn: str | None) -> Iterator[str]:
    if dsn or os.environ.get("PGJOBS_DSN"):
        yield dsn or os.environ["PGJOBS_DSN"]
        return
    from pgjobs.ops import embedded

    started = embedded.start()
    try:
        yield started
    finally:
        embedded.stop()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench peers", description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", help="PostgreSQL server (default: $PGJOBS_DSN, else the embedded server)")
    p.add_argument("--n", type=int, default=10_000, help="jobs per bulk and processing phase (default 10,000)")
    p.add_argument("--repeat", type=int, default=3, help="repetitions; medians are reported (default 3)")
    p.add_argument("--samples", type=int, default=50, help="pickup samples per repetition (default 50)")
    p.add_argument("--concurrency", type=int, default=10, help="worker concurrency for every system (default 10)")
    p.add_argument(
        "--phases",
        type=lambda v: {x.strip() for x in v.split(",")},
        default={"enqueue", "process", "pickup"},
        help="comma-separated phases among enqueue, process, pickup (default: all)",
    )
    p.add_argument("--only", metavar="NAMES", help=f"comma-separated systems (default: {','.join(PEERS)},bare)")
    p.add_argument("--json", metavar="PATH", help="where to write the results (default: bench/results/peers-*.json)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    wanted = [s.strip() for s in args.only.split(",")] if args.only else [*PEERS, "bare"]
    names, skipped = [], {}
    for n in wanted:
        if n not in ADAPTERS and n != "oban":
            print(f"unknown system {n!r}; choose from {', '.join([*PEERS, 'bare'])}", file=sys.stderr)
            return 2
        why = missing(n)
        if why:
            skipped[n] = why
        else:
            names.append(n)
    for n, why in skipped.items():
        print(f"- {n}: skipped ({why})")
    started = dt.datetime.now(dt.UTC)
    with _server(args.dsn) as server_dsn:
        result = asyncio.run(_run(server_dsn, names, args))
    lines = _table(names, result["samples"])
    bars = _bars(names, result["samples"])
    print("\n" + "\n".join(lines))
    print(
        f"\nmedians of {args.repeat} repetitions; n = {args.n:,}; concurrency {args.concurrency}; {os.cpu_count()} CPUs"
    )
    for b in bars:
        print(f"  {'pass' if b['passed'] else 'FAIL'}  {b['bar']}: {b['ratio']:.2f} (bar {b['need']})")
    for e in result["errors"]:
        print(f"  ERROR {e}")
    spread = _spread(result["samples"])
    worst = max((v for ph in spread.values() for v in ph.values()), default=0.0)
    print(f"  noise: the widest spread of a cell over its repetitions is {worst:.0%} of its median")
    path = (
        Path(args.json)
        if args.json
        else Path(__file__).resolve().parent / "results" / (f"peers-{started.strftime('%Y%m%dT%H%M%SZ')}.json")
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"started_at": started.isoformat(), "args": vars(args), "skipped": skipped, "bars": bars, "spread": spread}
    path.write_text(json.dumps({**doc, **result}, indent=2, default=str))
    print(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
