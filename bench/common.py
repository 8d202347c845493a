"""What every bench suite shares: result figures, a throwaway database, timing helpers.

A suite is a module with ``run(dsn, quick=False) -> dict``. ``dsn`` points at a fresh database that
``python -m bench`` created and migrated for that suite alone (and drops afterwards), so a suite may
TRUNCATE, create tables and fill millions of rows without care. The dict it returns::

    {
        "suite": "core",
        "figures": [  # one per table row; build them with figure()
            {"name": "enqueue, one per commit", "value": 2950.0, "unit": "jobs/s",
             "baseline": 3600.0, "baseline_name": "bare INSERT, one per commit",
             "ratio": 0.82, "bar": 0.8, "bar_kind": "min", "passed": True, "note": "..."},
        ],
        "notes": ["free text shown under the table"],
        ...  # anything else (raw samples, parameters) goes to the JSON file as is
    }

``ratio`` is value / baseline. ``bar`` is the bar that ratio must reach (``bar_kind`` "min") or stay
under (``bar_kind`` "max"); without a bar, ``passed`` is None (an informational figure).
"""

from __future__ import annotations

import contextlib
import secrets
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

Figure = dict[str, Any]


def figure(
    name: str,
    value: float,
    unit: str,
    *,
    baseline: float | None = None,
    baseline_name: str | None = None,
    bar: float | None = None,
    bar_kind: str = "min",
    ratio: float | None = None,
    note: str = "",
) -> Figure:
    """One row of the results table. ``ratio`` defaults to value / baseline."""
    if ratio is None and baseline:
        ratio = value / baseline
    passed: bool | None = None
    if bar is not None and ratio is not None:
        passed = ratio >= bar if bar_kind == "min" else ratio <= bar
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_name": baseline_name,
        "ratio": ratio,
        "bar": bar,
        "bar_kind": bar_kind,
        "passed": passed,
        "note": note,
    }


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def percentile(xs: Sequence[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[k]


def connect(dsn: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """An autocommit connection that prepares every statement on first use (as a worker's would after
    a few calls), so the figures measure the server, not the parse."""
    kwargs.setdefault("autocommit", True)
    conn: psycopg.Connection[Any] = psycopg.connect(dsn, **kwargs)
    conn.prepare_threshold = 0
    return conn


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def alternate(
    runs: dict[str, Callable[[], float]], rounds: int, between: Callable[[], None] | None = None
) -> dict[str, list[float]]:
    """Runs each named measurement ``rounds`` times, alternating A/B/A/B (the order flips every round so
    neither side always goes first), and returns the samples per name. Medians of these resist the noise
    of a shared machine far better than one long run of each."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            if between is not None:
                between()
            samples[name].append(runs[name]())
    return samples


def interleaved(calls: dict[str, Callable[[], Any]], n: int, chunk: int) -> dict[str, list[float]]:
    """Calls each function ``n`` times, taking turns call by call (the order flips every turn), and
    returns per-name rates (calls/s) over chunks of ``chunk`` calls. Taking turns this finely puts both
    sides under the same load at every moment, so their ratio holds even while the machine is busy."""
    names = list(calls)
    spent: dict[str, list[float]] = {name: [] for name in names}
    acc = dict.fromkeys(names, 0.0)
    clock = time.perf_counter
    for i in range(n):
        for name in names if i % 2 == 0 else reversed(names):
            t0 = clock()
            calls[name]()
            acc[name] += clock() - t0
        if (i + 1) % chunk == 0 or i == n - 1:
            done = chunk if (i + 1) % chunk == 0 else (i + 1) % chunk
            for name in names:
                spent[name].append(done / acc[name])
                acc[name] = 0.0
    return spent


@contextlib.contextmanager
def fresh_database(server_dsn: str, suite: str, migrate: bool = True) -> Iterator[str]:
    """CREATE DATABASE bench_<suite>_<random>, migrated with pgjobs; dropped WITH (FORCE) afterwards."""
    name = f"bench_{suite}_{secrets.token_hex(3)}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(server_dsn, dbname=name)
    try:
        if migrate:
            from pgjobs.ops.migrate import migrate as do_migrate

            do_migrate(dsn)
        yield dsn
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def server_settings(dsn: str) -> dict[str, str]:
    """The settings that decide the figures, recorded with them."""
    names = (
        "server_version",
        "fsync",
        "synchronous_commit",
        "full_page_writes",
        "wal_level",
        "shared_buffers",
        "max_wal_size",
        "wal_sync_method",
        "commit_delay",
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT name, setting FROM pg_settings WHERE name = ANY (%s)", (list(names),)).fetchall()
    return {str(n): str(s) for n, s in rows}
