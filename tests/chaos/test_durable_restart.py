"""A parked job survives a PostgreSQL restart: a sleeping and a waiting job of a worker process
(tests/helpers/apps/durable_app.py), the server crashed (``pg_ctl stop -m immediate``: WAL replay at restart) and
started again, then the signal: both resume and succeed, the wait woken once.

The server is a PRIVATE embedded PostgreSQL (tests/chaos/test_chaos.py's ``CrashableServer``), so the crash
disturbs no other test."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

from pgjobs.ops.migrate import migrate
from tests.chaos.test_chaos import CrashableServer, Reconnecting
from tests.helpers.apps.procs import REPO, wait_for, worker_processes

pytestmark = pytest.mark.slow

APP = REPO / "tests" / "helpers" / "apps" / "durable_app.py"
FAST = {"lease": 2.0, "heartbeat_interval": 0.5, "reap_after": 6.0, "poll_interval": 0.5, "grace_period": 2.0}


@pytest.fixture(scope="module")
def server() -> Iterator[CrashableServer]:
    from pgjobs.ops import embedded

    if not embedded.is_available():
        pytest.skip("the embedded PostgreSQL package is not installed")
    data_dir = Path(tempfile.mkdtemp(prefix="pgjobs-durable-"))
    srv = CrashableServer(data_dir)
    try:
        srv.start()
        yield srv
    finally:
        try:
            srv.close()
        finally:
            shutil.rmtree(data_dir, ignore_errors=True)


def test_parked_jobs_survive_a_postgres_restart(server: CrashableServer, tmp_path: Path) -> None:
    with psycopg.connect(server.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier("durable_restart")))
    dsn = make_conninfo(server.dsn, dbname="durable_restart")
    migrate(dsn)
    db = Reconnecting(dsn)
    try:
        db.execute("CREATE TABLE step_runs (job_id bigint NOT NULL, step text NOT NULL)")
        db.execute("CREATE TABLE woken (job_id bigint NOT NULL, payload jsonb, timed_out boolean NOT NULL)")

        def enqueue(kind: str, payload: dict[str, Any]) -> int:
            return int(db.one("SELECT id FROM pgjobs.enqueue(kind => %s, payload => %s)", [kind, Jsonb(payload)]))

        waiter = enqueue("waiter", {"key": "after-restart"})
        sleeper = enqueue("sleeper", {"seconds": 4})
        with worker_processes(dsn, tmp_path, APP) as start:
            start(name="w", **FAST)
            parked = (
                "SELECT count(*) FROM pgjobs.jobs AS j WHERE j.id = ANY (%s) AND j.state IN ('waiting', 'scheduled')"
                " AND j.lease_token IS NULL"
            )
            wait_for(lambda: db.one(parked, [[waiter, sleeper]]) == 2, what="both jobs parked")
            server.restart("immediate")
            assert db.one(parked, [[waiter, sleeper]]) == 2  # the parked state and its waits came back from WAL
            assert db.one("SELECT count(*) FROM pgjobs.job_waits WHERE resolved_at IS NULL") == 2
            assert db.one("SELECT pgjobs.signal('after-restart', '{\"shipped\": true}')") == 1
            done = "SELECT count(*) FROM pgjobs.jobs WHERE id = ANY (%s) AND state = 'succeeded'"
            wait_for(lambda: db.one(done, [[waiter, sleeper]]) == 2, timeout=60, what="both jobs to succeed")
        assert db.one("SELECT result FROM pgjobs.jobs WHERE id = %s", [waiter]) == {
            "payload": {"shipped": True},
            "timed_out": False,
        }
        assert db.one("SELECT count(*) FROM woken WHERE job_id = %s", [waiter]) == 1
    finally:
        db.close()
