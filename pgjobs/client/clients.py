"""``Client`` and ``AsyncClient``: typed wrappers of the SQL functions over a psycopg-pool pool.

Each method is one SQL call, one round trip. Pass ``conn=`` to run it on your own connection,
inside your own transaction (the job then exists only if your transaction commits).
The methods come from one mixin per concern, each beside the SQL file it calls.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgjobs.client.admin import AdminOps, AsyncAdminOps
from pgjobs.client.claim import AsyncClaimOps, ClaimOps
from pgjobs.client.defaults import EnqueueDefaults
from pgjobs.client.durable import AsyncDurableOps, DurableOps
from pgjobs.client.enqueue import AsyncEnqueueOps, EnqueueOps
from pgjobs.client.explain import AsyncExplainOps, ExplainOps
from pgjobs.client.fair import AsyncFairOps, FairOps
from pgjobs.client.graph import AsyncGraphOps, GraphOps
from pgjobs.client.lifecycle import AsyncLifecycleOps, LifecycleOps
from pgjobs.client.pooler import aprobe, probe, switch_after_probe
from pgjobs.client.rates import AsyncRateOps, RateOps
from pgjobs.client.recurring import AsyncRecurringOps, RecurringOps
from pgjobs.client.status import AsyncStatusOps, StatusOps
from pgjobs.client.stream import StreamOps, SyncStreamOps
from pgjobs.client.workers import AsyncWorkerOps, WorkerOps


def _conn_kwargs(prepare: bool) -> dict[str, Any]:
    """Connection settings of a pool the client opens. ``prepare=False`` also stops psycopg's own
    prepare-after-five-uses, for PgBouncer < 1.21 in transaction mode (a statement prepared on one
    server connection is missing on the next)."""
    return {"autocommit": True} if prepare else {"autocommit": True, "prepare_threshold": None}


def _probed(dsn: str | None, read_dsn: str | None) -> list[str]:
    """The DSNs the client's own pools connect to, each probed once at open (a replica's pooler may differ)."""
    return [d for d in dict.fromkeys((dsn, read_dsn)) if d is not None]


class Client(
    EnqueueOps,
    ClaimOps,
    LifecycleOps,
    AdminOps,
    FairOps,
    RateOps,
    StatusOps,
    WorkerOps,
    RecurringOps,
    GraphOps,
    SyncStreamOps,
    ExplainOps,
    DurableOps,
):
    """Synchronous client. ``Client(dsn)`` opens its own pool; ``Client(pool=...)`` shares yours.

    ``app=``: a :class:`pgjobs.App` (or any :class:`~pgjobs.client.defaults.EnqueueDefaults`) whose declared
    ``queue``/``priority``/``max_attempts`` apply when an enqueue of a declared kind does not give them.
    ``prepare=True`` (the default) runs the hot calls as server-side prepared statements; behind a pooler that
    cannot keep them (PgBouncer < 1.21 in transaction mode) the client finds it before the first statement by one
    probe connection per DSN it opens a pool for (``dsn``, ``read_dsn``), else by the error, logs it once and
    prepares nothing from then on (client/pooler.py); ``prepare=False`` prepares nothing from the start and makes
    no probe. A pool given with ``pool=`` / ``read_pool=`` is not probed (its owner knows where it connects: give
    ``prepare=False`` behind a pooler); the error is still found.

    ``read_dsn=`` (or ``read_pool=``): where the read calls go (job_status, batch_status, stats, list_jobs,
    read_events, ...): a hot standby, or several (``host=s1,s2 target_session_attrs=prefer-standby``). Every
    other call goes to ``dsn``, the primary. A standby shows what it has replayed: a job enqueued a moment ago
    may not be there yet (docs/replicas-and-failover.md)."""

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: ConnectionPool[Any] | None = None,
        min_size: int = 1,
        max_size: int = 10,
        app: EnqueueDefaults | None = None,
        prepare: bool = True,
        read_dsn: str | None = None,
        read_pool: ConnectionPool[Any] | None = None,
    ) -> None:
        if app is not None and not isinstance(app, EnqueueDefaults):
            raise TypeError(f"app= needs an object with enqueue_defaults(kind), such as pgjobs.App; got {app!r}")
        self._enqueue_defaults = app
        self._prepare = prepare
        if pool is None and dsn is None:
            raise ValueError("Client needs a dsn or a pool")
        for probed in _probed(dsn if pool is None else None, read_dsn if read_pool is None else None):
            if self._prepare:  # before any pool connection: nothing is prepared until the probe says so
                switch_after_probe(self, "pgjobs client (pool pgjobs)", probe(probed))
        prepare = self._prepare
        if pool is None:
            if dsn is None:
                raise ValueError("Client needs a dsn or a pool")
            pool = ConnectionPool(
                dsn, min_size=min_size, max_size=max_size, kwargs=_conn_kwargs(prepare), open=True, name="pgjobs"
            )
            self._owns_pool = True
        else:
            self._owns_pool = False
        self._pool = pool
        self.dsn = dsn
        self.read_dsn = read_dsn
        self._owns_read_pool = read_pool is None and read_dsn is not None
        if read_pool is None and read_dsn is not None:
            read_pool = ConnectionPool(
                read_dsn, min_size=0, max_size=max_size, kwargs=_conn_kwargs(prepare), open=True, name="pgjobs-read"
            )
        self._read_pool = read_pool

    @property
    def pool(self) -> ConnectionPool[Any]:
        return self._pool

    @property
    def prepare(self) -> bool:
        """Whether the client runs server-side prepared statements now (off after ``prepare=False``, or once a
        pooler that cannot keep them was found: by the probe at open or by its error)."""
        return self._prepare

    def close(self) -> None:
        if self._owns_pool:
            self._pool.close()
        if self._owns_read_pool and self._read_pool is not None:
            self._read_pool.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class AsyncClient(
    AsyncEnqueueOps,
    AsyncClaimOps,
    AsyncLifecycleOps,
    AsyncAdminOps,
    AsyncFairOps,
    AsyncRateOps,
    AsyncStatusOps,
    AsyncExplainOps,
    AsyncWorkerOps,
    AsyncRecurringOps,
    AsyncGraphOps,
    StreamOps,
    AsyncDurableOps,
):
    """Asynchronous client. Use ``async with AsyncClient(dsn) as client:`` (or ``await client.open()``);
    ``app=``, ``prepare=`` and ``read_dsn=`` as for :class:`Client` (``subscribe()`` also reads from
    ``read_dsn``)."""

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: AsyncConnectionPool[Any] | None = None,
        min_size: int = 1,
        max_size: int = 10,
        app: EnqueueDefaults | None = None,
        prepare: bool = True,
        read_dsn: str | None = None,
        read_pool: AsyncConnectionPool[Any] | None = None,
    ) -> None:
        if app is not None and not isinstance(app, EnqueueDefaults):
            raise TypeError(f"app= needs an object with enqueue_defaults(kind), such as pgjobs.App; got {app!r}")
        self._enqueue_defaults = app
        if pool is None:
            if dsn is None:
                raise ValueError("AsyncClient needs a dsn or a pool")
            pool = AsyncConnectionPool(
                dsn, min_size=min_size, max_size=max_size, kwargs=_conn_kwargs(prepare), open=False, name="pgjobs"
            )
            self._owns_pool = True
        else:
            self._owns_pool = False
        self._pool = pool
        self._prepare = prepare
        self._probed = not prepare  # prepare=False: no probe
        self.dsn = dsn
        self.read_dsn = read_dsn
        self._owns_read_pool = read_pool is None and read_dsn is not None
        if read_pool is None and read_dsn is not None:
            read_pool = AsyncConnectionPool(
                read_dsn, min_size=0, max_size=max_size, kwargs=_conn_kwargs(prepare), open=False, name="pgjobs-read"
            )
        self._read_pool = read_pool

    @property
    def pool(self) -> AsyncConnectionPool[Any]:
        return self._pool

    @property
    def prepare(self) -> bool:
        """Whether the client runs server-side prepared statements now (off after ``prepare=False``, or once a
        pooler that cannot keep them was found: by the probe at open or by its error)."""
        return self._prepare

    async def open(self) -> None:
        if not self._probed:  # once per client, before its pools open: nothing is prepared until it says so
            self._probed = True
            for probed in _probed(
                self.dsn if self._owns_pool else None, self.read_dsn if self._owns_read_pool else None
            ):
                if self._prepare:
                    switch_after_probe(self, "pgjobs client (pool pgjobs)", await aprobe(probed))
            for p, own in ((self._pool, self._owns_pool), (self._read_pool, self._owns_read_pool)):
                if own and not self._prepare and p is not None and isinstance(p.kwargs, dict):
                    p.kwargs.update(_conn_kwargs(False))  # the connections the pools open prepare nothing
        if self._owns_pool:
            await self._pool.open()
        if self._owns_read_pool and self._read_pool is not None:
            await self._read_pool.open()

    async def close(self) -> None:
        if self._owns_pool:
            await self._pool.close()
        if self._owns_read_pool and self._read_pool is not None:
            await self._read_pool.close()

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()
