"""One adapter per queue in ``python -m bench peers``: each drives its system through that system's own
documented public API (no SQL of ours against its tables, except to empty them between phases), with
its defaults, except the worker concurrency, which every adapter sets to the same ``--concurrency``.

An adapter does, in the bench process: ``open`` (install its schema in its own fresh database, connect a
producer), ``enqueue_one`` (one job, one commit), ``enqueue_bulk`` (``n`` jobs in one call), ``reset``
(empty the queue) and ``close``; and in a worker process: ``work`` (run its worker until ``stop`` is set,
calling ``hooks.done()`` at the start of every job).

The jobs are no-ops in a queue named ``bench``. The peers' packages come from the ``bench-peers`` extra
(``pip install -e '.[bench-peers]'``); an adapter whose package is missing is reported and skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing.synchronize
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import quote

from psycopg.conninfo import conninfo_to_dict

QUEUE = "bench"
KIND = "noop"


def url(dsn: str) -> str:
    """A postgresql:// URL for ``dsn`` (asyncpg and awa's Rust driver take URLs only)."""
    p = conninfo_to_dict(dsn)
    user = quote(str(p.get("user", "postgres")))
    password = f":{quote(str(p['password']))}" if p.get("password") else ""
    host = p.get("host", "127.0.0.1")
    return f"postgresql://{user}{password}@{host}:{p.get('port', 5432)}/{p.get('dbname', 'postgres')}"


class Hooks(Protocol):
    def done(self) -> None: ...


class Adapter(Protocol):
    name: str

    async def open(self, dsn: str) -> None: ...
    async def enqueue_one(self) -> None: ...
    async def enqueue_bulk(self, n: int) -> None: ...
    async def reset(self) -> None: ...
    async def close(self) -> None: ...
    async def work(self, dsn: str, concurrency: int, hooks: Hooks, stop: Any) -> None: ...


async def _until(stop: multiprocessing.synchronize.Event) -> None:
    while not stop.is_set():
        await asyncio.sleep(0.05)


# --------------------------------------------------------------------------------------------------------
# pgjobs


class PgJobs:
    name = "pgjobs"

    async def open(self, dsn: str) -> None:
        import pgjobs

        self.client = pgjobs.AsyncClient(dsn, max_size=2)
        await self.client.open()
        self._bulk: list[dict[str, Any]] = []

    async def enqueue_one(self) -> None:
        await self.client.enqueue(KIND, queue=QUEUE)

    async def enqueue_bulk(self, n: int) -> None:
        if len(self._bulk) != n:
            self._bulk = [{"kind": KIND, "queue": QUEUE}] * n
        # enqueue_many (JSON): at 1,000 a call pgjobs' faster bulk path since its rows are read by name
        # (1.24x enqueue_copy for these specs, same run; the bench core suite reports both).
        await self.client.enqueue_many(self._bulk)

    async def reset(self) -> None:
        async with self.client.pool.connection() as conn:
            await conn.execute("TRUNCATE pgjobs.jobs CASCADE")

    async def close(self) -> None:
        await self.client.close()

    async def work(self, dsn: str, concurrency: int, hooks: Hooks, stop: Any) -> None:
        import pgjobs

        app = pgjobs.App()

        @app.job(KIND)
        async def noop(payload: Any, ctx: pgjobs.JobContext) -> None:
            hooks.done()

        worker = pgjobs.Worker(app, dsn, {QUEUE: concurrency}, scheduler=False, grace_period=5.0)
        task = asyncio.create_task(worker.run())
        await _until(stop)
        worker.stop()
        await task


# --------------------------------------------------------------------------------------------------------
# pgqueuer (asyncpg, as its documentation's examples)


class PgQueuer:
    name = "pgqueuer"

    async def open(self, dsn: str) -> None:
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries

        self.conn = await asyncpg.connect(url(dsn))
        self.queries = Queries(AsyncpgDriver(self.conn))
        await self.queries.install()

    async def enqueue_one(self) -> None:
        await self.queries.enqueue(KIND, None)

    async def enqueue_bulk(self, n: int) -> None:
        await self.queries.enqueue([KIND] * n, [None] * n, [0] * n)

    async def reset(self) -> None:
        await self.queries.clear_queue()

    async def close(self) -> None:
        await self.conn.close()

    async def work(self, dsn: str, concurrency: int, hooks: Hooks, stop: Any) -> None:
        import asyncpg
        from pgqueuer import AsyncpgDriver, PgQueuer

        conn = await asyncpg.connect(url(dsn))
        pgq = PgQueuer(AsyncpgDriver(conn))

        @pgq.entrypoint(KIND)  # type: ignore[untyped-decorator, unused-ignore]  # untyped where pgqueuer is absent
        async def noop(job: Any) -> None:
            hooks.done()

        # batch_size is pgqueuer's concurrency knob (its default is 10)
        task = asyncio.create_task(pgq.run(batch_size=concurrency))
        await _until(stop)
        pgq.shutdown.set()
        await task
        await conn.close()


# --------------------------------------------------------------------------------------------------------
# procrastinate (psycopg 3)


class Procrastinate:
    name = "procrastinate"

    def _app(self, dsn: str) -> Any:
        import procrastinate

        return procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    async def open(self, dsn: str) -> None:
        self.app = self._app(dsn)
        await self.app.open_async()
        await self.app.schema_manager.apply_schema_async()
        self.task = self.app.task(name=KIND, queue=QUEUE)(_noop)

    async def enqueue_one(self) -> None:
        await self.task.defer_async()

    async def enqueue_bulk(self, n: int) -> None:
        await self.task.batch_defer_async(*([{}] * n))

    async def reset(self) -> None:
        await self.app.connector.execute_query_async("TRUNCATE procrastinate_jobs CASCADE")

    async def close(self) -> None:
        await self.app.close_async()

    async def work(self, dsn: str, concurrency: int, hooks: Hooks, stop: Any) -> None:
        app = self._app(dsn)

        async def noop() -> None:
            hooks.done()

        app.task(name=KIND, queue=QUEUE)(noop)
        async with app.open_async():
            task = asyncio.create_task(
                app.run_worker_async(queues=[QUEUE], concurrency=concurrency, install_signal_handlers=False)
            )
            await _until(stop)
            task.cancel()  # procrastinate's documented way to stop a worker task: it finishes running jobs
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _noop() -> None:
    return None


# --------------------------------------------------------------------------------------------------------
# awa (awa-pg: a Rust core with a Python SDK)


@dataclasses.dataclass
class Noop:
    n: int = 0


class Awa:
    name = "awa"

    async def open(self, dsn: str) -> None:
        import awa

        self.client = awa.AsyncClient(url(dsn), max_connections=2)
        await self.client.migrate()
        self._bulk: list[Noop] = []

    async def enqueue_one(self) -> None:
        await self.client.insert(Noop(), queue=QUEUE)

    async def enqueue_bulk(self, n: int) -> None:
        # insert_many_copy: awa's COPY path on its default (canonical) storage; enqueue_many_copy needs the
        # queue-storage backend installed, which is not the default after migrate().
        if len(self._bulk) != n:
            self._bulk = [Noop()] * n
        await self.client.insert_many_copy(self._bulk, queue=QUEUE)

    async def reset(self) -> None:
        await self.client.drain_queue(QUEUE)

    async def close(self) -> None:
        await self.client.close()

    async def work(self, dsn: str, concurrency: int, hooks: Hooks, stop: Any) -> None:
        import awa

        client = awa.AsyncClient(url(dsn))

        @client.task(Noop, queue=QUEUE)  # type: ignore[untyped-decorator, unused-ignore]  # untyped where awa is absent
        async def noop(job: Any) -> None:
            hooks.done()

        await client.start([(QUEUE, concurrency)])
        await _until(stop)
        await client.shutdown()
        await client.close()


# --------------------------------------------------------------------------------------------------------
# bare psycopg: the floor a queue's producer cannot beat (enqueue phases only)

BARE_DDL = """
CREATE TABLE IF NOT EXISTS bench_bare (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue   text NOT NULL,
    kind    text NOT NULL,
    payload jsonb NOT NULL DEFAULT '{}',
    state   smallint NOT NULL DEFAULT 0,
    run_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS bench_bare_claim_idx ON bench_bare (queue, run_at, id) WHERE state = 0;
"""


class Bare:
    """A one-row INSERT per commit, and a 1,000-row INSERT from the JSON of the same Python dicts, through
    psycopg with prepared statements on a held connection: no queue, so no pickup or processing."""

    name = "bare INSERT"
    processes = False

    async def open(self, dsn: str) -> None:
        import psycopg

        self.conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=0)
        await self.conn.execute(BARE_DDL, prepare=False)
        self._bulk: list[dict[str, Any]] = []

    async def enqueue_one(self) -> None:
        from psycopg.types.json import Jsonb

        cur = await self.conn.execute(
            "INSERT INTO bench_bare (queue, kind, payload) VALUES (%s, %s, %s) RETURNING id", (QUEUE, KIND, Jsonb({}))
        )
        await cur.fetchall()

    async def enqueue_bulk(self, n: int) -> None:
        from psycopg.types.json import Jsonb

        if len(self._bulk) != n:
            self._bulk = [{"kind": KIND, "queue": QUEUE}] * n
        cur = await self.conn.execute(
            "INSERT INTO bench_bare (queue, kind, payload)"
            " SELECT s ->> 'queue', s ->> 'kind', coalesce(s -> 'payload', '{}') FROM jsonb_array_elements(%s) AS s"
            " RETURNING id",
            (Jsonb(self._bulk),),
        )
        await cur.fetchall()

    async def reset(self) -> None:
        await self.conn.execute("TRUNCATE bench_bare")

    async def close(self) -> None:
        await self.conn.close()

    async def work(self, dsn: str, concurrency: int, hooks: Hooks, stop: Any) -> None:
        raise NotImplementedError


ADAPTERS: dict[str, Callable[[], Any]] = {
    "pgjobs": PgJobs,
    "pgqueuer": PgQueuer,
    "procrastinate": Procrastinate,
    "awa": Awa,
    "bare": Bare,
}
PACKAGES = {"pgqueuer": "pgqueuer", "procrastinate": "procrastinate", "awa": "awa", "oban": "oban"}


def missing(name: str) -> str | None:
    """Why peer ``name`` cannot run here, or None."""
    if name == "oban":
        if sys.version_info < (3, 12):
            return f"oban-py needs Python >= 3.12; this is {sys.version.split()[0]}"
        try:
            import oban  # noqa: F401
        except ImportError:
            return "package oban is not installed (pip install -e '.[bench-peers]' on Python >= 3.12)"
        return "no adapter for oban-py yet"
    module = PACKAGES.get(name)
    if module is None:
        return None
    try:
        __import__(module)
    except ImportError as exc:
        return f"{exc} (pip install -e '.[bench-peers]')"
    return None


def stamp() -> float:
    """The clock every process of the bench shares (CLOCK_MONOTONIC is system-wide on Linux)."""
    return time.monotonic()
