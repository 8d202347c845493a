"""Durable execution with real worker processes (tests/helpers/apps/durable_app.py): steps that run once across
kill -9, sleeps and signal waits that hold no slot, signals sent from psql in another process, timeouts,
restarts of the worker, cancel of parked jobs. Every wait is on a condition in the database, never on time."""

from __future__ import annotations

import json
import random
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.helpers.apps.procs import REPO, StartWorker, wait_for, worker_processes

APP = REPO / "tests" / "helpers" / "apps" / "durable_app.py"
FAST = {"lease": 2.0, "heartbeat_interval": 0.5, "reap_after": 2.0, "poll_interval": 0.5, "grace_period": 2.0}
Conn = psycopg.Connection[Any]


@pytest.fixture
def start_worker(dsn: str, tmp_path: Path) -> Iterator[StartWorker]:
    with worker_processes(dsn, tmp_path, APP) as start:
        yield start


@pytest.fixture
def tables(conn: Conn) -> Conn:
    conn.execute("CREATE TABLE step_runs (job_id bigint NOT NULL, step text NOT NULL)")
    conn.execute("CREATE TABLE hangs (job_id bigint, after_step text, used boolean NOT NULL DEFAULT false)")
    conn.execute("CREATE TABLE woken (job_id bigint NOT NULL, payload jsonb, timed_out boolean NOT NULL)")
    return conn


def enqueue(conn: Conn, kind: str, payload: Any = None, **kw: Any) -> int:
    row = conn.execute(
        "SELECT id FROM pgjobs.enqueue(kind => %s, payload => %s, max_attempts => %s)",
        [kind, Jsonb(payload or {}), kw.get("max_attempts", 20)],
    ).fetchone()
    assert row is not None
    return int(row[0])


def enqueue_many(conn: Conn, specs: list[dict[str, Any]]) -> list[int]:
    rows = conn.execute("SELECT id FROM pgjobs.enqueue_many(jobs => %s)", [Jsonb(specs)]).fetchall()
    return [int(r[0]) for r in rows]


def state(conn: Conn, job: int) -> str:
    row = conn.execute("SELECT state::text FROM pgjobs.jobs WHERE id = %s", [job]).fetchone()
    assert row is not None
    return str(row[0])


def count(conn: Conn, query: str, params: Any = None) -> int:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return int(row[0])


def parked(conn: Conn, ids: list[int]) -> int:
    """How many of ``ids`` are parked: a live job with an open sleep or wait and no lease."""
    return count(
        conn,
        "SELECT count(*) FROM pgjobs.jobs AS j WHERE j.id = ANY (%s) AND j.state IN ('waiting', 'scheduled')"
        " AND j.lease_token IS NULL AND EXISTS (SELECT 1 FROM pgjobs.job_waits AS w"
        " WHERE w.job_id = j.id AND w.resolved_at IS NULL)",
        [ids],
    )


def succeeded(conn: Conn, ids: list[int]) -> int:
    return count(conn, "SELECT count(*) FROM pgjobs.jobs WHERE id = ANY (%s) AND state = 'succeeded'", [ids])


def psql(dsn: str, script: str) -> list[str]:
    """Runs ``script`` in a psql process of its own; returns its output lines (tuples only, unaligned)."""
    out = subprocess.run(
        ["psql", dsn, "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1"],
        input=script, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return [line for line in out.stdout.splitlines() if line.strip()]


def signal_script(keys: list[str]) -> str:
    return "".join(f"SELECT pgjobs.signal('{k}', '{json.dumps({'key': k})}');\n" for k in keys)


@pytest.mark.parametrize("kind", ["three_steps", "sync_steps"])
def test_steps_run_once_across_kill_9_after_each_step(tables: Conn, start_worker: StartWorker, kind: str) -> None:
    job = enqueue(tables, kind)
    for step in ("a", "b", "c"):
        tables.execute("INSERT INTO hangs (job_id, after_step) VALUES (%s, %s)", [job, step])
    for step in ("a", "b", "c"):
        proc = start_worker(name=f"until-{step}", **FAST)
        wait_for(
            lambda s=step: tables.execute(
                "SELECT 1 FROM hangs WHERE job_id = %s AND after_step = %s AND used", [job, s]
            ).fetchone(),
            what=f"the handler to hang after step {step}",
        )
        # the step is recorded before the handler goes on
        assert count(tables, "SELECT count(*) FROM pgjobs.job_steps WHERE job_id = %s AND name = %s", [job, step])
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    start_worker(name="finisher", **FAST)
    wait_for(lambda: state(tables, job) == "succeeded", timeout=60, what="the job to succeed")
    runs = tables.execute("SELECT step, count(*) FROM step_runs GROUP BY step ORDER BY step").fetchall()
    assert runs == [("a", 1), ("b", 1), ("c", 1)]
    result = tables.execute("SELECT result, attempt FROM pgjobs.jobs WHERE id = %s", [job]).fetchone()
    assert result is not None
    assert result[0] == [{"step": s, "job": job} for s in ("a", "b", "c")]
    assert result[1] == 4  # one attempt per kill, then the one that finished


def test_a_thousand_jobs_on_a_hundred_keys_woken_once_by_psql(
    dsn: str, tables: Conn, start_worker: StartWorker
) -> None:
    keys = [f"order:{i}" for i in range(100)]
    ids = enqueue_many(tables, [{"kind": "waiter", "payload": {"key": keys[i % 100]}} for i in range(1000)])
    start_worker(name="w", queues={"default": 20}, **FAST)
    wait_for(lambda: parked(tables, ids) == 1000, timeout=120, what="1,000 jobs parked")
    assert count(tables, "SELECT count(*) FROM pgjobs.jobs WHERE id = ANY (%s) AND state = 'waiting'", [ids]) == 1000
    woke = psql(dsn, signal_script(keys))
    assert [int(n) for n in woke] == [10] * 100
    wait_for(lambda: succeeded(tables, ids) == 1000, timeout=120, what="1,000 jobs to succeed")
    rows = tables.execute(
        "SELECT j.id, j.payload ->> 'key', j.result, (SELECT count(*) FROM woken AS w WHERE w.job_id = j.id)"
        " FROM pgjobs.jobs AS j WHERE j.id = ANY (%s)",
        [ids],
    ).fetchall()
    for id, key, result, woken in rows:
        assert woken == 1, f"job {id} woken {woken} times"
        assert result == {"payload": {"key": key}, "timed_out": False}
    assert count(tables, "SELECT count(*) FROM pgjobs.signals") == 0


def test_signals_racing_the_waits_are_never_lost_or_doubled(dsn: str, tables: Conn, start_worker: StartWorker) -> None:
    """300 jobs, one key each; psql sends the 300 signals in a random order while the worker is parking the
    jobs: some signals come before their job waits (kept), some while it parks, some after (wake it)."""
    keys = [f"race:{i}" for i in range(300)]
    ids = enqueue_many(tables, [{"kind": "waiter", "payload": {"key": k}} for k in keys])
    start_worker(name="w", queues={"default": 10}, **FAST)
    wait_for(lambda: parked(tables, ids) >= 30, what="the first jobs parked")  # the race starts midway
    shuffled = random.Random(7).sample(keys, len(keys))
    woke = [int(n) for n in psql(dsn, signal_script(shuffled))]
    wait_for(lambda: succeeded(tables, ids) == 300, timeout=120, what="300 jobs to succeed")
    assert set(woke) <= {0, 1}
    kept = woke.count(0)
    assert 0 < kept < 300, "the signals did not race the waits (all before or all after)"
    assert count(tables, "SELECT count(*) FROM pgjobs.signals") == 0  # every kept signal taken
    rows = tables.execute(
        "SELECT j.payload ->> 'key', j.result, (SELECT count(*) FROM woken AS w WHERE w.job_id = j.id)"
        " FROM pgjobs.jobs AS j WHERE j.id = ANY (%s)",
        [ids],
    ).fetchall()
    assert all(woken == 1 and result == {"payload": {"key": key}, "timed_out": False} for key, result, woken in rows)


def test_sleeping_jobs_hold_no_slot(tables: Conn, start_worker: StartWorker) -> None:
    sleepers = enqueue_many(tables, [{"kind": "sleeper", "payload": {"seconds": 3600}} for _ in range(100)])
    start_worker(name="w", queues={"default": 2}, **FAST)
    wait_for(lambda: parked(tables, sleepers) == 100, timeout=120, what="100 sleepers parked")
    others = enqueue_many(tables, [{"kind": "noop"} for _ in range(10)])
    wait_for(lambda: succeeded(tables, others) == 10, timeout=60, what="the other jobs to run")
    assert parked(tables, sleepers) == 100
    assert count(tables, "SELECT count(*) FROM pgjobs.jobs WHERE id = ANY (%s) AND attempt <> 0", [sleepers]) == 0


def test_timeouts_and_short_sleeps_resume(tables: Conn, start_worker: StartWorker) -> None:
    """The worker's poll fallback is an hour away: the parked jobs resume because it wakes at the next due run_at
    (their timeout, their sleep's end), not because it polls; and never before their time."""
    waiters = [enqueue(tables, "waiter", {"key": f"never:{i}", "timeout": 0.5}) for i in range(5)]
    sleepers = [enqueue(tables, "sleeper", {"seconds": 0.5}) for _ in range(5)]
    start_worker(name="w", **{**FAST, "poll_interval": 3600})
    wait_for(lambda: succeeded(tables, waiters + sleepers) == 10, timeout=60, what="timeouts and sleeps to end")
    early = "SELECT count(*) FROM pgjobs.job_waits WHERE job_id = ANY (%s) AND resolved_at < until"
    assert count(tables, early, [waiters + sleepers]) == 0
    results = tables.execute("SELECT result FROM pgjobs.jobs WHERE id = ANY (%s)", [waiters]).fetchall()
    assert [r[0] for r in results] == [{"payload": None, "timed_out": True}] * 5
    outcomes = tables.execute(
        "SELECT outcome, count(*) FROM pgjobs.job_waits WHERE job_id = ANY (%s) GROUP BY outcome ORDER BY 1",
        [waiters + sleepers],
    ).fetchall()
    assert outcomes == [("slept", 5), ("timeout", 5)]


def test_sync_handler_steps_sleeps_and_waits(dsn: str, tables: Conn, start_worker: StartWorker) -> None:
    job = enqueue(tables, "sync_waiter", {"key": "sync:1", "sleep": 0.3})
    start_worker(name="w", **FAST)
    wait_for(lambda: tables.execute(
        "SELECT 1 FROM pgjobs.job_waits WHERE job_id = %s AND key = 'sync:1' AND resolved_at IS NULL", [job]
    ).fetchone(), what="the wait")  # fmt: skip
    assert psql(dsn, "SELECT pgjobs.signal('sync:1', '{\"ok\": true}');") == ["1"]
    wait_for(lambda: state(tables, job) == "succeeded", what="the job to succeed")
    result = tables.execute("SELECT result FROM pgjobs.jobs WHERE id = %s", [job]).fetchone()
    assert result is not None
    assert result[0] == {"first": {"step": "first", "job": job}, "payload": {"ok": True}, "timed_out": False}
    assert count(tables, "SELECT count(*) FROM step_runs WHERE job_id = %s", [job]) == 1


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_parked_jobs_survive_a_worker_restart(
    dsn: str, tables: Conn, start_worker: StartWorker, how: signal.Signals
) -> None:
    waiter = enqueue(tables, "waiter", {"key": "restart:1"})
    sleeper = enqueue(tables, "sleeper", {"seconds": 3})
    first = start_worker(name="first", **FAST)
    wait_for(lambda: parked(tables, [waiter, sleeper]) == 2, what="both parked")
    first.send_signal(how)
    first.wait(30)
    assert parked(tables, [waiter, sleeper]) == 2
    start_worker(name="second", **FAST)
    assert psql(dsn, "SELECT pgjobs.signal('restart:1', '{\"n\": 1}');") == ["1"]
    wait_for(lambda: succeeded(tables, [waiter, sleeper]) == 2, timeout=60, what="both to resume and succeed")
    assert count(tables, "SELECT count(*) FROM woken WHERE job_id = %s", [waiter]) == 1


def test_cancel_of_parked_jobs_ends_them_at_once_with_their_continuations(
    tables: Conn, start_worker: StartWorker
) -> None:
    ids = enqueue_many(
        tables,
        [
            {"ref": "s", "kind": "sleeper", "payload": {"seconds": 3600}},
            {"ref": "w", "kind": "waiter", "payload": {"key": "cancel:1"}},
            {"ref": "after_s", "kind": "noop", "depends_on": [{"ref": "s", "on": "success"}]},
            {"ref": "always_w", "kind": "noop", "depends_on": [{"ref": "w", "on": "complete"}]},
        ],
    )
    sleeper, waiter, after_s, always_w = ids
    start_worker(name="w", **FAST)
    wait_for(lambda: parked(tables, [sleeper, waiter]) == 2, what="both parked")
    for job in (sleeper, waiter):
        assert tables.execute("SELECT pgjobs.cancel(%s)", [job]).fetchone() == (True,)
        assert state(tables, job) == "cancelled"  # at once: no worker involved
    assert state(tables, after_s) == "cancelled"
    wait_for(lambda: state(tables, always_w) == "succeeded", what="the complete continuation to run")
    assert tables.execute("SELECT pgjobs.signal('cancel:1')").fetchone() == (0,)  # no waiter left
