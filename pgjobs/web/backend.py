"""The dashboard's database side: small pools with short timeouts, the clients over them, and what a
database error means for a page.

Two pools at most, whatever the number of browsers: the reader pool (``--reader-dsn`` or the DSN; pages,
the live event reader, ``/metrics``) and, unless ``--read-only``, the admin pool (``--admin-dsn`` or the
DSN; actions). A page never waits long for a dead server: connecting gives up after ``connect_timeout``
seconds, so does waiting for a pooled connection, and every statement after ``statement_timeout_ms``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from pgjobs.client import AsyncClient
from pgjobs.client.dashboard import AsyncDashboard
from pgjobs.errors import PgJobsError, SchemaMissing
from pgjobs.web.config import WebConfig

T = TypeVar("T")
CACHE_TTL = 1.5  # seconds


def _pool(config: WebConfig, dsn: str, role: str | None, max_size: int, suffix: str) -> AsyncConnectionPool[Any]:
    options = f"-c statement_timeout={int(config.statement_timeout_ms)}"
    if role:
        options += f" -c role={role}"
    return AsyncConnectionPool(
        dsn,
        min_size=0,
        max_size=max_size,
        timeout=config.connect_timeout,
        kwargs={
            "autocommit": True,
            "connect_timeout": max(1, round(config.connect_timeout)),
            "application_name": f"{config.application_name}{suffix}",
            "options": options,
        },
        check=AsyncConnectionPool.check_connection,
        open=False,
        name=f"pgjobs-web{suffix}",
    )


@dataclass
class Backend:
    config: WebConfig
    reader_pool: AsyncConnectionPool[Any]
    admin_pool: AsyncConnectionPool[Any] | None
    client: AsyncClient
    dash: AsyncDashboard
    admin: AsyncClient | None
    admin_dash: AsyncDashboard | None
    _cache: dict[Hashable, tuple[float, Any]] = field(default_factory=dict)
    _locks: dict[Hashable, asyncio.Lock] = field(default_factory=dict)

    async def cached(self, key: Hashable, load: Callable[[], Awaitable[T]], ttl: float = CACHE_TTL) -> T:
        """``load()``'s value, shared by every request for ``ttl`` seconds: the aggregate reads (counts,
        throughput, workers) cost the database the same whether 1 or 200 pages refresh live."""
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:  # concurrent misses wait for one load
            hit = self._cache.get(key)
            if hit is not None and hit[0] > time.monotonic():
                value: T = hit[1]
                return value
            value = await load()
            self._cache[key] = (time.monotonic() + ttl, value)
            return value

    def invalidate(self) -> None:
        """After an action: the next page shows its effect."""
        self._cache.clear()

    @classmethod
    def create(cls, config: WebConfig) -> Backend:
        reader = _pool(config, config.reader_dsn or config.dsn, config.role, config.pool_size, "")
        admin = None
        if not config.read_only:
            admin = _pool(config, config.admin_dsn or config.dsn, config.admin_role, 2, "-admin")
        return cls(
            config,
            reader,
            admin,
            AsyncClient(pool=reader),
            AsyncDashboard(reader),
            None if admin is None else AsyncClient(pool=admin),
            None if admin is None else AsyncDashboard(admin),
        )

    async def open(self) -> None:
        await self.reader_pool.open(wait=False)
        if self.admin_pool is not None:
            await self.admin_pool.open(wait=False)

    async def close(self) -> None:
        await self.reader_pool.close(timeout=2)
        if self.admin_pool is not None:
            await self.admin_pool.close(timeout=2)

    def actions(self) -> tuple[AsyncClient, AsyncDashboard]:
        if self.admin is None or self.admin_dash is None:
            raise PermissionError("this dashboard is read-only (--read-only): actions are disabled")
        return self.admin, self.admin_dash


def unavailable_reason(exc: BaseException) -> str | None:
    """A one-line reason when ``exc`` means the database is unreachable or too slow; None otherwise."""
    if isinstance(exc, PoolTimeout):
        return "no database connection could be made in time"
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return "the database did not answer in time (statement timeout)"
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        first = str(exc).strip().splitlines()
        return first[0] if first else type(exc).__name__
    if isinstance(exc, SchemaMissing):
        return str(exc)
    return None


def is_refusal(exc: BaseException) -> bool:
    """A pgjobs refusal (PJxxx): bad argument, not found, wrong state... shown as a 4xx with its message."""
    return isinstance(exc, PgJobsError) and not isinstance(exc, SchemaMissing)
