"""Reads from a hot standby: the read DSN of the clients, the CLI, the dashboard and the status stream.

A private primary and two streaming standbys (``tests/helpers/replication.py``, PostgreSQL 15's binaries;
skipped when they are absent). A standby refuses every write, so a read path that works there writes nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import psycopg
import pytest

from pgjobs import AsyncClient, Client, NeedsPrimary
from pgjobs.ops.migrate import migrate
from pgjobs.web.config import WebConfig
from tests.helpers.apps.procs import REPO
from tests.helpers.replication import Pair, bin_dir, replicated_pair
from tests.web.support import TOKEN, free_port, start_web, stop_web

pytestmark = [
    pytest.mark.slow,
    pytest.mark.failover,
    pytest.mark.skipif(bin_dir() is None, reason="no PostgreSQL 15 binaries (initdb, pg_basebackup) to run a standby"),
]


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with replicated_pair(synchronous=True) as p:
        migrate(p.primary.dsn())
        yield p


def test_client_read_calls_go_to_the_standby(pair: Pair) -> None:
    with Client(pair.primary.dsn(), read_dsn=pair.standby.dsn()) as client:
        job = client.enqueue("report", {"n": 1}, queue="reads")
        specs = client.enqueue_many(
            [{"ref": "a", "kind": "step"}, {"ref": "b", "kind": "step", "depends_on": [{"ref": "a"}]}], as_batch=True
        )
        batch_id = specs[0].batch_id
        assert batch_id is not None
        pair.wait_replayed()
        assert client._read_pool is not None
        with client._read_pool.connection() as c:  # the read pool's server: the standby
            assert c.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)

        status = client.job_status(job.id)
        assert status is not None and status.state.value == "pending" and status.queue == "reads"
        assert {(s.queue, s.state.value, s.jobs) for s in client.stats()} >= {("reads", "pending", 1)}
        assert [j.id for j in client.list_jobs(queue="reads")] == [job.id]
        assert client.count_jobs(queue="reads") == 1
        batch = client.batch_status(batch_id)
        assert batch is not None and batch.total == 2
        graph = client.batch_graph(batch_id)
        assert graph is not None and len(graph["nodes"]) == 2
        assert client.list_workers() == [] and client.list_schedules() == []
        # A standby does not tick (a tick writes): its stream shows what the primary's ticks gave ids, here
        # maintain()'s (the workers run one every few seconds; so does any follower on the primary).
        assert client.read_events(0, queue="reads") == []
        assert any(a.action == "tick" and a.rows for a in client.maintain())  # maintain writes: the primary's
        pair.wait_replayed()
        events = client.read_events(0, queue="reads")
        assert [(e.id, e.state.value) for e in events] == [(job.id, "pending")]
        assert client.stream_head() >= events[-1].event_id  # type: ignore[operator]

        # Writes still go to the primary through the same client.
        assert client.cancel(job.id) is True

    async def async_reads() -> None:
        async with AsyncClient(pair.primary.dsn(), read_dsn=pair.standby.dsn()) as client:
            assert client._read_pool is not None
            async with client._read_pool.connection() as c:
                assert await (await c.execute("SELECT pg_is_in_recovery()")).fetchone() == (True,)
            status = await client.job_status(job.id)
            assert status is not None and status.state.value == "cancelled"
            assert [e.id for e in await client.read_events(0, queue="reads")] == [job.id]

    pair.wait_replayed()
    anyio.run(async_reads)

    # A client pointed at the standby alone: the write is refused with the call named, nothing changed.
    with Client(pair.standby.dsn()) as on_standby, pytest.raises(NeedsPrimary, match=r"pgjobs\.enqueue .*primary"):
        on_standby.enqueue("report")


def test_web_read_dsn_flag() -> None:
    from pgjobs.cli.main import build_parser
    from pgjobs.web.server import config_from_args

    args = build_parser().parse_args(["web", "--dsn", "host=primary", "--read-dsn", "host=standby"])
    config = config_from_args(args)
    assert (config.dsn, config.reader_dsn) == ("host=primary", "host=standby")


def test_cli_status_and_stats_read_dsn(pair: Pair) -> None:
    with Client(pair.primary.dsn()) as client:
        job = client.enqueue("cli-read", queue="cli")
    pair.wait_replayed()
    # --dsn names a port where nothing listens: the commands talk to the read DSN alone.
    dead = f"host=127.0.0.1 port={free_port()} user=postgres dbname=postgres connect_timeout=1"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    common = ["--dsn", dead, "--read-dsn", pair.standby.dsn(), "--json"]
    out = subprocess.run(
        [sys.executable, "-m", "pgjobs", "stats", *common], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr
    assert {"queue": "cli", "state": "pending", "jobs": 1} in json.loads(out.stdout)["queues"]
    out = subprocess.run(
        [sys.executable, "-m", "pgjobs", "status", str(job.id), *common],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["id"] == job.id
    # --follow from the standby while the job is live (the stream there polls: a standby cannot LISTEN); the job
    # ends on the primary, and the follow ends once the standby has replayed it.
    follow = subprocess.Popen(
        [sys.executable, "-m", "pgjobs", "status", str(job.id), "--follow", *common],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert follow.stdout is not None
        first = json.loads(follow.stdout.readline())
        assert first["type"] == "job" and first["state"] == "pending"
        with Client(pair.primary.dsn()) as client:
            client.cancel(job.id)
            client.maintain()
        rest, err = follow.communicate(timeout=60)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait(10)
    assert follow.returncode == 1, err  # followed to its end, which is not a success
    lines = [json.loads(line) for line in rest.splitlines()]
    assert lines[-1]["type"] == "job" and lines[-1]["state"] == "cancelled"


def test_dashboard_pages_from_the_standby(pair: Pair) -> None:
    with Client(pair.primary.dsn()) as client:
        job = client.enqueue("dash-read", queue="dash")
    pair.wait_replayed()
    config = WebConfig(
        dsn=pair.primary.dsn(), reader_dsn=pair.standby.dsn(), host="127.0.0.1", port=free_port(), token=TOKEN
    )
    web = start_web(config)
    try:
        http = web.client()
        try:
            for path in ("/", "/jobs", f"/jobs/{job.id}", "/queues/dash", "/workers", "/schedules", "/api/overview"):
                r = http.get(path)
                assert r.status_code == 200, (path, r.text[:500])
            assert "dash-read" in http.get(f"/jobs/{job.id}").text

            # The live stream of the job's page, read from the standby (no LISTEN there: the shared reader polls).
            async def live() -> dict[str, Any]:
                reader, writer = await asyncio.open_connection(config.host, config.port)
                writer.write(
                    f"GET /api/events?job={job.id} HTTP/1.1\r\nHost: {config.host}:{config.port}\r\n"
                    f"Cookie: pgjobs_session={config.session_value}\r\nAccept: text/event-stream\r\n\r\n".encode()
                )
                await writer.drain()
                assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
                await asyncio.sleep(1.0)  # the shared reader follows the log now
                # An action goes to the primary (--dsn): the standby could not take it.
                form = {"csrf_token": web.csrf()}
                r = await asyncio.to_thread(
                    http.post, f"/jobs/{job.id}/cancel", data=form, headers={"Origin": web.url}, follow_redirects=False
                )
                assert r.status_code in (200, 303), r.text[:500]
                with Client(pair.primary.dsn()) as client:
                    client.maintain()  # the primary's tick: the event's id, which the standby then shows
                try:
                    async with asyncio.timeout(20):
                        while True:
                            line = (await reader.readline()).decode(errors="replace").strip()
                            if line.startswith("data: "):
                                msg: dict[str, Any] = json.loads(line[len("data: ") :])
                                if msg.get("type") == "event" and msg.get("state") == "cancelled":
                                    return msg
                finally:
                    writer.close()

            assert (asyncio.run(live()))["id"] == job.id
            # Its LISTEN task keeps its connection to the standby (no LISTEN there), rather than dying on it.
            listen = web.app.state.hub._listen_task
            assert listen is not None and not listen.done()
        finally:
            http.close()
        with psycopg.connect(pair.primary.dsn()) as conn:
            row = conn.execute("SELECT state::text FROM pgjobs.jobs WHERE id = %s", (job.id,)).fetchone()
        assert row == ("cancelled",)
    finally:
        stop_web(web)


def test_stream_resumes_from_its_cursor_across_a_switch_of_standbys() -> None:
    """subscribe() on ``host=s1,s2 target_session_attrs=standby``: s1 dies mid-stream, the stream goes on from s2
    after its cursor. Every event the primary logged comes exactly once and in order; the standbys never tick,
    so the primary's maintain() (the workers' pass) does."""
    with replicated_pair(synchronous=False, standbys=2) as p:
        migrate(p.primary.dsn())
        s1, s2 = p.standbys
        read_dsn = (
            f"host=127.0.0.1,127.0.0.1 port={s1.port},{s2.port} user=postgres dbname=postgres"
            " target_session_attrs=standby connect_timeout=2"
        )
        total = 300
        got: list[tuple[int, int]] = []
        done = threading.Event()

        def produce() -> None:
            with Client(p.primary.dsn()) as client:
                for i in range(total):
                    client.enqueue("streamed", {"i": i}, queue="follow")
                    if i % 20 == 19:
                        client.maintain()  # ticks: what a standby follower can read
                while not done.is_set():
                    client.maintain()
                    time.sleep(0.1)

        async def follow() -> None:
            async with AsyncClient(p.primary.dsn()) as client:
                events = client.subscribe(queue="follow", after_id=0, poll_interval=0.1, read_dsn=read_dsn)
                with anyio.fail_after(60):
                    async for ev in events:
                        assert ev.event_id is not None
                        got.append((ev.event_id, ev.id))
                        if len(got) == total // 3:
                            await anyio.to_thread.run_sync(s1.kill9)
                        if len(got) >= total:
                            break
                    await events.aclose()

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        try:
            anyio.run(follow)
        finally:
            done.set()
            producer.join(30)
        with psycopg.connect(p.primary.dsn()) as conn:
            logged = conn.execute("SELECT event_id, id FROM pgjobs.read_events(0, 10000, queue => 'follow')").fetchall()
        assert len(logged) == total
        assert got == logged  # no gap, no repeat, in order, across the switch
        assert s1.postmaster_pid() is not None and not _answers(s1.dsn())


def _answers(dsn: str) -> bool:
    try:
        psycopg.connect(dsn, connect_timeout=1).close()
        return True
    except psycopg.OperationalError:
        return False
