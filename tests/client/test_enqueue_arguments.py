"""The Python client's own checks of enqueue's arguments (pgjobs/client/arguments.py): a priority beyond
smallint, a payload that is not a JSON object or is None, and a run_at string PostgreSQL's date parser would
read its own way ("tomorrow") are InvalidArgument naming the value, and nothing is stored."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import anyio
import psycopg
import pytest

import pgjobs
from pgjobs import AsyncClient, Client, InvalidArgument
from pgjobs.testing import perform_job


def _jobs(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("priority", [40000, -32769, 2**40, True, 1.5])
def test_a_priority_outside_smallint_is_invalid_argument_naming_it(
    dsn: str, conn: psycopg.Connection[Any], priority: Any
) -> None:
    with Client(dsn) as client:
        with pytest.raises(InvalidArgument, match=f"priority must be an integer.*got {priority!r}"):
            client.enqueue("k", {}, priority=priority)
        with pytest.raises(InvalidArgument, match="priority"):
            client.enqueue_many([{"kind": "k", "priority": priority}])
        assert client.enqueue("k", {}, priority=32767).created
        assert client.enqueue("k", {}, priority=-32768).created
    assert _jobs(conn) == 2


@pytest.mark.parametrize("payload", [[1, 2], "hi", 3, None])
def test_a_payload_that_is_not_a_json_object_is_invalid_argument(
    dsn: str, conn: psycopg.Connection[Any], payload: Any
) -> None:
    with Client(dsn) as client:
        with pytest.raises(InvalidArgument, match="payload must"):
            client.enqueue("k", payload)
        for method in ("auto", "json", "copy"):
            with pytest.raises(InvalidArgument, match="payload must"):
                client.enqueue_many([{"kind": "k", "payload": payload}], method=method)  # type: ignore[arg-type]
    assert _jobs(conn) == 0


def test_a_payload_left_out_is_an_empty_object_and_none_is_refused(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = pgjobs.App()

    @app.job("noted")
    def noted(payload: dict[str, Any], ctx: pgjobs.SyncJobContext) -> dict[str, Any]:
        return {"seen": payload}

    with Client(dsn) as client:
        ids = [client.enqueue("k").id, app.handlers["noted"].enqueue(client).id]
        with pytest.raises(InvalidArgument, match="payload must not be None"):
            client.enqueue("k", None)
        with pytest.raises(InvalidArgument, match="payload must not be None"):
            app.handlers["noted"].enqueue(client, None)
    rows = conn.execute("SELECT payload FROM pgjobs.jobs WHERE id = ANY (%s) ORDER BY id", [ids]).fetchall()
    assert rows == [({},), ({},)]
    assert perform_job(app, "noted", conn=conn).result == {"seen": {}}


@pytest.mark.parametrize("run_at", ["tomorrow", "now", "soon", "2030-13-45", 5])
def test_a_run_at_that_is_not_a_datetime_or_iso_8601_is_invalid_argument(
    dsn: str, conn: psycopg.Connection[Any], run_at: Any
) -> None:
    with Client(dsn) as client:
        with pytest.raises(InvalidArgument, match="run_at must be a datetime or an ISO 8601 string"):
            client.enqueue("k", {}, run_at=run_at)
        if isinstance(run_at, str):
            for method in ("json", "copy"):
                with pytest.raises(InvalidArgument, match="run_at must be a datetime or an ISO 8601 string"):
                    client.enqueue_many([{"kind": "k", "run_at": run_at}], method=method)  # type: ignore[arg-type]
    assert _jobs(conn) == 0


def test_a_run_at_as_iso_8601_text_or_datetime_is_taken(dsn: str, conn: psycopg.Connection[Any]) -> None:
    when = datetime(2031, 2, 3, 4, 5, 6, tzinfo=UTC)
    with Client(dsn) as client:
        ids = [
            client.enqueue("k", {}, run_at=when).id,
            client.enqueue("k", {}, run_at="2031-02-03T04:05:06Z").id,
            client.enqueue("k", {}, run_at="2031-02-03T05:05:06+01:00").id,
            client.enqueue_many([{"kind": "k", "run_at": "2031-02-03T04:05:06+00:00"}])[0].id,
        ]
    rows = conn.execute("SELECT run_at, state FROM pgjobs.jobs WHERE id = ANY (%s)", [ids]).fetchall()
    assert rows == [(when, "scheduled")] * 4


def test_the_async_client_checks_the_same(dsn: str, conn: psycopg.Connection[Any]) -> None:
    async def main() -> None:
        async with AsyncClient(dsn) as client:
            for kwargs in ({"priority": 40000}, {"run_at": "tomorrow"}):
                with pytest.raises(InvalidArgument):
                    await client.enqueue("k", {}, **kwargs)
            with pytest.raises(InvalidArgument, match="payload"):
                await client.enqueue("k", [1, 2])
            assert (await client.enqueue("k")).created

    anyio.run(main)
    assert _jobs(conn) == 1
