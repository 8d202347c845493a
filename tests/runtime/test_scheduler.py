"""The scheduler (pgjobs/runtime/scheduler.py): exactly-once materialisation across racing schedulers, DST in two
zones with croniter as the oracle, pause/resume, code vs dynamic schedules, missed-run policies, a
scheduler killed between "due" and "materialise", and the run loop's NOTIFY wakeup.

Time is the test's: every Scheduler gets an injected clock, so hours of schedule run in milliseconds.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import anyio
import psycopg
import pytest
from croniter import croniter

import pgjobs
from pgjobs import AsyncClient, Client, InvalidState
from pgjobs.client.recurring import PeriodicSpec
from pgjobs.runtime.scheduler import Scheduler, sync_code_schedules

T0 = datetime(2030, 1, 1, tzinfo=UTC)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kw: float) -> datetime:
        self.now += timedelta(**kw)
        return self.now


@dataclass
class FakeApp:
    """What the scheduler reads of an App: its periodic declarations."""

    periodic_specs: list[PeriodicSpec] = field(default_factory=list)


def runs_by_schedule(conn: psycopg.Connection[Any]) -> dict[str, list[datetime]]:
    out: dict[str, list[datetime]] = defaultdict(list)
    for name, run_at in conn.execute(
        "SELECT schedule_name, run_at FROM pgjobs.jobs WHERE schedule_name IS NOT NULL ORDER BY run_at, id"
    ):
        out[name].append(run_at)
    return dict(out)


def duplicates(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT schedule_name, run_at, count(*) FROM pgjobs.jobs WHERE schedule_name IS NOT NULL"
        " GROUP BY 1, 2 HAVING count(*) > 1"
    ).fetchall()


def croniter_fires_utc(cron: str, start: datetime, end: datetime) -> list[datetime]:
    """croniter's own fires in (start, end], for UTC schedules."""
    it = croniter(cron, start.replace(tzinfo=None), second_at_beginning=True)  # six fields: seconds first
    out = []
    while (t := it.get_next(datetime).replace(tzinfo=UTC)) <= end:
        out.append(t)
    return out


def oracle_fires(cron: str, tz_name: str, start: datetime, end: datetime) -> list[datetime]:
    """The documented DST rule, brute force, minute by minute, with croniter.match deciding each wall time:
    a wall time that exists fires at its first occurrence only (fold=0); wall times skipped by a gap fire
    once, at the first instant after the gap."""
    tz = ZoneInfo(tz_name)
    out: list[datetime] = []
    t = start.replace(second=0, microsecond=0) + timedelta(minutes=1)
    prev_wall = (t - timedelta(minutes=1)).astimezone(tz).replace(tzinfo=None)
    while t <= end:
        local = t.astimezone(tz)
        wall = local.replace(tzinfo=None)
        fire = local.fold == 0 and croniter.match(cron, wall)
        skipped = prev_wall + timedelta(minutes=1)
        while not fire and skipped < wall:  # a gap: wall times that never happened
            fire = croniter.match(cron, skipped)
            skipped += timedelta(minutes=1)
        if fire:
            out.append(t)
        prev_wall = max(prev_wall, wall)
        t += timedelta(minutes=1)
    return out


# -- six schedulers racing -------------------------------------------------------------------------------


def test_six_schedulers_racing_materialise_each_run_exactly_once(dsn: str, conn: psycopg.Connection[Any]) -> None:
    crons = ["* * * * *", "*/2 * * * *", "*/3 * * * *", "*/5 * * * *", "0 * * * *", "*/20 * * * * *"]  # seconds first
    with Client(dsn) as client:
        for i in range(30):
            client.add_schedule(f"s{i:02}", f"kind{i % 3}", crons[i % len(crons)], now=T0)

    schedulers, rounds, step = 6, 40, timedelta(seconds=30)
    end = T0 + rounds * step
    barrier = threading.Barrier(schedulers)
    created: list[int] = [0] * schedulers
    errors: list[BaseException] = []

    def scheduler_thread(k: int) -> None:
        rng = random.Random(k)
        clock = Clock(T0)

        async def main() -> None:
            # a small batch: every pass takes several transactions, so the racers interleave
            async with Scheduler(dsn, clock=clock, batch_size=4, grace=timedelta(minutes=5)) as scheduler:
                for i in range(1, rounds + 1):
                    # each scheduler's clock is a little off the others' (never ahead of `end`)
                    clock.now = T0 + i * step - timedelta(seconds=rng.uniform(0, 20) if i < rounds else 0)
                    await anyio.to_thread.run_sync(barrier.wait)
                    created[k] += await scheduler.tick()
                await anyio.to_thread.run_sync(barrier.wait)
                created[k] += await scheduler.tick()  # drain: everything due at `end`

        try:
            anyio.run(main)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=scheduler_thread, args=(k,)) for k in range(schedulers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []

    runs = runs_by_schedule(conn)
    assert duplicates(conn) == []
    for i in range(30):
        assert runs.get(f"s{i:02}", []) == croniter_fires_utc(crons[i % len(crons)], T0, end), f"s{i:02}"
    total = sum(len(v) for v in runs.values())
    assert total == sum(created)  # every enqueued job was counted by exactly one scheduler
    assert total == 30 // 6 * sum(len(croniter_fires_utc(c, T0, end)) for c in crons)
    assert sum(1 for c in created if c) > 1  # the work really was shared


# -- DST in two zones ------------------------------------------------------------------------------------

DST_CRONS = ["*/30 * * * *", "0 * * * *", "30 2 * * *", "15 1 * * *", "*/20 1-3 * * *", "45 2 * * *", "0 3 * * *"]
TRANSITIONS = {
    "paris-spring": ("Europe/Paris", datetime(2030, 3, 31, 1, 0, tzinfo=UTC)),  # 02:00 CET -> 03:00 CEST
    "paris-fall": ("Europe/Paris", datetime(2030, 10, 27, 1, 0, tzinfo=UTC)),  # 03:00 CEST -> 02:00 CET
    "new-york-spring": ("America/New_York", datetime(2030, 3, 10, 7, 0, tzinfo=UTC)),  # 02:00 EST -> 03:00 EDT
    "new-york-fall": ("America/New_York", datetime(2030, 11, 3, 6, 0, tzinfo=UTC)),  # 02:00 EDT -> 01:00 EST
}


def drive(dsn: str, clock: Clock, end: datetime, step: Callable[[datetime | None], datetime]) -> int:
    """Ticks a scheduler, moving the clock with `step(next_wakeup)`, until the clock passes `end`; then a
    last pass at `end`."""

    async def main() -> int:
        total = 0
        async with Scheduler(dsn, clock=clock) as scheduler:
            while True:
                clock.now = step(await scheduler.next_wakeup())
                if clock.now > end:
                    clock.now = end
                    return total + await scheduler.tick()
                total += await scheduler.tick()

    return anyio.run(main)


@pytest.mark.parametrize("transition", sorted(TRANSITIONS))
def test_dst_transitions_follow_the_documented_rule(dsn: str, conn: psycopg.Connection[Any], transition: str) -> None:
    tz, at = TRANSITIONS[transition]
    start, end = at - timedelta(hours=5), at + timedelta(hours=5)
    with Client(dsn) as client:
        for i, cron in enumerate(DST_CRONS):
            client.add_schedule(f"d{i}", "dst", cron, timezone=tz, now=start)
    clock = Clock(start)
    # sleep-until-next-due, as the run loop does: jump the clock straight to the scheduler's next wakeup
    total = drive(dsn, clock, end, lambda wake: wake if wake is not None else end + timedelta(1))
    runs = runs_by_schedule(conn)
    assert duplicates(conn) == []
    for i, cron in enumerate(DST_CRONS):
        expected = oracle_fires(cron, tz, start, end)
        assert runs.get(f"d{i}", []) == expected, (cron, [t.astimezone(ZoneInfo(tz)).isoformat() for t in expected])
    assert total == sum(len(v) for v in runs.values())


def test_dst_with_a_wandering_clock(dsn: str, conn: psycopg.Connection[Any]) -> None:
    """Same rule when the passes happen at arbitrary moments (each within the grace period)."""
    tz, at = TRANSITIONS["paris-fall"]
    start, end = at - timedelta(hours=3), at + timedelta(hours=3)
    with Client(dsn) as client:
        for i, cron in enumerate(DST_CRONS[:4]):
            client.add_schedule(f"w{i}", "dst", cron, timezone=tz, now=start)
    rng = random.Random(7)
    clock = Clock(start)
    drive(dsn, clock, end, lambda _: clock.now + timedelta(seconds=rng.uniform(1, 55)))
    runs = runs_by_schedule(conn)
    for i, cron in enumerate(DST_CRONS[:4]):
        assert runs.get(f"w{i}", []) == oracle_fires(cron, tz, start, end), cron


def test_daily_job_on_the_spring_forward_day_runs_once_after_the_gap(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with Client(dsn) as client:
        client.add_schedule("ny", "k", "30 2 * * *", timezone="America/New_York", now=datetime(2030, 3, 9, tzinfo=UTC))
        client.add_schedule("paris", "k", "30 2 * * *", timezone="Europe/Paris", now=datetime(2030, 3, 30, tzinfo=UTC))
    clock = Clock(datetime(2030, 3, 9, tzinfo=UTC))
    drive(dsn, clock, datetime(2030, 4, 2, tzinfo=UTC), lambda wake: wake or datetime(2031, 1, 1, tzinfo=UTC))
    runs = runs_by_schedule(conn)
    ny = [t.astimezone(ZoneInfo("America/New_York")).strftime("%m-%d %H:%M") for t in runs["ny"]]
    paris = [t.astimezone(ZoneInfo("Europe/Paris")).strftime("%m-%d %H:%M") for t in runs["paris"]]
    assert ny[:3] == ["03-09 02:30", "03-10 03:00", "03-11 02:30"]  # 02:30 did not exist on 03-10
    assert paris == ["03-30 02:30", "03-31 03:00", "04-01 02:30"]


# -- pause / resume, code vs dynamic, missed runs ----------------------------------------------------------


@pytest.mark.smoke
def test_pause_and_resume(dsn: str, conn: psycopg.Connection[Any]) -> None:
    clock = Clock(T0)

    async def main() -> None:
        async with AsyncClient(dsn) as client, Scheduler(client, clock=clock) as scheduler:
            await client.add_schedule("p", "k", "*/10 * * * *", now=T0)
            clock.advance(minutes=10)
            assert await scheduler.tick() == 1
            await client.pause_schedule("p")
            for _ in range(6):
                clock.advance(minutes=10)
                assert await scheduler.tick() == 0
            # resume: continues at the next future run, the paused hour is not made up
            assert await client.resume_schedule("p", now=clock())
            resumed = await client.get_schedule("p")
            assert resumed is not None and resumed.next_run_at == clock.now + timedelta(minutes=10)
            assert await scheduler.tick() == 0
            clock.advance(minutes=10)
            assert await scheduler.tick() == 1
            # resume with catch_up: the old next run stays due, the missed policy ('once') runs it once
            await client.pause_schedule("p")
            clock.advance(hours=2)
            await client.resume_schedule("p", catch_up=True)
            assert await scheduler.tick() == 1
            assert await scheduler.tick() == 0

    anyio.run(main)
    assert [t - T0 for t in runs_by_schedule(conn)["p"]] == [
        timedelta(minutes=10),
        timedelta(minutes=80),
        timedelta(minutes=90),
    ]


def test_code_defined_schedules_sync_and_win_over_dynamic_ones(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = FakeApp(
        [
            PeriodicSpec(name="cleanup", cron="*/5 * * * *"),
            PeriodicSpec(name="report", cron="0 8 * * *", timezone="Europe/Paris", payload={"to": "ops"}),
        ]
    )
    clock = Clock(T0)

    async def main() -> None:
        async with AsyncClient(dsn) as client:
            await client.add_schedule("user-made", "k", "0 * * * *", now=T0)
            scheduler = Scheduler(client, clock=clock)
            report = await scheduler.sync_code_schedules(app)
            assert [s.name for s in report.schedules] == ["cleanup", "report"] and report.pruned == 0
            assert all(s.code_defined for s in report.schedules)
            assert report.schedules[1].next_run_at == datetime(2030, 1, 1, 7, 0, tzinfo=UTC)

            with pytest.raises(InvalidState):  # a dynamic schedule never replaces a code-defined one
                await client.add_schedule("cleanup", "other", "* * * * *")
            with pytest.raises(InvalidState):  # nor deletes it
                await client.remove_schedule("cleanup")

            # downtime, then a restart: an unchanged declaration keeps its pending (missed) run
            clock.advance(hours=1)
            again = await scheduler.sync_code_schedules(app)
            assert again.schedules[0].next_run_at == T0 + timedelta(minutes=5)
            assert await scheduler.tick() == 2  # cleanup catches up once, user-made is on time
            # a new release drops 'report' and changes cleanup's cron
            app.periodic_specs = [PeriodicSpec(name="cleanup", cron="*/15 * * * *")]
            third = await scheduler.sync_code_schedules(app)
            assert third.pruned == 1 and third.schedules[0].next_run_at == clock.now + timedelta(minutes=15)
            names = sorted(s.name for s in await client.list_schedules())
            assert names == ["cleanup", "user-made"]  # the dynamic schedule is untouched
            # a code declaration takes over a dynamic schedule of the same name
            app.periodic_specs.append(PeriodicSpec(name="user-made", cron="30 * * * *", kind="k2"))
            await sync_code_schedules(client, app, now=clock())
            taken = await client.get_schedule("user-made")
            assert taken is not None and taken.code_defined and taken.kind == "k2"
            # a worker of another app, declaring no periodic job, shares the database: it prunes nothing
            other = await sync_code_schedules(client, FakeApp([]), now=clock())
            assert other.pruned == 0
            assert sorted(s.name for s in await client.list_schedules()) == ["cleanup", "user-made"]
            # an explicit (empty) list of declarations does prune
            assert (await sync_code_schedules(client, [], now=clock())).pruned == 2

    anyio.run(main)


def test_missed_runs_once_and_skip(dsn: str, conn: psycopg.Connection[Any]) -> None:
    clock = Clock(T0)

    async def main() -> None:
        async with AsyncClient(dsn) as client, Scheduler(client, clock=clock) as scheduler:
            await client.add_schedule("once", "k", "*/5 * * * *", missed="once", now=T0)
            await client.add_schedule("skip", "k", "*/5 * * * *", missed="skip", now=T0)
            clock.advance(minutes=5)
            assert await scheduler.tick() == 2  # on time: both run
            clock.advance(hours=3, minutes=2)  # downtime: 36 runs missed
            assert await scheduler.tick() == 1  # 'once' runs the first missed run once; 'skip' runs nothing
            for s in await client.list_schedules():
                assert s.next_run_at == T0 + timedelta(hours=3, minutes=10)  # both: the next future run
            assert await scheduler.tick() == 0
            clock.advance(minutes=3)
            assert await scheduler.tick() == 2  # and on time again
            # late, but within the grace period (60 s): not a missed run, 'skip' runs it too
            clock.advance(minutes=5, seconds=40)
            assert await scheduler.tick() == 2

    anyio.run(main)
    runs = runs_by_schedule(conn)
    h3 = T0 + timedelta(hours=3)
    assert runs["once"] == [T0 + timedelta(minutes=5), T0 + timedelta(minutes=10), h3 + timedelta(minutes=10),
                            h3 + timedelta(minutes=15)]  # fmt: skip
    assert runs["skip"] == [T0 + timedelta(minutes=5), h3 + timedelta(minutes=10), h3 + timedelta(minutes=15)]


def test_an_unusable_cron_is_backed_off_not_fatal(dsn: str, conn: psycopg.Connection[Any]) -> None:
    # another client stored a cron croniter cannot read (SQL checks only its shape: 61 is no minute)
    conn.execute("SELECT pgjobs.upsert_schedule('broken', 'k', '61 * * * *', %s)", (T0,))
    with Client(dsn) as client:
        client.add_schedule("fine", "k", "* * * * *", now=T0 - timedelta(minutes=1))
    clock = Clock(T0 + timedelta(seconds=5))

    async def main() -> None:
        async with Scheduler(dsn, clock=clock) as scheduler:
            assert await scheduler.tick() == 1
            assert await scheduler.next_wakeup() == T0 + timedelta(minutes=1)

    anyio.run(main)
    row = conn.execute("SELECT next_run_at, last_job_id FROM pgjobs.schedules WHERE name = 'broken'").fetchone()
    assert row == (T0 + timedelta(minutes=5, seconds=5), None)


def test_a_full_queue_holds_back_only_its_schedules(dsn: str, conn: psycopg.Connection[Any]) -> None:
    clock = Clock(T0)

    async def main() -> None:
        async with AsyncClient(dsn) as client, Scheduler(client, clock=clock) as scheduler:
            await client.configure_queue("small", max_length=1)
            await client.add_schedule("a-small", "k", "* * * * *", queue="small", now=T0)
            await client.add_schedule("b-default", "k", "* * * * *", now=T0)
            await client.add_schedule("c-small", "k", "* * * * *", queue="small", now=T0)
            clock.advance(minutes=1)
            assert await scheduler.tick() == 2  # a-small takes the last slot, c-small waits, b-default runs
            held = await client.get_schedule("c-small")
            assert held is not None and held.next_run_at == T0 + timedelta(minutes=1)
            wake = await scheduler.next_wakeup()
            assert wake == T0 + timedelta(minutes=1) + scheduler.queue_full_backoff
            assert await scheduler.tick() == 0
            conn.execute("UPDATE pgjobs.jobs SET state = 'succeeded' WHERE queue = 'small'")  # room again
            clock.advance(seconds=10)
            assert await scheduler.tick() == 1  # c-small, late but within the grace period

    anyio.run(main)
    assert sorted(runs_by_schedule(conn)) == ["a-small", "b-default", "c-small"]


# -- a scheduler killed between "due" and "materialise" ----------------------------------------------------

KILLED_SCHEDULER = textwrap.dedent(
    """
    import sys, time
    from datetime import datetime
    import anyio
    import pgjobs.runtime.scheduler as scheduler_module

    dsn, now, mode = sys.argv[1], datetime.fromisoformat(sys.argv[2]), sys.argv[3]
    if mode == "plan":
        # stop inside the pass's transaction: due schedules locked, nothing materialised yet
        def stuck(*args, **kwargs):
            print("stuck", flush=True)
            time.sleep(600)
        scheduler_module.plan_run = stuck

    async def main():
        async with scheduler_module.Scheduler(dsn, clock=lambda: now) as scheduler:
            print("ticking", flush=True)
            await scheduler.tick()
            print("ticked", flush=True)

    anyio.run(main)
    """
)


def spawn_scheduler(tmp_path: Path, dsn: str, now: datetime, mode: str) -> subprocess.Popen[str]:
    script = tmp_path / "killed_scheduler.py"
    script.write_text(KILLED_SCHEDULER)
    env = dict(os.environ)
    root = str(Path(pgjobs.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, str(script), dsn, now.isoformat(), mode], stdout=subprocess.PIPE, text=True, env=env
    )


def wait_for_line(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdout is not None
    for got in proc.stdout:
        if got.strip() == line:
            return
    raise AssertionError(f"the scheduler process exited (rc={proc.wait()}) before printing {line!r}")


def tick_until(dsn: str, clock: Clock, want: int) -> int:
    """A second scheduler ticks until `want` runs are materialised (the killed one's backend may take a
    moment to be gone and free its rows); returns how many it materialised."""

    async def main() -> int:
        total = 0
        async with Scheduler(dsn, clock=clock) as scheduler:
            deadline = time.monotonic() + 30
            while total < want and time.monotonic() < deadline:
                total += await scheduler.tick()
                if total < want:
                    await anyio.sleep(0.05)
            total += await scheduler.tick()  # and nothing more
        return total

    return anyio.run(main)


def make_due(dsn: str, n: int) -> Clock:
    with Client(dsn) as client:
        for i in range(n):
            client.add_schedule(f"k{i}", "k", "*/5 * * * *", now=T0)
    return Clock(T0 + timedelta(minutes=5))


def test_scheduler_killed_inside_its_pass_loses_and_duplicates_nothing(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    clock = make_due(dsn, 5)
    proc = spawn_scheduler(tmp_path, dsn, clock.now, "plan")
    try:
        wait_for_line(proc, "stuck")
        # while it holds the due schedules, another scheduler skips them instead of waiting
        assert anyio.run(lambda: _one_tick(dsn, clock)) == 0
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert tick_until(dsn, clock, 5) == 5
    assert {k: len(v) for k, v in runs_by_schedule(conn).items()} == {f"k{i}": 1 for i in range(5)}


async def _one_tick(dsn: str, clock: Clock) -> int:
    async with Scheduler(dsn, clock=clock) as scheduler:
        return await scheduler.tick()


def test_scheduler_killed_between_advance_and_insert_loses_and_duplicates_nothing(
    dsn: str, conn: psycopg.Connection[Any], connect: Any, tmp_path: Path
) -> None:
    clock = make_due(dsn, 5)
    blocker = connect(autocommit=False)
    blocker.execute("LOCK TABLE pgjobs.jobs IN SHARE MODE")  # job inserts wait; the schedule UPDATEs do not
    proc = spawn_scheduler(tmp_path, dsn, clock.now, "insert")
    try:
        wait_for_line(proc, "ticking")
        deadline = time.monotonic() + 30
        while not conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted"
            " AND relation IN ('pgjobs.jobs'::regclass, 'pgjobs.jobs_live'::regclass))"  # (or the leaf)
        ).fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, "the scheduler never reached the job insert"
            time.sleep(0.02)
        # the stuck pass has advanced the schedules in its (uncommitted) transaction
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        blocker.rollback()
    assert tick_until(dsn, clock, 5) == 5
    assert {k: len(v) for k, v in runs_by_schedule(conn).items()} == {f"k{i}": 1 for i in range(5)}
    assert duplicates(conn) == []


def test_a_tick_cancelled_mid_pass_loses_and_duplicates_nothing(
    dsn: str, conn: psycopg.Connection[Any], connect: Any
) -> None:
    clock = make_due(dsn, 3)
    blocker = connect(autocommit=False)
    blocker.execute("LOCK TABLE pgjobs.jobs IN SHARE MODE")

    def insert_waits() -> bool:
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted"
            " AND relation IN ('pgjobs.jobs'::regclass, 'pgjobs.jobs_live'::regclass))"  # (or the leaf)
        ).fetchone()
        return bool(row and row[0])

    async def main() -> None:
        async with Scheduler(dsn, clock=clock) as scheduler, anyio.create_task_group() as tg:
            scope = anyio.CancelScope()

            async def tick() -> None:
                with scope:
                    await scheduler.tick()  # blocks on the job insert, after due_schedules and the UPDATE

            tg.start_soon(tick)
            with anyio.fail_after(30):  # cancelled once it waits there, however long it took to get there
                while not insert_waits():
                    await anyio.sleep(0.02)
            scope.cancel()
        assert scope.cancelled_caught

    anyio.run(main)
    blocker.rollback()
    assert tick_until(dsn, clock, 3) == 3
    assert {k: len(v) for k, v in runs_by_schedule(conn).items()} == {f"k{i}": 1 for i in range(3)}


# -- the run loop -------------------------------------------------------------------------------------------


@pytest.mark.smoke
def test_run_syncs_the_app_and_wakes_on_schedule_changes(dsn: str, conn: psycopg.Connection[Any]) -> None:
    """With no schedule due for an hour, the loop sleeps (max_sleep is an hour too); adding a schedule
    that is due in a second wakes it through NOTIFY, and it sleeps just until that run."""
    app = FakeApp([PeriodicSpec(name="hourly", cron="0 * * * *")])

    async def main() -> None:
        async with AsyncClient(dsn) as client, anyio.create_task_group() as tg:
            scheduler = Scheduler(client, app=app, max_sleep=3600)
            await tg.start(scheduler.run)
            with anyio.fail_after(20):  # the first pass syncs the app's declarations
                while [s.name for s in await client.list_schedules()] != ["hourly"]:
                    await anyio.sleep(0.05)
            await anyio.sleep(0.3)  # let it go to sleep
            await client.add_schedule("every-second", "k", "* * * * * *")
            with anyio.fail_after(20):
                while not conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone()[0]:  # type: ignore[index]
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()

    anyio.run(main)
    row = conn.execute("SELECT schedule_name, kind FROM pgjobs.jobs ORDER BY id LIMIT 1").fetchone()
    assert row == ("every-second", "k")


def test_constructor_forms(dsn: str) -> None:
    app = FakeApp([PeriodicSpec(name="c", cron="* * * * *")])

    async def main() -> None:
        async with AsyncClient(dsn) as client:
            # the worker's form: Scheduler(app, dsn, pool=its pool)
            s = Scheduler(app, dsn, pool=client.pool, name="w1")
            assert s.app is app and s.client.pool is client.pool and s.listen_dsn == dsn
            assert (await s.sync_code_schedules(app)).schedules[0].name == "c"
            s2 = Scheduler(client.pool, app=app)
            assert s2.listen_dsn and await s2.tick() == 0

    anyio.run(main)
    with pytest.raises(pgjobs.InvalidArgument):
        Scheduler(42)
    with pytest.raises(pgjobs.InvalidArgument):
        Scheduler(dsn, batch_size=0)


# -- the CLI ------------------------------------------------------------------------------------------------


def cli(dsn: str, *argv: str) -> int:
    import argparse

    from pgjobs.cli.schedules import register

    parser = argparse.ArgumentParser(prog="pgjobs")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    args.dsn = dsn
    return int(args.func(args))


def test_cli_schedules_commands(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(dsn, "schedules", "add", "report", "send_report", "0 8 * * 1-5", "--tz", "Europe/Paris",
               "--payload", '{"to": "ops"}', "--missed", "skip") == 0  # fmt: skip
    assert "report" in capsys.readouterr().out
    assert cli(dsn, "schedules", "pause", "report") == 0
    assert cli(dsn, "schedules", "list") == 0
    out = capsys.readouterr().out
    assert "report" in out and "paused" in out and "Europe/Paris" in out and "dynamic (skip)" in out
    assert cli(dsn, "schedules", "resume", "report") == 0
    assert cli(dsn, "schedules", "list", "--json") == 0
    out = capsys.readouterr().out
    listed = json.loads(out[out.index("[") :])
    assert listed[0]["name"] == "report" and listed[0]["paused"] is False and listed[0]["payload"] == {"to": "ops"}
    assert cli(dsn, "schedules", "add", "x", "k", "* * * * *") == 0
    with Client(dsn) as client:
        client.upsert_schedule("x", "k", "* * * * *", T0, code_defined=True)  # an app declares it
    with pytest.raises(InvalidState):
        cli(dsn, "schedules", "remove", "x")
    assert cli(dsn, "schedules", "remove", "x", "--force") == 0
    with pytest.raises(pgjobs.JobNotFound):
        cli(dsn, "schedules", "remove", "ghost")
    with pytest.raises(pgjobs.InvalidArgument):
        cli(dsn, "schedules", "add", "bad", "k", "not a cron")


def test_cli_scheduler_runs_until_sigterm(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with Client(dsn) as client:
        client.add_schedule("s", "k", "* * * * * *")  # every second
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(pgjobs.__file__).resolve().parent.parent) + os.pathsep + env.get("PYTHONPATH", "")
    code = (
        "import argparse, sys; from pgjobs.cli.schedules import cmd_scheduler;"
        f" sys.exit(cmd_scheduler(argparse.Namespace(dsn={dsn!r}, app=None, batch_size=100)))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 30
        while not conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline and proc.poll() is None, "the scheduler did not run"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None and "SIGTERM" in proc.stderr.read()


def test_run_survives_a_database_that_is_not_there_yet(dsn: str, conn: psycopg.Connection[Any]) -> None:
    """A scheduler started before the database answers keeps retrying (and a later sync succeeds), and a stop
    meanwhile is not held up by the pool's wait for a connection (30 s by default)."""
    app = FakeApp([PeriodicSpec(name="later", cron="0 * * * *")])
    stop_began: list[float] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            broken = Scheduler("postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=1", app=app)
            await tg.start(broken.run)
            await anyio.sleep(1.5)  # a few failed passes, logged, not raised
            healthy = Scheduler(dsn, app=app)
            await tg.start(healthy.run)
            with anyio.fail_after(20):
                while not conn.execute("SELECT count(*) FROM pgjobs.schedules").fetchone()[0]:  # type: ignore[index]
                    await anyio.sleep(0.05)
            stop_began.append(time.monotonic())
            tg.cancel_scope.cancel()
        stop_began.append(time.monotonic())

    anyio.run(main)
    # the broken scheduler was waiting for a connection (pool timeout 30 s) when the stop came
    assert stop_began[1] - stop_began[0] < 10.0
