"""The client's ``enqueue_many`` sends plain specs (kind, queue, payload, a string ref; other keys at their
defaults) as columns through ``pgjobs.enqueue_arrays``, anything else as one JSON document. Both paths must
store, return and refuse alike (the SQL function itself: tests/sql/test_enqueue_arrays.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from pgjobs import AsyncClient, Client, InvalidArgument, QueueFull
from pgjobs.client.enqueue import lean_columns

Conn = psycopg.Connection[Any]


def stored(conn: Conn, ids: list[int]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT kind, queue, payload, meta, state::text, priority, max_attempts, run_at = created_at"
        " FROM pgjobs.jobs WHERE id = ANY (%s) ORDER BY array_position(%s, id)",
        (ids, ids),
    ).fetchall()


@pytest.mark.parametrize(
    "spec",
    [
        {"kind": "k", "priority": 1},
        {"kind": "k", "priority": False},  # the server refuses a boolean priority: JSON words it
        {"kind": "k", "max_attempts": 3},
        {"kind": "k", "unique_key": "u"},
        {"kind": "k", "group_key": "g"},
        {"kind": "k", "meta": {"m": 1}},
        {"kind": "k", "run_at": "2030-01-01T00:00:00Z"},
        {"kind": "k", "depends_on": []},
        {"kind": "k", "ref": 7},
        {"kind": "k", "payload": None},
        {"kind": "k", "queue": None},
        {"kind": ""},
        {"kind": "k" * 1001},
        {"kind": "é" * 501},
        {"kind": 5},
        {"kind": "k", "bogus": 1},
    ],
)
def test_a_spec_the_columns_cannot_carry_goes_as_json(spec: dict[str, Any]) -> None:
    assert lean_columns([{"kind": "ok"}, spec]) is None


def test_plain_specs_and_keys_at_their_defaults_go_as_columns() -> None:
    specs = [
        {"kind": "a"},
        {"kind": "b", "queue": "q", "payload": {"x": 1}, "ref": "r"},
        {"kind": "c", "priority": 0, "max_attempts": 20, "run_at": None, "meta": {}, "unique_live_only": False},
        {"kind": "é" * 300},  # 600 bytes: within the limit although over 250 characters
    ]
    columns = lean_columns(specs)
    assert columns is not None
    kinds, payloads, queues, refs = columns
    assert kinds == ["a", "b", "c", "é" * 300] and queues == ["default", "q", "default", "default"]
    assert payloads is not None and payloads.obj == [{}, {"x": 1}, {}, {}] and refs == [None, "r", None, None]
    bare = lean_columns([{"kind": "a"}, {"kind": "b", "payload": {}}])
    assert bare is not None and bare[1] is None  # no payload anywhere: NULL, read as {} for every job
    assert lean_columns([]) is None and lean_columns([{"kind": "k"}] * 100_001) is None


def test_client_enqueue_many_of_plain_specs_matches_the_json_path(dsn: str, conn: Conn) -> None:
    specs: list[dict[str, Any]] = [{"kind": "m", "payload": {"i": i}, "ref": f"r{i}"} for i in range(5)]
    specs.append({"kind": "m", "queue": "other"})
    with Client(dsn) as client:
        auto = client.enqueue_many(specs)
        js = client.enqueue_many(specs, method="json")
    assert [(s.ref, s.created, s.batch_id) for s in auto] == [(s.ref, s.created, s.batch_id) for s in js]
    assert [s.ref for s in auto] == ["r0", "r1", "r2", "r3", "r4", None]
    assert stored(conn, [s.id for s in auto]) == stored(conn, [s.id for s in js])
    with Client(dsn) as client:  # no payload anywhere: sent as NULL, stored as {} all the same
        bare = client.enqueue_many([{"kind": "np"}, {"kind": "np", "payload": {}}])
    assert [r[:3] for r in stored(conn, [s.id for s in bare])] == [("np", "default", {})] * 2


def test_client_refusals_read_the_same_whichever_path(dsn: str, conn: Conn) -> None:
    with Client(dsn) as client:
        client.configure_queue("tiny", max_length=1)
        with pytest.raises(QueueFull):
            client.enqueue_many([{"kind": "k", "queue": "tiny"}] * 2)
        with pytest.raises(InvalidArgument, match=r"jobs\[1\]: kind must be at most 1000 bytes"):
            client.enqueue_many([{"kind": "k"}, {"kind": "k" * 1001}])
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone() == (0,)


def test_async_client_enqueue_many_joins_the_callers_transaction(dsn: str, conn: Conn) -> None:
    async def run() -> list[int]:
        own = await psycopg.AsyncConnection.connect(dsn)
        try:
            async with AsyncClient(dsn) as client:
                out = await client.enqueue_many([{"kind": "t"}] * 3, conn=own)
            await own.rollback()
            return [s.id for s in out]
        finally:
            await own.close()

    ids = asyncio.run(run())
    assert len(ids) == 3
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone() == (0,)
