"""``pgjobs.Client(dsn, app=app)`` enqueues a declared kind with its handler's ``queue``,
``priority`` and ``max_attempts``; explicit arguments win; undeclared kinds get the SQL defaults."""

from __future__ import annotations

from typing import Any

import anyio
import psycopg
import pytest

import pgjobs


def _app() -> pgjobs.App:
    app = pgjobs.App()

    @app.job("send_email", queue="emails", max_attempts=5, priority=3)
    async def send_email(payload: dict[str, Any], ctx: pgjobs.JobContext) -> None: ...

    @app.job("plain")
    def plain(payload: dict[str, Any], ctx: pgjobs.SyncJobContext) -> None: ...

    return app


def _row(conn: psycopg.Connection[Any], id: int) -> tuple[str, int, int]:
    row = conn.execute("SELECT queue, priority, max_attempts FROM pgjobs.jobs WHERE id = %s", (id,)).fetchone()
    assert row is not None
    return (row[0], row[1], row[2])


@pytest.mark.smoke
def test_client_with_app_applies_the_declared_defaults(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = _app()
    with pgjobs.Client(dsn, app=app) as client:
        declared = client.enqueue("send_email", {"to": "ada@example.com"})
        explicit = client.enqueue("send_email", {}, queue="urgent", priority=0, max_attempts=1)
        plain = client.enqueue("plain")
        unknown = client.enqueue("not_declared")
    assert _row(conn, declared.id) == ("emails", 3, 5)  # before the fix: ("default", 0, 20)
    assert _row(conn, explicit.id) == ("urgent", 0, 1)  # explicit arguments win, also when they equal SQL's
    assert _row(conn, plain.id) == ("default", 0, 20)
    assert _row(conn, unknown.id) == ("default", 0, 20)


def test_client_without_app_is_unchanged(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with pgjobs.Client(dsn) as client:
        job = client.enqueue("send_email")
    assert _row(conn, job.id) == ("default", 0, 20)


def test_enqueue_many_and_batches_fill_only_missing_keys(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with pgjobs.Client(dsn, app=_app()) as client:
        rows = client.enqueue_many(
            [{"kind": "send_email"}, {"kind": "send_email", "queue": "other", "max_attempts": 20}, {"kind": "x"}]
        )
        with client.batch() as b:
            member = b.enqueue("send_email", {"n": 1})
            then = b.then("send_email", {"n": 2})
    assert [_row(conn, r.id) for r in rows] == [("emails", 3, 5), ("other", 3, 20), ("default", 0, 20)]
    assert member.id is not None and then.id is not None
    assert _row(conn, member.id) == ("emails", 3, 5)
    assert _row(conn, then.id) == ("emails", 3, 5)


def test_async_client_and_the_handlers_own_enqueue(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = _app()

    async def main() -> list[int]:
        async with pgjobs.AsyncClient(dsn, app=app) as client:
            a = await client.enqueue("send_email")
            b = await client.enqueue_many([{"kind": "send_email", "priority": 7}])
        async with pgjobs.AsyncClient(dsn) as bare:  # no app: the handler brings its own defaults
            c = await app.handlers["send_email"].enqueue(bare, {"x": 1}, queue="q2")
        return [a.id, b[0].id, c.id]

    a, b, c = anyio.run(main)
    assert _row(conn, a) == ("emails", 3, 5)
    assert _row(conn, b) == ("emails", 7, 5)
    assert _row(conn, c) == ("q2", 3, 5)
    with pgjobs.Client(dsn) as client:
        d = app.handlers["plain"].enqueue(client)
    assert _row(conn, d.id) == ("default", 0, 20)


def test_app_declarations(dsn: str) -> None:
    app = _app()
    assert app.queues == ["default", "emails"]
    assert app.enqueue_defaults("send_email") == {"queue": "emails", "priority": 3, "max_attempts": 5}
    assert app.enqueue_defaults("nope") == {}
    with pytest.raises(TypeError, match="enqueue_defaults"):
        pgjobs.Client(dsn, app=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="priority"):
        app.job("big", priority=40_000)
