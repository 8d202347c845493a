"""Recurring: N due schedules materialised by 3 schedulers racing (separate processes).

The bar: 10,000 due schedules materialise within one minute of wall time with 3 schedulers
racing, each run exactly once. The schedules use three time zones (UTC, Europe/Paris, America/New_York)
and yearly crons, so each has exactly one due run. Every scheduler process runs the real
:class:`pgjobs.runtime.scheduler.Scheduler` pass (``SKIP LOCKED`` batches of 500, croniter in Python,
``materialize_schedules`` in SQL) until nothing is due; the clock starts when all three are ready.

Exactly once is checked three ways: jobs per (schedule, run time) (duplicates), schedules with no job
(missing), and the schedules the racers report having advanced (must sum to N: a run advanced twice
would show up here even though the unique key would keep its second job out).

The suite only touches schedules named ``bench-recurring-*`` and their jobs, and deletes them afterwards.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

PREFIX = "bench-recurring-"
SCHEDULERS = 3
BAR_SECONDS = 60.0
ZONES = ("UTC", "Europe/Paris", "America/New_York")
CRONS = ("0 0 1 1 *", "30 2 1 7 *", "15 4 2 3 *")


def _scheduler_process(dsn: str, start: Any, out: Any, batch_size: int) -> None:
    import anyio

    from pgjobs.runtime.scheduler import Scheduler

    async def main() -> tuple[int, int, int]:
        created = advanced = passes = 0
        async with Scheduler(dsn, batch_size=batch_size) as scheduler:
            await scheduler.next_wakeup()  # connected and warm before the start signal
            await anyio.to_thread.run_sync(start.wait)
            while True:
                c, a = await scheduler._tick()
                created, advanced, passes = created + c, advanced + a, passes + 1
                wake = await scheduler.next_wakeup()
                if not a and (wake is None or wake > scheduler.clock()):
                    return created, advanced, passes
                if not a:
                    await anyio.sleep(0.01)  # rows held by the other racers: they commit in a moment

    try:
        out.put(("ok", *anyio.run(main), time.perf_counter()))
    except BaseException as exc:  # reported to the parent, which fails the suite
        out.put(("error", repr(exc), 0, 0, time.perf_counter()))


def _cleanup(conn: psycopg.Connection[Any]) -> None:
    conn.execute("DELETE FROM pgjobs.jobs WHERE schedule_name LIKE %s", (PREFIX + "%",))
    conn.execute("DELETE FROM pgjobs.schedules WHERE name LIKE %s", (PREFIX + "%",))


def run(dsn: str, n: int = 10_000, quick: bool = False, batch_size: int = 500) -> dict[str, Any]:
    """Materialises ``n`` due schedules with 3 racing scheduler processes; returns the figures."""
    from pgjobs.ops.migrate import migrate

    if quick:
        n = min(n, 2_000)
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        _cleanup(conn)
        due_at = datetime.now(UTC) - timedelta(seconds=10)  # due now, and on time (within the grace period)
        t = time.perf_counter()
        conn.execute(
            "SELECT count(pgjobs.upsert_schedule(name => %(prefix)s || i, kind => 'bench.recurring',"
            " cron => (%(crons)s::text[])[1 + i %% 3], next_run_at => %(due)s,"
            " timezone => (%(zones)s::text[])[1 + (i / 3) %% 3], payload => jsonb_build_object('i', i)))"
            " FROM generate_series(1, %(n)s) AS i",
            {"prefix": PREFIX, "crons": list(CRONS), "zones": list(ZONES), "due": due_at, "n": n},
        )
        setup_s = time.perf_counter() - t

        ctx = mp.get_context("spawn")
        start = ctx.Event()
        out = ctx.Queue()
        procs = [
            ctx.Process(target=_scheduler_process, args=(dsn, start, out, batch_size), daemon=True)
            for _ in range(SCHEDULERS)
        ]
        for p in procs:
            p.start()
        # wait until every racer is connected (each has a backend on the database)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend'"
            ).fetchone()
            if row is not None and row[0] >= SCHEDULERS:
                break
            time.sleep(0.05)
        t0 = time.perf_counter()
        start.set()
        results = [out.get(timeout=600) for _ in procs]
        wall_s = max(r[4] for r in results) - t0
        for p in procs:
            p.join(timeout=30)

        errors = [r[1] for r in results if r[0] == "error"]
        jobs, distinct_runs, schedules_with_job = conn.execute(
            "SELECT count(*), count(DISTINCT (schedule_name, run_at)), count(DISTINCT schedule_name)"
            " FROM pgjobs.jobs WHERE schedule_name LIKE %s",
            (PREFIX + "%",),
        ).fetchone() or (0, 0, 0)
        still_due = (
            conn.execute(
                "SELECT count(*) FROM pgjobs.schedules WHERE name LIKE %s AND next_run_at <= now()", (PREFIX + "%",)
            ).fetchone()
            or (0,)
        )[0]
        _cleanup(conn)

    ok_results = [r for r in results if r[0] == "ok"]
    created = [int(r[1]) for r in ok_results]
    advanced = sum(int(r[2]) for r in ok_results)
    duplicates = jobs - distinct_runs
    missing = n - schedules_with_job
    exactly_once = not errors and duplicates == 0 and missing == 0 and advanced == n and sum(created) == n
    return {
        "suite": "recurring",
        "figures": [
            {
                "name": f"{n:,} due schedules materialised, {SCHEDULERS} schedulers racing",
                "value": wall_s,
                "unit": "s",
                "baseline": BAR_SECONDS,
                "baseline_name": "the bar: one minute",
                "ratio": wall_s / BAR_SECONDS,
                "bar": 1.0,
                "bar_kind": "max",
                "passed": wall_s <= BAR_SECONDS and exactly_once,
                "note": f"{n / wall_s:,.0f} runs/s; per scheduler {created}",
            },
            {
                "name": "runs enqueued twice / runs missing",
                "value": float(duplicates + missing),
                "unit": "runs",
                "baseline": None,
                "baseline_name": None,
                "ratio": None,
                "bar": None,
                "bar_kind": "max",
                "passed": exactly_once,
                "note": f"duplicates {duplicates}, missing {missing}, schedules advanced {advanced} of {n}",
            },
        ],
        "notes": [
            f"setup: {n:,} upsert_schedule calls in {setup_s:.1f} s; batches of {batch_size} per transaction"
            + (f"; errors: {errors}" if errors else ""),
        ],
        "n": n,
        "schedulers": SCHEDULERS,
        "wall_s": wall_s,
        "runs_per_s": n / wall_s if wall_s else None,
        "created_per_scheduler": created,
        "advanced": advanced,
        "duplicates": duplicates,
        "missing": missing,
        "still_due": still_due,
        "exactly_once": exactly_once,
        "errors": errors,
    }
