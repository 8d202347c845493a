"""Six-field cron puts seconds first (Oban, Quartz, node-cron); five fields still work."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import psycopg
import pytest

from pgjobs import Client, InvalidArgument
from pgjobs.cron import check_cron, fires, next_fire
from pgjobs.runtime.scheduler import Scheduler

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def _first(cron: str, n: int, after: datetime = T0) -> list[datetime]:
    it = fires(cron, "UTC", after)
    return [next(it) for _ in range(n)]


def test_six_fields_are_seconds_first() -> None:
    # before the fix croniter read the sixth field as seconds: "*/5 * * * * *" fired every second
    runs = _first("*/5 * * * * *", 4)
    assert runs == [T0 + timedelta(seconds=s) for s in (5, 10, 15, 20)]
    assert _first("30 0 * * * *", 2) == [T0 + timedelta(seconds=30), T0 + timedelta(hours=1, seconds=30)]
    assert next_fire("0 */15 * * * *", "Europe/Paris", T0) == T0 + timedelta(minutes=15)


def test_five_and_seven_fields_still_work() -> None:
    assert _first("*/5 * * * *", 2) == [T0 + timedelta(minutes=5), T0 + timedelta(minutes=10)]
    assert next_fire("0 0 12 * * * 2031", "UTC", T0) == datetime(2031, 1, 1, 12, tzinfo=UTC)
    assert next_fire("@hourly", "UTC", T0) == T0 + timedelta(hours=1)


def test_a_bad_expression_says_how_to_write_one() -> None:
    with pytest.raises(InvalidArgument, match=r"seconds first: '\*/5 \* \* \* \* \*' is every 5 seconds"):
        check_cron("*/5 * * *")
    check_cron("*/5 * * * * *")


def test_the_scheduler_runs_a_seconds_schedule_every_5_s(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with Client(dsn) as client:
        client.add_schedule("every5", "tick", "*/5 * * * * *", now=T0)
    now = [T0]

    async def main() -> None:
        async with Scheduler(dsn, clock=lambda: now[0]) as scheduler:
            for _ in range(12):  # one minute in 5-second steps
                now[0] += timedelta(seconds=5)
                assert await scheduler.tick() == 1

    anyio.run(main)
    rows = conn.execute("SELECT meta->>'scheduled_for' FROM pgjobs.jobs WHERE kind = 'tick' ORDER BY id").fetchall()
    fired = [datetime.fromisoformat(r[0]) for r in rows]
    assert fired == [T0 + timedelta(seconds=5 * i) for i in range(1, 13)]
