"""The default client and worker (no ``prepare=False``, no ``--no-prepare``) through PgBouncer 1.18 in transaction
mode, 2 server connections: they find the pooler with the probe at open (a startup option that must come back),
before any statement is prepared, and go on without server-side prepared statements, saying so in one log line.
The error a lost prepared statement gives stays the second line, shown on a caller's connection through the
pooler.

Every server connection behind the pooler first gets a statement named ``_pg3_0`` (psycopg's name for the first
statement a connection prepares), as other clients of a busy pooler leave them: the first prepared statement of
a pgjobs client then meets 42P05 "prepared statement already exists" whichever server connection it lands on.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import pgjobs
from pgjobs import App, AsyncClient, Client, JobState, Worker
from tests.helpers.pgbouncer import Bouncer, pgbouncer_binary, start_pgbouncer

pytestmark = pytest.mark.skipif(
    pgbouncer_binary() is None,
    reason="pgbouncer is not installed (Debian package 'pgbouncer': apt-get install -y pgbouncer)",
)

REPO = Path(__file__).resolve().parents[2]
SWITCHED = "cannot keep prepared statements"
JOBS = 50


def _seed_prepared_names(pooled_dsn: str, servers: int = 2) -> None:
    """``PREPARE _pg3_0`` on each of the pooler's server connections: one open transaction per client connection
    holds a server connection of its own, so ``servers`` of them cover them all."""
    conns = [psycopg.connect(pooled_dsn, prepare_threshold=None) for _ in range(servers)]
    try:
        pids = set()
        for c in conns:
            row = c.execute("SELECT pg_backend_pid()").fetchone()  # (a transaction: the server stays with c)
            assert row is not None
            pids.add(row[0])
            c.execute("DEALLOCATE ALL")
            c.execute("PREPARE _pg3_0 AS SELECT 1")
        assert len(pids) == servers
        for c in conns:
            c.commit()
    finally:
        for c in conns:
            c.close()


def _bouncer(dsn: str, pg_server_dsn: str, **settings: str) -> Bouncer:
    return start_pgbouncer(pg_server_dsn, dbname=conninfo_to_dict(dsn)["dbname"], settings=settings)


@pytest.fixture
def bouncer(dsn: str, pg_server_dsn: str) -> Iterator[Bouncer]:
    b = _bouncer(dsn, pg_server_dsn)
    try:
        yield b
    finally:
        b.stop()


def _switch_lines(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if SWITCHED in r.getMessage()]


def test_default_client_and_worker_command_run_50_jobs_through_pgbouncer(
    bouncer: Bouncer, dsn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``Client(dsn)`` enqueues 50 jobs and ``pgjobs worker --dsn`` runs them, both through the pooler with their
    defaults; each says once, at open, that it does not prepare (PgBouncer refuses the probe's startup options)."""
    pooled = bouncer.dsn(conninfo_to_dict(dsn)["dbname"])
    _seed_prepared_names(pooled)
    caplog.set_level(logging.WARNING, logger="pgjobs.client")
    with Client(pooled, max_size=4) as client:
        ids = [client.enqueue("hello", {"n": i}).id for i in range(JOBS)]
        assert len(set(ids)) == JOBS
        client_lines = _switch_lines(caplog.records)
        assert len(client_lines) == 1 and "unsupported startup parameter" in client_lines[0], client_lines

        (tmp_path / "pooled_app.py").write_text(
            "import pgjobs\napp = pgjobs.App()\n\n@app.job('hello')\nasync def hello(payload, ctx):\n"
            "    return payload['n']\n"
        )
        env = {k: v for k, v in os.environ.items() if k not in ("PGJOBS_DSN", "DATABASE_URL")}
        env["PYTHONPATH"] = str(REPO)
        cmd = [sys.executable, "-m", "pgjobs", "--dsn", pooled, "worker", "--app", "pooled_app:app",
               "--log-format", "json", "--poll-interval", "0.2"]  # fmt: skip
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                done = client.list_jobs(state=JobState.SUCCEEDED, max_rows=JOBS + 1)
                if len(done) == JOBS:
                    break
                time.sleep(0.1)
            results = {s.id: s.result for s in (client.job_status(i) for i in ids) if s is not None}
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
    assert results == {i: n for n, i in enumerate(ids)}, err[-3000:]
    assert len(_switch_lines(caplog.records)) == 1
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    worker_lines = [r["message"] for r in lines if SWITCHED in r["message"]]
    assert len(worker_lines) == 1 and "unsupported startup parameter" in worker_lines[0], err[-3000:]
    assert not [r for r in lines if r["level"] == "ERROR"], err[-3000:]


def test_a_pooler_that_drops_options_is_found_by_the_probe_before_anything_is_prepared(
    dsn: str, pg_server_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A PgBouncer that drops startup options silently (``ignore_startup_parameters = extra_float_digits,
    options``, a common setting) lets every connection in: the probe's value does not come back, so the client,
    the async client and the worker prepare nothing from the start. Each says so once, from the probe, and no
    prepared statement ever meets the pooler's other ``_pg3_0`` (it would be 42P05 "already exists")."""
    b = _bouncer(dsn, pg_server_dsn, ignore_startup_parameters="extra_float_digits, options")
    pooled = b.dsn(conninfo_to_dict(dsn)["dbname"])
    app = App()
    ran: list[int] = []

    @app.job("hello")
    async def hello(payload: Any, ctx: pgjobs.JobContext) -> int:
        ran.append(ctx.id)
        return int(payload["n"])

    caplog.set_level(logging.WARNING, logger="pgjobs")
    worker = Worker(app, pooled, {"default": 4}, listen_dsn=dsn, poll_interval=0.2)
    flags: list[bool] = []

    async def main() -> list[int]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            async with AsyncClient(pooled, max_size=4) as client:
                flags.append(client.prepare)
                ids = [(await client.enqueue("hello", {"n": i})).id for i in range(JOBS)]
                with anyio.fail_after(60):
                    while len(await client.list_jobs(state=JobState.SUCCEEDED, max_rows=JOBS + 1)) < JOBS:
                        await anyio.sleep(0.05)
            worker.stop()
        return ids

    try:
        _seed_prepared_names(pooled)
        with Client(pooled, max_size=4) as sync_client:
            flags.append(sync_client.prepare)
            sync_ids = [sync_client.enqueue("other", {"n": i}).id for i in range(JOBS)]
            assert len(set(sync_ids)) == JOBS
        ids = anyio.run(main)
    finally:
        b.stop()
    assert flags == [False, False]
    assert sorted(ran) == sorted(ids)
    switched = _switch_lines(caplog.records)
    assert len(switched) == 3, switched  # the sync client, the async client, the worker: one line each
    assert all("did not come back" in m for m in switched), switched
    assert len([m for m in switched if m.startswith("pgjobs worker")]) == 1, switched
    assert not worker.prepare
    assert not [r for r in caplog.records if "already exists" in r.getMessage()]


def test_a_direct_connection_keeps_prepared_statements(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """Straight to PostgreSQL the probe's value comes back: the clients and the worker prepare as before, with no
    log line, and the client's hot call is a prepared statement on the server."""
    caplog.set_level(logging.WARNING, logger="pgjobs")
    with Client(dsn, max_size=1) as client:
        assert client.prepare
        for i in range(3):
            client.enqueue("direct", {"n": i})
        with client.pool.connection() as conn:
            row = conn.execute("SELECT count(*) FROM pg_prepared_statements WHERE NOT from_sql").fetchone()
        assert row is not None and row[0] >= 1

    async def main() -> bool:
        async with AsyncClient(dsn, read_dsn=dsn) as client:
            await client.enqueue("direct", {})
            return client.prepare

    assert anyio.run(main)
    assert not _switch_lines(caplog.records)


def test_copy_and_a_callers_transaction_through_pgbouncer(bouncer: Bouncer, dsn: str) -> None:
    """The second line: a client that prepares (its own DSN goes straight to PostgreSQL) runs on a caller's
    connection through the pooler. ``enqueue_copy`` runs in a transaction of its own there: the lost statement
    rolls it back, and it runs again unprepared, its rows enqueued once. Inside the caller's transaction the error
    has aborted that transaction: it is raised, and the caller's retry runs unprepared."""
    pooled = bouncer.dsn(conninfo_to_dict(dsn)["dbname"])
    _seed_prepared_names(pooled)
    specs = [{"kind": "c", "payload": {"n": i}} for i in range(3)]
    with Client(dsn) as client, psycopg.connect(pooled, autocommit=True) as own:
        assert client.prepare
        made = client.enqueue_copy(specs, conn=own)
        assert len(made) == 3 and all(s.created for s in made)
        assert not client.prepare
        assert len(client.list_jobs(kind="c")) == 3
    _seed_prepared_names(pooled)  # again, for a new client
    with Client(dsn) as client, psycopg.connect(pooled) as own:
        with pytest.raises(psycopg.errors.DuplicatePreparedStatement), own.transaction():
            client.enqueue("t", {}, conn=own)
        with own.transaction():
            client.enqueue("t", {}, conn=own)
        assert len(client.list_jobs(kind="t")) == 1


class _Door:
    """A TCP port that counts the connections made to it and closes each at once (no server behind it)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()
        self.thread.join(timeout=10)


def test_prepare_false_makes_no_probe_connection(caplog: pytest.LogCaptureFixture) -> None:
    """``prepare=False``: no probe, so no connection at all at open (pools of min_size 0). The default makes one,
    per DSN: here its connection is cut, so the client cannot tell and prepares nothing."""
    caplog.set_level(logging.WARNING, logger="pgjobs")
    door = _Door()
    target = f"host=127.0.0.1 port={door.port} dbname=x user=x connect_timeout=5"
    try:
        with Client(target, min_size=0, prepare=False, read_dsn=target + " application_name=r") as client:
            assert not client.prepare

        async def main(prepare: bool) -> bool:
            async with AsyncClient(target, min_size=0, prepare=prepare) as client:
                return client.prepare

        assert not anyio.run(main, False)
        assert door.accepted == 0 and not caplog.records
        with Client(target, min_size=0, read_dsn=target + " application_name=r") as client:
            assert not client.prepare
        assert door.accepted == 1  # the read DSN is not probed once the first probe turned prepare off
        assert not anyio.run(main, True)
        assert door.accepted == 2
    finally:
        door.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("could not probe" in m for m in lines), lines
