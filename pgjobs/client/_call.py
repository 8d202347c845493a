"""The one shape every client method has: a SQL call and how to read its rows.

Each concern module (``enqueue``, ``claim``, ``lifecycle`` ...) builds :class:`Call` objects
with plain functions, and defines a sync and an async mixin whose methods only run them.
So the SQL text lives in one place per function, and the sync and async clients cannot drift.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, LiteralString, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgjobs.errors import translate

T = TypeVar("T")
Rows = list[dict[str, Any]]
SyncConn = psycopg.Connection[Any]
AsyncConn = psycopg.AsyncConnection[Any]


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    query: LiteralString
    params: dict[str, Any]
    parse: Callable[[Rows], T]


def jsonb(value: Any) -> Jsonb | None:
    """A jsonb parameter; Python None stays SQL NULL (pass ``Jsonb(None)`` for a JSON null: a Jsonb passes as is)."""
    if isinstance(value, Jsonb):
        return value
    return None if value is None else Jsonb(value)


def interval(value: float | timedelta) -> timedelta:
    """Seconds or a timedelta, as an interval parameter."""
    return value if isinstance(value, timedelta) else timedelta(seconds=value)


def scalar(rows: Rows) -> Any:
    return next(iter(rows[0].values())) if rows else None


class SyncRunner:
    """Runs calls on a pooled autocommit connection, or on the caller's own connection."""

    _pool: ConnectionPool[Any]

    def _run(self, call: Call[T], conn: SyncConn | None = None) -> T:
        try:
            if conn is not None:
                return call.parse(self._fetch(conn, call))
            with self._pool.connection() as pooled:
                return call.parse(self._fetch(pooled, call))
        except psycopg.Error as exc:
            raise translate(exc) from exc

    @staticmethod
    def _fetch(conn: SyncConn, call: Call[Any]) -> Rows:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(call.query, call.params)
            return cur.fetchall() if cur.description else []


class AsyncRunner:
    """The async twin of :class:`SyncRunner`."""

    _pool: AsyncConnectionPool[Any]

    async def _run(self, call: Call[T], conn: AsyncConn | None = None) -> T:
        try:
            if conn is not None:
                return call.parse(await self._fetch(conn, call))
            async with self._pool.connection() as pooled:
                return call.parse(await self._fetch(pooled, call))
        except psycopg.Error as exc:
            raise translate(exc) from exc

    @staticmethod
    async def _fetch(conn: AsyncConn, call: Call[Any]) -> Rows:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(call.query, call.params)
            return await cur.fetchall() if cur.description else []


async def run_on(conn: AsyncConn, call: Call[T]) -> T:
    """Runs ``call`` on ``conn`` and parses its rows; psycopg errors propagate untranslated (the worker
    retries connection errors itself, then translates the rest)."""
    return call.parse(await AsyncRunner._fetch(conn, call))
