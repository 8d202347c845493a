"""The one shape every client method has: a SQL call and how to read its rows.

Each concern module (``enqueue``, ``claim``, ``lifecycle`` ...) builds :class:`Call` objects
with plain functions, and defines a sync and an async mixin whose methods only run them.
So the SQL text lives in one place per function, and the sync and async clients cannot drift.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, LiteralString, TypeVar

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgjobs.client.pooler import announce, first_switch, lost_prepared
from pgjobs.errors import translate

log = logging.getLogger("pgjobs.client")
T = TypeVar("T")
Rows = list[dict[str, Any]]
Tuples = list[tuple[Any, ...]]
SyncConn = psycopg.Connection[Any]
AsyncConn = psycopg.AsyncConnection[Any]


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """``read=True``: the call writes nothing (a hot standby can answer it), so a client given a ``read_dsn``
    runs it there; every other call goes to the primary."""

    query: LiteralString
    params: dict[str, Any]
    parse: Callable[[Rows], T]
    read: bool = False


@dataclass(frozen=True, slots=True)
class FastCall(Generic[T]):
    """A hot-path call: positional parameters, tuple rows (no dict per row), and a server-side prepared
    statement when the client allows it (``prepare=True``, the default): the statement is parsed and
    planned once per connection instead of once per call."""

    query: LiteralString
    params: Sequence[Any]
    parse: Callable[[Tuples], T]


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


def prepare_mode(prepare: bool) -> bool | None:
    """The ``prepare`` argument of psycopg's execute for ordinary calls: None (psycopg prepares a
    statement after a few uses) when the client may prepare, False (never) when it may not, as behind
    PgBouncer < 1.21 in transaction mode, where a prepared statement can land on another server."""
    return None if prepare else False


# Pools whose server was found gone (a connection broke in a call); each outage is logged once, when found.
_OUTAGES: set[int] = set()


def _gone(exc: psycopg.OperationalError) -> bool:
    """A lost or refused connection, not a statement that lost a race (40001/40P01 are OperationalErrors too)."""
    return exc.sqlstate is None or exc.sqlstate.startswith("08") or exc.sqlstate.startswith("57P")


def _note_outage(pool: Any, exc: psycopg.OperationalError) -> None:
    if id(pool) not in _OUTAGES:
        _OUTAGES.add(id(pool))
        first = str(exc).strip().splitlines()
        log.warning(
            "pgjobs pool %s lost its server (%s): this call failed; the pool replaces its connections and"
            " reconnects by itself (a multi-host DSN with target_session_attrs finds a promoted standby)",
            pool.name, first[0] if first else type(exc).__name__,
        )  # fmt: skip


def _sync_outage(pool: ConnectionPool[Any], exc: psycopg.OperationalError, quiet: bool) -> None:
    """A call's connection broke: its server died, restarted or failed over. The pool's other connections go
    too (drain: closed, not checked, so a server that vanished without a reset cannot hold this call up), or each
    would fail one more call; the pool opens new ones with its own backoff, where the DSN leads (a multi-host DSN
    with target_session_attrs: the promoted standby). The call itself is not retried: it may have committed (an
    enqueue without a unique key would run twice)."""
    if not _gone(exc):
        return
    if not quiet:
        _note_outage(pool, exc)
    drain = getattr(pool, "drain", None)  # psycopg_pool 3.3; before it, check() probes the idle ones instead
    with contextlib.suppress(Exception):
        if drain is not None:
            drain()
        else:
            pool.check()


async def _async_outage(pool: AsyncConnectionPool[Any], exc: psycopg.OperationalError, quiet: bool) -> None:
    if not _gone(exc):
        return
    if not quiet:
        _note_outage(pool, exc)
    drain = getattr(pool, "drain", None)
    with contextlib.suppress(Exception):
        if drain is not None:
            await drain()
        else:
            await pool.check()


class SyncRunner:
    """Runs calls on a pooled autocommit connection, or on the caller's own connection. Read calls go to the
    read pool when the client has one (``read_dsn=``: a hot standby), everything else to the primary's."""

    _pool: ConnectionPool[Any]
    _read_pool: ConnectionPool[Any] | None = None
    quiet_outages: bool = False  # a caller that logs outages itself (the worker's scheduler)
    _prepare: bool = True  # the client's ``prepare`` flag (Client(..., prepare=False) turns it off)

    def _run(self, call: Call[T], conn: SyncConn | None = None) -> T:
        prepared = self._prepare
        try:
            if conn is not None:
                return call.parse(self._fetch(conn, call, prepared))
            pool = self._read_pool if call.read and self._read_pool is not None else self._pool
            with pool.connection() as pooled:
                rows = self._fetch(pooled, call, prepared)
            if _OUTAGES:
                _OUTAGES.discard(id(pool))  # the server answers again: the next outage is logged anew
            return call.parse(rows)
        except psycopg.Error as exc:
            if prepared and unprepared(self, exc, conn):
                return self._run(call, conn)
            if conn is None and isinstance(exc, psycopg.OperationalError):
                _sync_outage(pool, exc, self.quiet_outages)
            raise translate(exc, call.query) from exc

    def _run_fast(self, call: FastCall[T], conn: SyncConn | None = None) -> T:
        prepared = self._prepare
        try:
            if conn is not None:
                cur = conn.cursor(row_factory=tuple_row)
                cur.execute(call.query, call.params, prepare=prepared)
                return call.parse(cur.fetchall())
            # getconn/putconn rather than pool.connection(): the context manager adds a commit() (a no-op
            # on these autocommit connections, taken under the connection's lock) and a generator frame:
            # 27 us a checkout and return against 11 (AsyncConnectionPool, measured on the bench machine).
            # putconn does the rest as it would: a connection left in a transaction is rolled back, a
            # broken one replaced.
            pooled = self._pool.getconn()
            try:
                # Row factory named: a pool (or caller's connection) may default to another.
                cur = pooled.cursor(row_factory=tuple_row)
                cur.execute(call.query, call.params, prepare=prepared)
                tuples = cur.fetchall()
            finally:
                self._pool.putconn(pooled)
            if _OUTAGES:
                _OUTAGES.discard(id(self._pool))
            return call.parse(tuples)
        except psycopg.Error as exc:
            if prepared and unprepared(self, exc, conn):
                return self._run_fast(call, conn)
            if conn is None and isinstance(exc, psycopg.OperationalError):
                _sync_outage(self._pool, exc, self.quiet_outages)
            raise translate(exc, call.query) from exc

    @staticmethod
    def _fetch(conn: SyncConn, call: Call[Any], prepare: bool = True) -> Rows:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(call.query, call.params, prepare=prepare_mode(prepare))
            return cur.fetchall() if cur.description else []


class AsyncRunner:
    """The async twin of :class:`SyncRunner`."""

    _pool: AsyncConnectionPool[Any]
    _read_pool: AsyncConnectionPool[Any] | None = None
    quiet_outages: bool = False  # a caller that logs outages itself (the worker's scheduler)
    _prepare: bool = True

    async def _run(self, call: Call[T], conn: AsyncConn | None = None) -> T:
        prepared = self._prepare
        try:
            if conn is not None:
                return call.parse(await self._fetch(conn, call, prepared))
            pool = self._read_pool if call.read and self._read_pool is not None else self._pool
            async with pool.connection() as pooled:
                rows = await self._fetch(pooled, call, prepared)
            if _OUTAGES:
                _OUTAGES.discard(id(pool))  # the server answers again: the next outage is logged anew
            return call.parse(rows)
        except psycopg.Error as exc:
            if prepared and unprepared(self, exc, conn):
                return await self._run(call, conn)
            if conn is None and isinstance(exc, psycopg.OperationalError):
                await _async_outage(pool, exc, self.quiet_outages)
            raise translate(exc, call.query) from exc

    async def _run_fast(self, call: FastCall[T], conn: AsyncConn | None = None) -> T:
        prepared = self._prepare
        try:
            if conn is not None:
                cur = conn.cursor(row_factory=tuple_row)
                await cur.execute(call.query, call.params, prepare=prepared)
                return call.parse(await cur.fetchall())
            pooled = await self._pool.getconn()  # (see SyncRunner._run_fast)
            try:
                cur = pooled.cursor(row_factory=tuple_row)
                await cur.execute(call.query, call.params, prepare=prepared)
                tuples = await cur.fetchall()
            finally:
                await self._pool.putconn(pooled)
            if _OUTAGES:
                _OUTAGES.discard(id(self._pool))
            return call.parse(tuples)
        except psycopg.Error as exc:
            if prepared and unprepared(self, exc, conn):
                return await self._run_fast(call, conn)
            if conn is None and isinstance(exc, psycopg.OperationalError):
                await _async_outage(self._pool, exc, self.quiet_outages)
            raise translate(exc, call.query) from exc

    @staticmethod
    async def _fetch(conn: AsyncConn, call: Call[Any], prepare: bool = True) -> Rows:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(call.query, call.params, prepare=prepare_mode(prepare))
            return await cur.fetchall() if cur.description else []


def unprepared(runner: SyncRunner | AsyncRunner, exc: psycopg.Error, conn: SyncConn | AsyncConn | None) -> bool:
    """True when ``exc`` says a pooler lost the runner's prepared statement (client/pooler.py) and the call may run
    again: the statement did not run (the error comes from Parse or Bind), and the connection is a pooled
    autocommit one or the caller's, outside a transaction (inside one the error has aborted it: the caller gets
    the error and runs the transaction again). The runner prepares nothing from then on."""
    if not lost_prepared(exc):
        return False
    if first_switch(runner):
        announce(f"pgjobs client (pool {runner._pool.name})", exc)
    return conn is None or conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


async def run_on(conn: AsyncConn, call: Call[T], prepare: bool = True) -> T:
    """Runs ``call`` on ``conn`` and parses its rows; psycopg errors propagate untranslated (the worker
    retries connection errors itself, then translates the rest)."""
    return call.parse(await AsyncRunner._fetch(conn, call, prepare))
