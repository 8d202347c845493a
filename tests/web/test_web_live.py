"""Live updates: the SSE stream, fed by ONE shared reader per dashboard process; 200 concurrent clients
hold a bounded number of database connections and all get the events."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import pgjobs
from tests.web.proxy import Proxy
from tests.web.support import RunningWeb


async def _open_stream(web: RunningWeb, cookie: str, query: str = "") -> tuple[asyncio.StreamReader, Any]:
    reader, writer = await asyncio.open_connection(web.config.host, web.config.port)
    writer.write(
        f"GET /api/events{query} HTTP/1.1\r\nHost: 127.0.0.1:{web.config.port}\r\nCookie: {cookie}\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return reader, writer


async def _wait_for_job(reader: asyncio.StreamReader, job_id: int, state: str, timeout: float) -> dict[str, Any]:
    async def find() -> dict[str, Any]:
        while True:
            line = await reader.readline()
            if not line:
                raise AssertionError("stream closed")
            text = line.decode(errors="replace").strip()
            # chunked transfer: data lines come between chunk-size lines
            if text.startswith("data: "):
                msg = json.loads(text[len("data: ") :])
                if msg.get("type") == "event" and msg.get("id") == job_id and msg.get("state") == state:
                    return dict(msg)

    return await asyncio.wait_for(find(), timeout)


async def _wait_for(reader: asyncio.StreamReader, kind: str, timeout: float, **expect: Any) -> dict[str, Any]:
    """The first message of type ``kind`` (with the ``expect``ed fields, if any) within ``timeout``."""

    async def find() -> dict[str, Any]:
        while True:
            line = await reader.readline()
            if not line:
                raise AssertionError("stream closed")
            text = line.decode(errors="replace").strip()
            if text.startswith("data: "):
                msg = json.loads(text[len("data: ") :])
                if msg.get("type") == kind and all(msg.get(k) == v for k, v in expect.items()):
                    return dict(msg)

    return await asyncio.wait_for(find(), timeout)


def _cookie(web: RunningWeb) -> str:
    return f"pgjobs_session={web.config.session_value}"


def _backends(dsn: str) -> int:
    dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name LIKE 'pgjobs-web%%'",
            (dbname,),
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.smoke
def test_a_stream_gets_the_events_it_asked_for(dsn: str, web: RunningWeb) -> None:
    async def run() -> None:
        with pgjobs.Client(dsn) as c:
            other = c.enqueue("noise", {})
            watched = c.enqueue("ping", {})
            reader, writer = await _open_stream(web, _cookie(web), f"?job={watched.id}")
            await asyncio.sleep(1.0)  # the shared reader is following the stream now
            c.cancel(other.id)
            c.cancel(watched.id)
            msg = await _wait_for_job(reader, watched.id, "cancelled", 10)
            assert msg["kind"] == "ping" and msg["queue"] == "default"
            writer.close()

    asyncio.run(run())


def test_200_sse_clients_share_a_bounded_number_of_connections(dsn: str, web: RunningWeb) -> None:
    clients = 200

    async def run() -> tuple[int, int, float]:
        streams = [await _open_stream(web, _cookie(web)) for _ in range(clients)]
        deadline = time.monotonic() + 10
        while len(web.app.state.hub.subscribers) < clients and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert len(web.app.state.hub.subscribers) == clients
        await asyncio.sleep(1.0)
        during = _backends(dsn)
        with pgjobs.Client(dsn) as c:
            job = c.enqueue("fanout", {})
            t0 = time.monotonic()
            got = await asyncio.gather(*(_wait_for_job(r, job.id, "pending", 20) for r, _ in streams))
            elapsed = time.monotonic() - t0
        for _, w in streams:
            w.close()
        return during, len(got), elapsed

    during, received, elapsed = asyncio.run(run())
    assert received == clients
    # reader pool (<= 4) + the admin pool (idle: 0) + at most one LISTEN connection (no event log yet)
    assert during <= 6, f"{during} database connections for {clients} SSE clients"
    print(f"\n{clients} SSE clients: {during} database connections; all got the event in {elapsed:.2f} s")


def _proxied(dsn: str, proxy: Proxy) -> str:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params.update(host="127.0.0.1", port=str(proxy.port))
    return psycopg.conninfo.make_conninfo(**params)


def _target(dsn: str) -> tuple[str, int]:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    return str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)


def test_open_pages_are_told_when_the_database_goes_and_comes_back(
    dsn: str, make_web: Callable[..., RunningWeb]
) -> None:
    proxy = Proxy(*_target(dsn))
    proxy.up()
    try:
        web = make_web(dsn=_proxied(dsn, proxy), connect_timeout=1.0)

        async def run() -> None:
            reader, writer = await _open_stream(web, _cookie(web))
            assert (await _wait_for(reader, "db", 10))["ok"] is True
            t0 = time.monotonic()
            proxy.down()
            down = await _wait_for(reader, "db", 15)
            assert down["ok"] is False and down["error"], down
            assert time.monotonic() - t0 < 10
            r = web.client().get("/", headers={"Accept": "text/html"})
            assert r.status_code == 503 and "The database is unreachable." in r.text
            proxy.up()
            # While it was down, each new error text was its own "db" message (refused, then timed out...):
            # some may still be queued, so wait for the one that says it is back.
            assert (await _wait_for(reader, "db", 20, ok=True))["ok"] is True
            assert web.client().get("/").status_code == 200
            writer.close()

        asyncio.run(run())
    finally:
        proxy.close()


def test_the_shared_reader_is_woken_by_hints_and_forged_hints_show_nothing(
    dsn: str, make_web: Callable[..., RunningWeb]
) -> None:
    """With its poll a minute away, the dashboard's reader still shows a new job's event: the writer's hint woke
    it. Forged pgjobs_status hints (any role can send them, naming any job) make it read the log, and nothing it
    did not find there reaches a page."""
    web = make_web(poll_interval=60.0)
    hub = web.app.state.hub

    async def run() -> list[dict[str, Any]]:
        reader, writer = await _open_stream(web, _cookie(web))
        assert (await _wait_for(reader, "db", 10))["ok"] is True
        with psycopg.connect(dsn, autocommit=True) as conn:
            lie = '[{"id": 1, "state": "succeeded", "queue": "default", "kind": "x", "attempt": 1, "batch_id": null}]'
            deadline = time.monotonic() + 15
            while hub.hints < 3:  # until its LISTEN connection is up and has heard some
                assert time.monotonic() < deadline, "the reader heard no hint"
                for forged in ('{"event_id": 99999999, "pending": true}', lie, "garbage"):
                    conn.execute("SELECT pg_notify('pgjobs_status', %s)", [forged])
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # it read after them (and found nothing): it waits for a hint again
            with pgjobs.Client(dsn) as c:
                job = c.enqueue("woken", {})

        async def collect() -> list[dict[str, Any]]:
            got: list[dict[str, Any]] = []
            while True:
                line = (await reader.readline()).decode(errors="replace").strip()
                if line.startswith("data: "):
                    msg = json.loads(line[len("data: ") :])
                    if msg.get("type") == "event":
                        got.append(msg)
                        if msg.get("id") == job.id:
                            return got

        got = await asyncio.wait_for(collect(), 20)  # far below the poll: a hint woke it
        writer.close()
        return got

    got = asyncio.run(run())
    assert [(m["kind"], m["state"]) for m in got] == [("woken", "pending")]
    assert hub.events_seen == 1


def test_a_restarted_reader_keeps_one_listen_connection(dsn: str) -> None:
    """The shared reader ended (cancelled here; an error out of its loop does the same) and is started again by
    the next subscriber: its LISTEN connection went with it, so the process still holds one, not one more per
    restart."""
    from psycopg_pool import AsyncConnectionPool

    from pgjobs.client.dashboard import AsyncDashboard
    from pgjobs.web.live import Hub

    async def run() -> list[int]:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False) as pool:
            hub = Hub(AsyncDashboard(pool), 0.2, listen_dsn=dsn, application_name="pgjobs-web-test-listen")
            seen = []
            try:
                for _ in range(3):
                    before = hub._task
                    sub = hub.subscribe(None, None, None)
                    assert hub._task is not before  # a new reader
                    deadline = time.monotonic() + 10
                    while hub.hints == 0 and _backends(dsn) == 0:  # its listener connected
                        assert time.monotonic() < deadline, "the reader's listener did not connect"
                        await asyncio.sleep(0.05)
                    await asyncio.sleep(1.0)  # any listener of an earlier reader has had time to connect too
                    seen.append(_backends(dsn))
                    hub.unsubscribe(sub)
                    assert hub._task is not None
                    hub._task.cancel()  # the reader ends
                    with contextlib.suppress(asyncio.CancelledError):
                        await hub._task
                    await asyncio.sleep(0.2)
                seen.append(_backends(dsn))
            finally:
                await hub.stop()
            return seen

    assert asyncio.run(run()) == [1, 1, 1, 0]
