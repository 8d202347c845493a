"""Capped queues at the cap's speed, counted in polls, not timed.

A worker of concurrency 10 is given 20 jobs of 0.2 s on a queue with ``max_active => 5``, fair with
``max_active_per_group => 5`` on one group, and fair with ``max_active_per_group => 1`` on two groups. Its poll
interval is 60 s and the leases 120 s, so a claim that waited for the poll would hold the run past the outer
timeout (40 s): every job finishing in time, with no claim started by the poll, shows that no claim of the
capped queue waited for the poll while the queue had a claimable job and the worker a free slot.

Both wake paths are shown on their own: the worker's own ends (``QueueState.ended``) with its LISTEN wakes cut
off, and the SQL's ``pgjobs_wake`` (sql/wakeups.sql) for a cap set after the worker read its queues' caps; and
across processes, one worker's completion wakes the other.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

import pgjobs
from pgjobs import App, AsyncClient, Worker
from pgjobs.runtime import listener
from tests.helpers.apps.procs import StartWorker, wait_for, worker_processes

JOBS = 20
CASES: list[tuple[str, dict[str, Any], list[str | None]]] = [
    ("max_active 5", {"max_active": 5}, [None]),
    ("fair, max_active_per_group 5, one group", {"fair": True, "max_active_per_group": 5}, ["g"]),
    ("fair, max_active_per_group 1, two groups", {"fair": True, "max_active_per_group": 1}, ["a", "b"]),
]


def _app() -> App:
    app = App()

    @app.job("sleep")
    async def sleep(payload: Any, ctx: pgjobs.JobContext) -> None:
        await anyio.sleep(0.2)

    return app


def _specs(queue: str, groups: list[str | None]) -> list[dict[str, Any]]:
    return [{"kind": "sleep", "queue": queue, "group_key": groups[i % len(groups)]} for i in range(JOBS)]


def _run(dsn: str, queue: str, groups: list[str | None], *, before: bool = False, cap: dict[str, Any] | None = None,
         **options: Any) -> Worker:  # fmt: skip
    """Runs a worker (poll 60 s) until it completed the 20 jobs, enqueued once it made its first claim (or
    ``before`` it starts); ``cap``: configured once it made its first claim (after it read the caps)."""
    worker = Worker(_app(), dsn, {queue: 10}, poll_interval=60, lease=120, scheduler=False, vacuum=False, **options)

    async def main() -> None:
        async with AsyncClient(dsn) as client, anyio.create_task_group() as tg:
            if before:
                await client.enqueue_many(_specs(queue, groups))
            tg.start_soon(worker.run)
            try:
                with anyio.fail_after(40):
                    while worker.claim_calls < 1:
                        await anyio.sleep(0.01)
                    if cap is not None:
                        await client.configure_queue(queue, **cap)
                    if not before:
                        await client.enqueue_many(_specs(queue, groups))
                    while worker.completed < JOBS:
                        await anyio.sleep(0.01)
            finally:
                worker.stop()

    anyio.run(main)
    return worker


def _configure(conn: psycopg.Connection[Any], queue: str, settings: dict[str, Any]) -> None:
    args = ", ".join(f"{k} => %({k})s" for k in settings)
    conn.execute(f"SELECT pgjobs.configure_queue(queue => %(queue)s, {args})", {"queue": queue, **settings})


@pytest.mark.parametrize(("name", "settings", "groups"), CASES, ids=[c[0] for c in CASES])
def test_no_claim_of_a_capped_queue_waits_for_the_poll(
    dsn: str, conn: psycopg.Connection[Any], name: str, settings: dict[str, Any], groups: list[str | None]
) -> None:
    _configure(conn, "capq", settings)
    worker = _run(dsn, "capq", groups)
    assert worker.completed == JOBS
    assert worker.claims_by_trigger["poll"] == 0, worker.claims_by_trigger
    # every job was taken by a claim that a wake started: the enqueue's pgjobs_wake for the first ones, then the
    # ends of earlier jobs, by the worker's own ``ended`` or by the pgjobs_wake its completions send, whichever
    # reaches the claimer first (each path on its own: the two tests below)
    taken = worker.claimed_by_trigger
    assert taken["ended"] + taken["wake"] + taken["retry"] == JOBS, taken
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs WHERE queue = 'capq' AND state = 'succeeded'").fetchone() == (
        JOBS,
    )


def test_the_worker_s_own_ends_wake_it_without_listen(
    dsn: str, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every pgjobs_wake ignored, the in-process path alone keeps the capped queue at its cap's speed."""

    def no_wakes(w: Any, channel: str, payload: str) -> None:
        if channel != listener.WAKE_CHANNEL:
            on_notify(w, channel, payload)

    on_notify = listener.on_notify
    monkeypatch.setattr(listener, "on_notify", no_wakes)
    _configure(conn, "capq", {"max_active": 5})
    worker = _run(dsn, "capq", [None], before=True)  # (the enqueue's wake would be ignored too)
    assert worker.claims_by_trigger["poll"] == 0 and worker.claims_by_trigger["wake"] == 0, worker.claims_by_trigger
    assert worker.claimed_by_trigger["ended"] > 0, worker.claimed_by_trigger


def test_a_cap_set_while_the_worker_runs_is_followed_through_the_sql_wakes(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """The worker read no cap at start (and reads again only after its 60 s heartbeat): the wakes that the
    ends' SQL sends to the capped queue, heard on its LISTEN connection, start its claims."""
    worker = _run(dsn, "capq", [None], cap={"max_active": 5}, heartbeat_interval=60)
    assert worker.claims_by_trigger["poll"] == 0, worker.claims_by_trigger
    assert worker.claims_by_trigger["ended"] == 0, worker.claims_by_trigger  # (it did not know of the cap)
    assert worker.claimed_by_trigger["wake"] > 0, worker.claimed_by_trigger


@pytest.fixture
def start_worker(dsn: str, tmp_path: Path) -> Iterator[StartWorker]:
    with worker_processes(dsn, tmp_path) as start:
        yield start


def test_a_completion_in_one_worker_process_wakes_the_other(
    conn: psycopg.Connection[Any], start_worker: StartWorker
) -> None:
    """``max_active => 1``: worker A runs the held job, B's first claim found the cap full. A is told to stop
    (it claims nothing more) and its job is let go: A's completion wakes B, which takes the next job long
    before its poll (60 s)."""
    conn.execute("CREATE TABLE releases (job_id bigint PRIMARY KEY)")
    _configure(conn, "capq", {"max_active": 1})
    options = {"queues": {"capq": 1}, "poll_interval": 60, "lease": 120, "grace_period": 60}

    def one(kind: str) -> int:
        row = conn.execute("SELECT id FROM pgjobs.enqueue(kind => %s, queue => 'capq')", [kind]).fetchone()
        assert row is not None
        return int(row[0])

    def state(job: int) -> tuple[Any, ...]:
        row = conn.execute("SELECT state::text, leased_by FROM pgjobs.jobs WHERE id = %s", [job]).fetchone()
        assert row is not None
        return tuple(row)

    held = one("hold")
    a = start_worker(name="A", **options)
    wait_for(lambda: state(held) == ("active", "A"), what="A to run the held job")
    nxt = one("noop")
    start_worker(name="B", **options)
    wait_for(
        lambda: conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'pgjobs-claim:B' AND state = 'idle' AND query LIKE '%%pgjobs.claim(%%'"
        ).fetchone(),
        what="B's first claim to answer",
    )
    assert state(nxt)[0] == "pending"  # the cap held it back from B
    a.send_signal(signal.SIGTERM)
    conn.execute("INSERT INTO releases VALUES (%s)", [held])
    wait_for(lambda: state(nxt)[0] == "succeeded", timeout=40, what="B to run the next job")
    assert state(held)[0] == "succeeded" and state(nxt) == ("succeeded", "B")
    assert a.wait(30) == 0
