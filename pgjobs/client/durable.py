"""Durable execution: steps, sleeps, signal waits and signals (sql/durable.sql).

The worker-side calls (``record_step``, ``job_steps``, ``sleep_until``, ``await_signal``) are lease-token
compare-and-sets like the rest of ``lifecycle``: once the token no longer holds the job they change nothing
(False, no rows, None). ``signal`` is a producer's call; ``durable_status`` a reader's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from pgjobs.client._call import AsyncConn, AsyncRunner, Call, Rows, SyncConn, SyncRunner, interval, jsonb, scalar

KEEP_SIGNAL = timedelta(days=1)  # signal()'s default: how long a signal nobody waits for is kept


@dataclass(frozen=True, slots=True)
class WaitOutcome:
    """What ``sleep_until`` / ``await_signal`` answered: ``outcome`` is ``slept``, ``signal`` (with ``payload``),
    ``timeout``, ``parked`` (the job was given back: stop), ``cancelled`` (it ended cancelled: stop), or
    ``lost`` (the token no longer holds the job)."""

    outcome: str
    payload: Any = None

    @property
    def parked(self) -> bool:
        """The handler must stop here: the job was given back, ended, or is no longer this attempt's."""
        return self.outcome in ("parked", "cancelled", "lost")


def _outcome(rows: Rows) -> WaitOutcome:
    if not rows or rows[0]["outcome"] is None:
        return WaitOutcome("lost")
    return WaitOutcome(str(rows[0]["outcome"]), rows[0].get("payload"))


def _interval_or_none(value: float | timedelta | None) -> timedelta | None:
    return None if value is None else interval(value)


def record_step_call(id: int, lease_token: UUID | str, name: str, result: Any) -> Call[bool]:
    return Call(
        "SELECT pgjobs.record_step(id => %(id)s, lease_token => %(tok)s, name => %(name)s, result => %(result)s)",
        {"id": id, "tok": lease_token, "name": name, "result": jsonb(result)},
        lambda rows: bool(scalar(rows)),
    )


def job_steps_call(id: int, lease_token: UUID | str) -> Call[dict[str, Any]]:
    return Call(
        "SELECT name, result FROM pgjobs.job_steps(id => %(id)s, lease_token => %(tok)s)",
        {"id": id, "tok": lease_token},
        lambda rows: {str(r["name"]): r["result"] for r in rows},
    )


def sleep_call(id: int, lease_token: UUID | str, name: str, seconds: float | timedelta) -> Call[WaitOutcome]:
    """A sleep of ``seconds`` from now as the database tells time (the first call of a name fixes its end)."""
    return Call(
        "SELECT pgjobs.sleep_until(id => %(id)s, lease_token => %(tok)s, name => %(name)s,"
        " until => now() + %(secs)s) AS outcome",
        {"id": id, "tok": lease_token, "name": name, "secs": interval(seconds)},
        _outcome,
    )


def sleep_until_call(id: int, lease_token: UUID | str, name: str, until: datetime) -> Call[WaitOutcome]:
    return Call(
        "SELECT pgjobs.sleep_until(id => %(id)s, lease_token => %(tok)s, name => %(name)s, until => %(until)s)"
        " AS outcome",
        {"id": id, "tok": lease_token, "name": name, "until": until},
        _outcome,
    )


def await_signal_call(
    id: int, lease_token: UUID | str, name: str, key: str, timeout: float | timedelta | None
) -> Call[WaitOutcome]:
    """A wait for a signal on ``key``, timing out ``timeout`` from now (None: never)."""
    return Call(
        "SELECT outcome, payload FROM pgjobs.await_signal(id => %(id)s, lease_token => %(tok)s, name => %(name)s,"
        " key => %(key)s, timeout_at => now() + %(timeout)s)",
        {"id": id, "tok": lease_token, "name": name, "key": key, "timeout": _interval_or_none(timeout)},
        _outcome,
    )


def signal_call(key: str, payload: Any, keep: float | timedelta) -> Call[int]:
    return Call(
        "SELECT pgjobs.signal(key => %(key)s, payload => %(payload)s, keep => %(keep)s)",
        {"key": key, "payload": jsonb({} if payload is None else payload), "keep": interval(keep)},
        lambda rows: int(scalar(rows) or 0),
    )


def durable_status_call(id: int) -> Call[dict[str, Any] | None]:
    return Call("SELECT pgjobs.durable_status(id => %(id)s)", {"id": id}, scalar, read=True)


def purge_signals_call() -> Call[int]:
    return Call("SELECT pgjobs.purge_signals()", {}, lambda rows: int(scalar(rows) or 0))


class DurableOps(SyncRunner):
    def signal(
        self, key: str, payload: Any = None, *, keep: float | timedelta = KEEP_SIGNAL, conn: SyncConn | None = None
    ) -> int:
        """Wakes every job waiting on ``key`` (``ctx.wait_for``) with ``payload``; returns how many. With no
        waiter the signal is kept for ``keep`` for the first job that waits on the key."""
        return self._run(signal_call(key, payload, keep), conn)

    def durable_status(self, id: int, *, conn: SyncConn | None = None) -> dict[str, Any] | None:
        """The job's recorded steps (name, result size), sleeps and waits, and what it is parked on now."""
        return self._run(durable_status_call(id), conn)

    def record_step(self, id: int, lease_token: UUID, name: str, result: Any, *, conn: SyncConn | None = None) -> bool:
        return self._run(record_step_call(id, lease_token, name, result), conn)

    def job_steps(self, id: int, lease_token: UUID, *, conn: SyncConn | None = None) -> dict[str, Any]:
        return self._run(job_steps_call(id, lease_token), conn)

    def sleep_until(
        self, id: int, lease_token: UUID, name: str, until: datetime, *, conn: SyncConn | None = None
    ) -> WaitOutcome:
        return self._run(sleep_until_call(id, lease_token, name, until), conn)

    def await_signal(
        self,
        id: int,
        lease_token: UUID,
        name: str,
        key: str,
        timeout: float | timedelta | None = None,
        *,
        conn: SyncConn | None = None,
    ) -> WaitOutcome:
        return self._run(await_signal_call(id, lease_token, name, key, timeout), conn)

    def purge_signals(self, *, conn: SyncConn | None = None) -> int:
        return self._run(purge_signals_call(), conn)


class AsyncDurableOps(AsyncRunner):
    async def signal(
        self, key: str, payload: Any = None, *, keep: float | timedelta = KEEP_SIGNAL, conn: AsyncConn | None = None
    ) -> int:
        """See :meth:`DurableOps.signal`."""
        return await self._run(signal_call(key, payload, keep), conn)

    async def durable_status(self, id: int, *, conn: AsyncConn | None = None) -> dict[str, Any] | None:
        return await self._run(durable_status_call(id), conn)

    async def record_step(
        self, id: int, lease_token: UUID, name: str, result: Any, *, conn: AsyncConn | None = None
    ) -> bool:
        return await self._run(record_step_call(id, lease_token, name, result), conn)

    async def job_steps(self, id: int, lease_token: UUID, *, conn: AsyncConn | None = None) -> dict[str, Any]:
        return await self._run(job_steps_call(id, lease_token), conn)

    async def sleep_until(
        self, id: int, lease_token: UUID, name: str, until: datetime, *, conn: AsyncConn | None = None
    ) -> WaitOutcome:
        return await self._run(sleep_until_call(id, lease_token, name, until), conn)

    async def await_signal(
        self,
        id: int,
        lease_token: UUID,
        name: str,
        key: str,
        timeout: float | timedelta | None = None,
        *,
        conn: AsyncConn | None = None,
    ) -> WaitOutcome:
        return await self._run(await_signal_call(id, lease_token, name, key, timeout), conn)

    async def purge_signals(self, *, conn: AsyncConn | None = None) -> int:
        return await self._run(purge_signals_call(), conn)
