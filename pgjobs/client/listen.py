"""A LISTEN connection that survives: it reconnects with exponential backoff and jitter when dropped.

NOTIFY is not durable: a notification sent while the connection was down is lost for good. So after every
(re)connect, once LISTEN is in place, the consumer is told (``Connected``) and heals there: the worker wakes
every claimer, the status stream re-reads durable status. Anything committed before that moment is seen by
the re-read, anything committed after it arrives as a notification.

Used by the worker (``pgjobs_wake`` + ``pgjobs_cancel``) and by the status stream (``pgjobs_status``).
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import psycopg
from anyio.abc import TaskStatus
from psycopg import sql

log = logging.getLogger("pgjobs.listen")

NotifyCallback = Callable[[str, str], None]
ConnectCallback = Callable[[], Awaitable[None]]
ErrorCallback = Callable[[BaseException, float], None]
AsyncConn = psycopg.AsyncConnection[Any]


def backoff_delay(failures: int, base: float = 0.05, cap: float = 5.0) -> float:
    """Exponential backoff with jitter: base * 2^(failures-1), capped at ``cap``, times a random [0.5, 1.5)."""
    raw: float = min(cap, base * (2.0 ** max(0, failures - 1)))
    return raw * (0.5 + random.random())


@dataclass(frozen=True, slots=True)
class Connected:
    """The connection is (re)established and LISTENing: heal what may have been missed. ``conn`` may be
    used for queries until the next item is requested."""

    conn: AsyncConn
    reconnect: bool


@dataclass(frozen=True, slots=True)
class Notifications:
    """Notifications received together, in commit order: ``(channel, payload)`` pairs. ``conn`` may be used
    for queries until the next item is requested."""

    items: list[tuple[str, str]]
    conn: AsyncConn


@dataclass(frozen=True, slots=True)
class Tick:
    """``tick`` seconds passed without a notification; ``conn`` may be used until the next item."""

    conn: AsyncConn


ListenEvent = Connected | Notifications | Tick


class Listener:
    """One connection LISTENing on ``channels``, reconnected forever with backoff (``base`` .. ``cap`` seconds,
    jittered) until the consumer stops.

    Two ways to consume it: ``async for ev in listener.events(tick=...)`` (the status stream), or
    ``await listener.run(callback)`` which calls ``callback(channel, payload)`` for every notification and
    awaits ``on_connect()`` after each (re)connect (the worker). ``idle_check`` seconds without traffic
    trigger a ``SELECT 1`` so a silently dead connection is noticed (TCP keepalives cover the rest).

    A lost connection is logged once (WARNING) and its retries at DEBUG, unless ``on_error(exc, delay)`` is
    given: then that reports each failure (the worker folds them into its one-line-per-outage log).
    ``options``: the connection's startup options (None for none: PgBouncer refuses any).

    ``standby_ok``: a hot standby refuses LISTEN (it cannot run NOTIFY's queue); with this the connection is
    kept without it (``listening`` is False) and the consumer reads on its ``Tick`` s alone (the status stream
    from a read DSN). Without it the refusal is raised: a worker must never settle for a standby.
    """

    def __init__(
        self,
        dsn: str,
        channels: Sequence[str],
        *,
        on_connect: ConnectCallback | None = None,
        application_name: str = "pgjobs-listen",
        base: float = 0.05,
        cap: float = 2.0,
        idle_check: float = 30.0,
        connect_timeout: float = 10.0,
        on_error: ErrorCallback | None = None,
        options: str | None = "-c jit=off",  # the stream's re-reads are small; compiling their plans is not
        standby_ok: bool = False,
    ) -> None:
        if not channels:
            raise ValueError("Listener needs at least one channel")
        self.dsn = dsn
        self.channels = list(channels)
        self.on_connect = on_connect
        self.application_name = application_name
        self.base = base
        self.cap = cap
        self.idle_check = idle_check
        self.connect_timeout = connect_timeout
        self.connects = 0  # successful connects so far (1 + reconnects)
        self.backend_pid: int | None = None
        self.connected = False  # LISTENing now (metrics)
        self.on_error = on_error
        self.options = options
        self.standby_ok = standby_ok
        self.listening = False  # the last connection LISTENs (False on a standby, with standby_ok)

    async def _connect(self) -> AsyncConn:
        extra: dict[str, Any] = {} if self.options is None else {"options": self.options}
        conn = await psycopg.AsyncConnection.connect(
            self.dsn,
            autocommit=True,
            application_name=self.application_name,
            connect_timeout=max(1, round(self.connect_timeout)),
            keepalives=1,
            keepalives_idle=10,
            keepalives_interval=5,
            keepalives_count=3,
            **extra,
        )
        try:
            self.listening = await self._listen(conn)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await conn.close()
            raise
        return conn

    async def _ping(self, conn: AsyncConn) -> None:
        """The idle check's round trip, shielded and bounded as the LISTEN statements are (see _listen)."""
        with anyio.CancelScope(shield=True, deadline=anyio.current_time() + self.connect_timeout) as scope:
            await conn.execute("SELECT 1")
        if scope.cancelled_caught:
            raise psycopg.OperationalError(f"the idle check did not answer within {self.connect_timeout:g} s")

    async def _listen(self, conn: AsyncConn) -> bool:
        try:
            # Shielded, bounded by the connect timeout: a cancellation that arrives during the round trip waits
            # for its end (interrupted, psycopg cancels the query, is interrupted again, throws the connection
            # away and logs a warning).
            deadline = anyio.current_time() + self.connect_timeout
            with anyio.CancelScope(shield=True, deadline=deadline) as scope:
                for channel in self.channels:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            if scope.cancelled_caught:
                raise psycopg.OperationalError(f"LISTEN did not answer within {self.connect_timeout:g} s")
        except psycopg.errors.ReadOnlySqlTransaction:
            if not self.standby_ok:
                raise
            if self.listening or self.connects == 0:
                log.info("connected to a hot standby, which cannot LISTEN: reading on a timer instead of hints")
            return False
        return True

    async def events(self, tick: float | None = None) -> AsyncGenerator[ListenEvent, None]:
        """Yields ``Connected`` after each (re)connect, ``Notifications`` as they arrive, and ``Tick`` after
        ``tick`` quiet seconds. Connection errors are absorbed: the generator reconnects after a backoff and
        yields ``Connected`` again. A consumer whose own query on ``conn`` fails with a connection error should
        catch it and ask for the next item: the generator then finds the connection broken and reconnects."""
        failures = 0
        quiet = self.idle_check if tick is None else min(tick, self.idle_check)
        while True:
            conn: AsyncConn | None = None
            try:
                conn = await self._connect()
                self.backend_pid = conn.info.backend_pid
                self.connects += 1
                self.connected = True
                if failures and self.on_error is None:
                    log.info("LISTEN connection re-established after %d failed attempt(s)", failures)
                failures = 0
                yield Connected(conn, self.connects > 1)
                idle = 0.0
                while True:
                    got: list[tuple[str, str]] = []
                    # stop_after=1: leave the generator after each packet, so the consumer may use conn
                    async for n in conn.notifies(timeout=quiet, stop_after=1):
                        got.append((n.channel, n.payload))
                    if got:
                        idle = 0.0
                        yield Notifications(got, conn)
                        continue
                    idle += quiet
                    if tick is not None:
                        yield Tick(conn)
                    if idle >= self.idle_check:
                        idle = 0.0
                        await self._ping(conn)
            except (psycopg.OperationalError, psycopg.InterfaceError, OSError) as exc:
                failures += 1
                self.connected = False
                delay = backoff_delay(failures, self.base, self.cap)
                if self.on_error is not None:
                    self.on_error(exc, delay)
                else:
                    # once per outage, not once per retry (a 55 s outage was ~30 lines of this)
                    level = logging.WARNING if failures == 1 else logging.DEBUG
                    log.log(
                        level, "LISTEN connection lost or refused (%s); reconnecting in %.2f s", _oneline(exc), delay
                    )
                await anyio.sleep(delay)
            finally:
                self.connected = False
                if conn is not None:
                    with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                        await conn.close()

    async def run(self, callback: NotifyCallback, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Runs until cancelled: ``callback(channel, payload)`` per notification, ``on_connect()`` after each
        (re)connect. ``task_status.started()`` fires after the first connect (and its ``on_connect``)."""
        started = False
        events = self.events()
        try:
            async for ev in events:
                if isinstance(ev, Notifications):
                    for channel, payload in ev.items:
                        callback(channel, payload)
                elif isinstance(ev, Connected):
                    if self.on_connect is not None:
                        await self.on_connect()
                    if not started:
                        started = True
                        task_status.started()
        finally:
            with anyio.CancelScope(shield=True):
                await events.aclose()


def _oneline(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
