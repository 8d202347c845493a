"""The worker as real processes: SIGKILL mid-job (another worker finishes it, the side effect commits exactly
once), SIGTERM (graceful: unfinished jobs released with the attempt refunded, exit code 0), and a LISTEN
connection killed with pg_terminate_backend (the worker reconnects and keeps processing)."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.helpers.apps.procs import StartWorker, wait_for, worker_processes


@pytest.fixture
def start_worker(dsn: str, tmp_path: Path) -> Iterator[StartWorker]:
    """``start_worker(**options)``: a worker process of tests/helpers/apps/worker_app.py, killed at teardown."""
    with worker_processes(dsn, tmp_path) as start:
        yield start


def job_row(conn: psycopg.Connection[Any], job_id: int) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT state::text, attempt, lease_token, result, leased_by FROM pgjobs.jobs WHERE id = %s", [job_id]
    ).fetchone()
    assert row is not None
    return tuple(row)


def enqueue(conn: psycopg.Connection[Any], kind: str, payload: dict[str, Any] | None = None, **kw: Any) -> int:
    row = conn.execute(
        "SELECT id FROM pgjobs.enqueue(kind => %s, payload => %s, max_attempts => %s)",
        [kind, psycopg.types.json.Jsonb(payload or {}), kw.get("max_attempts", 20)],
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.smoke
def test_sigkill_mid_job_another_worker_finishes_it_and_the_effect_commits_once(
    conn: psycopg.Connection[Any], start_worker: StartWorker
) -> None:
    conn.execute("CREATE TABLE effects (job_id bigint PRIMARY KEY, attempt int NOT NULL, worker text NOT NULL)")
    conn.execute("CREATE TABLE markers (job_id bigint NOT NULL, what text NOT NULL)")
    job = enqueue(conn, "effect", {"hang": True})

    first = start_worker(name="first", lease=2.0, heartbeat_interval=0.5)
    wait_for(lambda: conn.execute("SELECT 1 FROM markers WHERE job_id = %s", [job]).fetchone(), what="the marker")
    assert job_row(conn, job)[:2] == ("active", 1)
    first.send_signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    # The handler's transaction died with the process: nothing committed.
    assert conn.execute("SELECT count(*) FROM effects").fetchone() == (0,)

    start_worker(name="second", lease=2.0, heartbeat_interval=0.3, reap_after=1.0)
    wait_for(lambda: job_row(conn, job)[0] == "succeeded", what="the job to succeed on the second worker")
    _, attempt, token, result, _ = job_row(conn, job)
    assert (attempt, token, result) == (2, None, "effect applied")
    assert conn.execute("SELECT job_id, attempt, worker FROM effects").fetchall() == [(job, 2, "second")]
    errors = conn.execute("SELECT errors FROM pgjobs.jobs WHERE id = %s", [job]).fetchone()
    assert errors is not None and errors[0][0]["worker"] == "first" and errors[0][0]["error"] == "lease expired"


def test_sigkill_after_the_effect_committed_does_not_repeat_it(
    conn: psycopg.Connection[Any], start_worker: StartWorker
) -> None:
    """The other crash window: the effect committed, the process died before reporting the job. The re-run
    finds the idempotency record and does not apply the effect again."""
    conn.execute("CREATE TABLE effects (job_id bigint PRIMARY KEY, attempt int NOT NULL, worker text NOT NULL)")
    conn.execute("CREATE TABLE markers (job_id bigint NOT NULL, what text NOT NULL)")
    job = enqueue(conn, "effect", {"hang_after_commit": True})
    first = start_worker(name="first", lease=1.5, heartbeat_interval=0.5)
    wait_for(lambda: conn.execute("SELECT 1 FROM markers WHERE job_id = %s", [job]).fetchone(), what="the marker")
    assert conn.execute("SELECT job_id, attempt, worker FROM effects").fetchall() == [(job, 1, "first")]
    first.send_signal(signal.SIGKILL)
    first.wait(10)

    start_worker(name="second", lease=1.5, heartbeat_interval=0.3, reap_after=1.0)
    wait_for(lambda: job_row(conn, job)[0] == "succeeded", what="the job to succeed on the second worker")
    assert job_row(conn, job)[3] == "effect already applied"
    assert conn.execute("SELECT job_id, attempt, worker FROM effects").fetchall() == [(job, 1, "first")]


def test_sigterm_releases_unfinished_jobs_with_the_attempt_refunded(
    conn: psycopg.Connection[Any], start_worker: StartWorker
) -> None:
    quick = enqueue(conn, "sleep", {"seconds": 0.3})
    slow = [enqueue(conn, "sleep", {"seconds": 3600}) for _ in range(3)]
    # "quick" needs 0.3 s of the grace period, also on a loaded machine
    proc = start_worker(name="term", queues={"default": 10}, grace_period=4.0)
    wait_for(lambda: all(job_row(conn, j)[0] == "active" for j in [quick, *slow]), what="every job to be claimed")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert job_row(conn, quick)[:2] == ("succeeded", 1)  # finished within the grace period
    for j in slow:
        state, attempt, token, _, _ = job_row(conn, j)
        assert (state, attempt, token) == ("pending", 0, None)  # released, attempt given back


def test_terminated_listen_connection_reconnects_and_keeps_processing(
    conn: psycopg.Connection[Any], start_worker: StartWorker
) -> None:
    # poll_interval far beyond the test: only the LISTEN connection can wake the idle worker.
    start_worker(name="lsn", poll_interval=300)
    app_name = "pgjobs-listen:lsn"

    def listen_pid() -> int | None:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()",
            [app_name],
        ).fetchone()
        return None if row is None else int(row[0])

    old = wait_for(listen_pid, what="the LISTEN connection")
    first = enqueue(conn, "noop")
    wait_for(lambda: job_row(conn, first)[0] == "succeeded", what="the first job")

    assert conn.execute("SELECT pg_terminate_backend(%s)", [old]).fetchone() == (True,)
    new = wait_for(lambda: (p := listen_pid()) is not None and p != old and p, what="the reconnected LISTEN")
    assert new != old
    # the new connection LISTENs (its LISTENs done, it waits idle): the worker is asleep until a notification
    wait_for(
        lambda: (
            conn.execute(
                "SELECT state = 'idle' AND query LIKE 'LISTEN%%' FROM pg_stat_activity WHERE pid = %s", [new]
            ).fetchone()
            == (True,)
        ),
        what="the reconnected LISTEN to be in place",
    )
    second = enqueue(conn, "noop")
    wait_for(lambda: job_row(conn, second)[0] == "succeeded", timeout=20, what="the job after the reconnect")


def test_every_connection_terminated_the_worker_recovers(
    conn: psycopg.Connection[Any], start_worker: StartWorker
) -> None:
    """All of the worker's sessions killed at once (as when the server restarts): it reconnects each one
    (claim, completion, LISTEN, pool) and goes on."""
    proc = start_worker(name="phoenix", poll_interval=1.0)
    first = enqueue(conn, "noop")
    wait_for(lambda: job_row(conn, first)[0] == "succeeded", what="the first job")
    killed = conn.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE application_name LIKE '%%:phoenix' AND datname = current_database()"
    ).fetchone()
    assert killed is not None and killed[0] >= 3
    later = [enqueue(conn, "noop") for _ in range(20)]
    wait_for(lambda: all(job_row(conn, j)[0] == "succeeded" for j in later), timeout=30, what="jobs after the kill")
    assert proc.poll() is None


def test_sigterm_under_load_leaves_no_job_active(
    conn: psycopg.Connection[Any], start_worker: StartWorker, tmp_path: Path
) -> None:
    """A busy worker always has a claim on its way: stopped 20 times mid-stream, every claimed job, those of a
    claim whose answer arrived after the stop began included, is finished or released (none left active until
    its lease runs out). After each stop: no job active, none holding a lease token, every released job back
    with its attempt refunded (noop never fails: a pending job with an attempt was not given back properly),
    no job run twice, the worker deregistered, and its log says it released everything."""
    import random

    released_total = 0

    for i in range(20):
        # topped up each round: the queue never runs dry, so every stop comes under load
        conn.execute(
            "SELECT count(*) FROM pgjobs.enqueue_many(%s)", [psycopg.types.json.Jsonb([{"kind": "noop"}] * 20_000)]
        )
        before = conn.execute("SELECT count(*) FROM pgjobs.jobs WHERE state = 'succeeded'").fetchone()
        proc = start_worker(name=f"busy-{i}", queues={"default": 50}, grace_period=1.0, lease=60)
        wait_for(
            lambda b=before: conn.execute("SELECT count(*) FROM pgjobs.jobs WHERE state = 'succeeded'").fetchone() != b,
            what="the worker to be busy",
        )
        time.sleep(random.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        active = conn.execute("SELECT count(*) FROM pgjobs.jobs WHERE state = 'active'").fetchone()
        assert active == (0,), f"stop {i}: {active[0] if active else '?'} job(s) left active"
        leftovers = conn.execute(
            "SELECT count(*) FILTER (WHERE lease_token IS NOT NULL),"
            " count(*) FILTER (WHERE state = 'pending' AND attempt > 0),"
            " count(*) FILTER (WHERE state = 'succeeded' AND attempt <> 1),"
            " count(*) FILTER (WHERE state NOT IN ('pending', 'succeeded'))"
            " FROM pgjobs.jobs"
        ).fetchone()
        assert leftovers == (0, 0, 0, 0), f"stop {i}: tokens, unrefunded, run twice, other states: {leftovers}"
        assert conn.execute("SELECT count(*) FROM pgjobs.workers").fetchone() == (0,), f"stop {i}: not deregistered"
        log = (tmp_path / f"worker-{i}.log").read_text(errors="replace")
        for bad in ("could not be released", "giving up", "Traceback"):
            assert bad not in log, f"stop {i}: {bad!r} in the worker's log:\n{log[-3000:]}"
        books = re.search(r"claimed (\d+), completed (\d+), failed 0, released (\d+), cancelled 0, lost 0", log)
        assert books is not None, f"stop {i}: no clean summary line in the worker's log:\n{log[-3000:]}"
        claimed, completed, released = (int(g) for g in books.groups())
        assert claimed == completed + released, f"stop {i}: {books.group(0)}"
        released_total += released
    left = conn.execute("SELECT count(*) FROM pgjobs.jobs WHERE state = 'pending'").fetchone()
    assert left is not None and left[0] > 0  # the queue never ran dry: every stop came under load
    # some stop caught claimed jobs not yet run (a claim whose answer came after the stop began, most often)
    assert released_total > 0
