"""The core suite's producer figures through the client: what a user's code gets.

* one per commit through ``AsyncClient.enqueue`` vs a one-row INSERT on an ``AsyncConnection``, and
  through ``Client.enqueue`` vs the same on a ``Connection`` (psycopg, prepared, autocommit), call by call
  in turns;
* 1,000 per call through ``Client.enqueue_many`` (plain specs: as columns, ``pgjobs.enqueue_arrays``), the
  same forced through JSON (``method="json"``) and ``Client.enqueue_copy`` (COPY) vs a bare
  1,000-row INSERT from the JSON of the same Python dicts (``json.dumps`` per call, as the client does),
  returning the ids, call by call in turns.

The bare table is core's ``bench_bare.jobs``; the caller empties both tables before each figure.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

import pgjobs

from .common import Figure, figure, interleaved, median

QUEUE = "bench"
KIND = "bench.email"
PAYLOAD = {"to": "user@example.com", "template": "welcome", "n": 1}
BARE_ONE = "INSERT INTO bench_bare.jobs (queue, kind, payload) VALUES (%s, %s, %s) RETURNING id"
# The same INSERT, also sending pgjobs_wake as pgjobs.enqueue does: a transaction that notified takes
# PostgreSQL's cluster-wide notify lock at commit and holds it through its WAL flush, so notifying commits
# of every database on the server queue behind each other. The ratio of this to the bare INSERT is what
# the wake-up (part of the contract) costs on this server at this moment.
BARE_ONE_NOTIFY = (
    "WITH i AS (INSERT INTO bench_bare.jobs (queue, kind, payload) VALUES (%s, %s, %s) RETURNING id)"
    " SELECT i.id, pg_notify('pgjobs_wake', %s) FROM i"
)
BARE_MANY = (
    "INSERT INTO bench_bare.jobs (queue, kind, payload)"
    " SELECT coalesce(s ->> 'queue', 'default'), s ->> 'kind', s -> 'payload'"
    " FROM jsonb_array_elements(%s::jsonb) AS s RETURNING id"
)


async def _ainterleaved(calls: dict[str, Callable[[], Awaitable[Any]]], n: int, chunk: int) -> dict[str, list[float]]:
    """bench.common.interleaved for coroutines: turns call by call, rates per chunk of calls."""
    names = list(calls)
    spent: dict[str, list[float]] = {name: [] for name in names}
    acc = dict.fromkeys(names, 0.0)
    clock = time.perf_counter
    for i in range(n):
        for name in names if i % 2 == 0 else reversed(names):
            t0 = clock()
            await calls[name]()
            acc[name] += clock() - t0
        if (i + 1) % chunk == 0:
            for name in names:
                spent[name].append(chunk / acc[name])
                acc[name] = 0.0
    return spent


async def _async_one(dsn: str, n: int, chunk: int) -> dict[str, list[float]]:
    async with pgjobs.AsyncClient(dsn, max_size=1) as client:
        bare = await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=0)
        try:

            async def ours() -> None:
                await client.enqueue(KIND, PAYLOAD, queue=QUEUE)

            async def base() -> None:
                cur = await bare.execute(BARE_ONE, (QUEUE, KIND, Jsonb(PAYLOAD)))
                await cur.fetchall()

            for _ in range(20):  # prepare and warm both
                await ours()
                await base()
            return await _ainterleaved({"ours": ours, "bare": base}, n, chunk)
        finally:
            await bare.close()


def run(
    dsn: str, single_calls: int, single_chunk: int, bulk_batches: int, bulk_chunk: int, reset: Callable[[], None]
) -> tuple[list[Figure], dict[str, Any]]:
    figures: list[Figure] = []
    raw: dict[str, Any] = {}

    reset()
    s = asyncio.run(_async_one(dsn, single_calls, single_chunk))
    raw["client_enqueue_async"] = s
    figures.append(
        figure(
            "AsyncClient.enqueue, one per commit",
            median(s["ours"]),
            "jobs/s",
            baseline=median(s["bare"]),
            baseline_name="bare one-row INSERT per commit, psycopg AsyncConnection (prepared)",
            bar=0.8,
        )
    )

    reset()
    with pgjobs.Client(dsn, max_size=1) as client, psycopg.connect(dsn, autocommit=True, prepare_threshold=0) as bare:

        def ours_one() -> None:
            client.enqueue(KIND, PAYLOAD, queue=QUEUE)

        def bare_one() -> None:
            bare.execute(BARE_ONE, (QUEUE, KIND, Jsonb(PAYLOAD))).fetchall()

        def bare_notify() -> None:
            bare.execute(BARE_ONE_NOTIFY, (QUEUE, KIND, Jsonb(PAYLOAD), QUEUE)).fetchall()

        for _ in range(20):
            ours_one()
            bare_one()
            bare_notify()
        s = interleaved({"ours": ours_one, "bare": bare_one, "bare_notify": bare_notify}, single_calls, single_chunk)
        raw["client_enqueue_sync"] = s
        figures.append(
            figure(
                "Client.enqueue, one per commit",
                median(s["ours"]),
                "jobs/s",
                baseline=median(s["bare"]),
                baseline_name="bare one-row INSERT per commit, psycopg Connection (prepared)",
                bar=0.8,
            )
        )
        figures.append(
            figure(
                "bare INSERT + pg_notify('pgjobs_wake'), one per commit",
                median(s["bare_notify"]),
                "jobs/s",
                baseline=median(s["bare"]),
                baseline_name="the same INSERT without NOTIFY",
                note="informational: what the wake NOTIFY's commit lock costs on this server now (enqueue pays it)",
            )
        )
        figures.append(
            figure(
                "Client.enqueue vs the bare INSERT + NOTIFY",
                median(s["ours"]),
                "jobs/s",
                baseline=median(s["bare_notify"]),
                baseline_name="bare one-row INSERT + pg_notify per commit",
                note="informational: the enqueue's cost beside its wake-up",
            )
        )

        specs = [{"kind": KIND, "queue": QUEUE, "payload": {"to": f"user{i}@example.com", "n": i}} for i in range(1000)]

        def columns_many() -> None:
            client.enqueue_many(specs)

        def json_many() -> None:
            client.enqueue_many(specs, method="json")

        def copy_many() -> None:
            client.enqueue_copy(specs)

        def bare_many() -> None:
            bare.execute(BARE_MANY, (json.dumps(specs),)).fetchall()

        reset()
        for _ in range(2):
            columns_many()
            json_many()
            copy_many()
            bare_many()
        s = interleaved(
            {"columns": columns_many, "json": json_many, "copy": copy_many, "bare": bare_many}, bulk_batches, bulk_chunk
        )
        s = {k: [v * 1000 for v in vs] for k, vs in s.items()}
        raw["client_enqueue_many"] = s
        for key, name in (
            ("columns", "Client.enqueue_many (plain specs as columns)"),
            ("json", "Client.enqueue_many (JSON)"),
            ("copy", "Client.enqueue_copy (COPY)"),
        ):
            figures.append(
                figure(
                    f"{name}, batches of 1,000",
                    median(s[key]),
                    "jobs/s",
                    baseline=median(s["bare"]),
                    baseline_name="bare 1,000-row INSERT from json.dumps of the same dicts, RETURNING id",
                    bar=0.5,
                )
            )
    return figures, raw
