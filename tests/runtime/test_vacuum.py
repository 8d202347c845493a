"""Vacuum from the workers (sql/vacuum.sql, pgjobs/runtime/vacuum.py): the hot tables kept in shape when
autovacuum will not. Each test turns autovacuum off for ``jobs_live`` (the table's ``autovacuum_enabled``), so
what it sees does not depend on the server's own setting."""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
import psycopg
import pytest

from pgjobs import App, AsyncClient, Worker
from pgjobs.cli.main import main
from tests.runtime.test_worker import run_worker

Conn = psycopg.Connection[Any]


def _no_autovacuum(conn: Conn) -> None:
    conn.execute("ALTER TABLE pgjobs.jobs_live SET (autovacuum_enabled = false)")


def _churn(conn: Conn, n: int) -> None:
    """n jobs enqueued, claimed and completed: about two dead versions each in jobs_live."""
    conn.execute("INSERT INTO pgjobs.jobs (kind) SELECT 'k' FROM generate_series(1, %s)", [n])
    rows = conn.execute("SELECT id, lease_token FROM pgjobs.claim('w', '{default}', %s)", [n]).fetchall()
    conn.execute("SELECT pgjobs.complete_many(%s::bigint[], %s::uuid[])", ([r[0] for r in rows], [r[1] for r in rows]))
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")  # the flush happens when this session goes idle again


def _stats(conn: Conn) -> tuple[int, Any]:
    """(n_dead_tup, last_vacuum) of jobs_live, once the cumulative statistics show the churn."""
    row = conn.execute(
        "SELECT n_dead_tup, last_vacuum FROM pg_stat_all_tables WHERE relid = 'pgjobs.jobs_live'::regclass"
    ).fetchone()
    assert row is not None
    return int(row[0]), row[1]


def _wait_dead(conn: Conn, at_least: int) -> None:
    deadline = time.monotonic() + 10
    while _stats(conn)[0] < at_least:
        assert time.monotonic() < deadline, f"n_dead_tup never reached {at_least}: {_stats(conn)}"
        time.sleep(0.05)


def _due(conn: Conn, vacuumed_under: str | None = None) -> dict[str, tuple[int, str]]:
    rows = conn.execute("SELECT relation, dead_tuples, horizon FROM pgjobs.vacuum_due(%s)", [vacuumed_under])
    return {r[0]: (r[1], r[2]) for r in rows}


def test_vacuum_due_lists_a_hot_table_once_it_has_enough_dead_tuples(conn: Conn) -> None:
    _no_autovacuum(conn)
    _churn(conn, 200)
    _wait_dead(conn, 200)
    assert "jobs_live" not in _due(conn)  # below 1,000 dead: not yet worth a pass
    _churn(conn, 2000)
    _wait_dead(conn, 2200)
    due = _due(conn)
    assert due["jobs_live"][0] >= 2200
    assert not any(name.startswith("jobs_succeeded") for name in due)  # the history is insert-only


def test_a_pass_under_the_same_oldest_snapshot_lists_nothing(conn: Conn, connect: Any) -> None:
    """While the snapshot that held the dead versions at the last pass still holds them, nothing is listed."""
    _no_autovacuum(conn)
    holder = connect(autocommit=False)
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT txid_current()")
    _churn(conn, 2000)
    _wait_dead(conn, 2000)
    horizon = _due(conn)["jobs_live"][1]
    assert horizon != ""
    assert _due(conn, horizon) == {}  # the same horizon: a pass would remove nothing
    assert "jobs_live" in _due(conn, "1")  # another horizon: listed
    holder.rollback()


def test_pgjobs_maintain_vacuums_what_is_due(conn: Conn, dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    _no_autovacuum(conn)
    _churn(conn, 2000)
    _wait_dead(conn, 2000)
    assert main(["maintain", "--dsn", dsn, "--json"]) == 0
    actions = json.loads(capsys.readouterr().out)
    assert {"action": "vacuum", "target": "pgjobs.jobs_live"}.items() <= next(
        a for a in actions if a["action"] == "vacuum"
    ).items()
    dead, last_vacuum = _stats(conn)
    assert last_vacuum is not None and dead < 100
    # --no-vacuum: the stream and history pass only
    _churn(conn, 2000)
    _wait_dead(conn, 2000)
    assert main(["maintain", "--dsn", dsn, "--json", "--no-vacuum"]) == 0
    assert not [a for a in json.loads(capsys.readouterr().out) if a["action"] == "vacuum"]


@pytest.mark.parametrize("vacuum", [True, False])
def test_a_worker_vacuums_the_hot_table_when_autovacuum_will_not(conn: Conn, dsn: str, vacuum: bool) -> None:
    _no_autovacuum(conn)
    app = App()

    @app.job("noop")
    async def noop(payload: Any, ctx: Any) -> None:
        return None

    async def body(worker: Worker, client: AsyncClient) -> None:
        await client.enqueue_many([{"kind": "noop"} for _ in range(3000)])
        with anyio.fail_after(40):
            while conn.execute("SELECT count(*) FROM pgjobs.jobs WHERE state <> 'succeeded'").fetchone() != (0,):
                await anyio.sleep(0.1)
            # the next heartbeats: the vacuumer's pass (or, with vacuum off, the time it would have taken)
            for _ in range(40 if vacuum else 8):
                if _stats(conn)[1] is not None:
                    break
                await anyio.sleep(0.1)

    run_worker(app, dsn, body, heartbeat_interval=0.2, vacuum=vacuum, concurrency=50)
    assert (_stats(conn)[1] is not None) is vacuum
    # analysed on the same pass (autoanalyze does not run either): the planner gets column statistics
    analyzed = conn.execute(
        "SELECT last_analyze FROM pg_stat_all_tables WHERE relid = 'pgjobs.jobs_live'::regclass"
    ).fetchone()
    assert analyzed is not None and (analyzed[0] is not None) is vacuum
