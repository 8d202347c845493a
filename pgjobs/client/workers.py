"""Worker presence: heartbeat, reaping silent workers, listing (sql/workers.sql)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pgjobs.client._call import AsyncConn, AsyncRunner, Call, SyncConn, SyncRunner, interval, jsonb, scalar
from pgjobs.records import UnhandledKind, WorkerInfo


def worker_heartbeat_call(worker: str, meta: dict[str, Any] | None = None) -> Call[datetime]:
    return Call(
        "SELECT pgjobs.worker_heartbeat(worker => %(worker)s, meta => %(meta)s)",
        {"worker": worker, "meta": jsonb(meta or {})},
        scalar,
    )


def reap_workers_call(stale_after: float | timedelta) -> Call[int]:
    return Call("SELECT pgjobs.reap_workers(stale_after => %(s)s)", {"s": interval(stale_after)}, scalar)


def reap_workers_after_restart_call(stale_after: float | timedelta) -> Call[int]:
    """``reap_workers(stale_after)``, but nothing while the server has been up for less than ``stale_after``.

    A server that restarted less than stale_after ago has heard no worker for as long as it was down: nobody is
    reaped until every live worker had its chance to heartbeat again (else the first worker back would take the
    running jobs of all the others)."""
    return Call(
        "SELECT CASE WHEN now() - pg_postmaster_start_time() >= %(s)s::interval"
        " THEN pgjobs.reap_workers(stale_after => %(s)s::interval) ELSE 0 END",
        {"s": interval(stale_after)},
        scalar,
    )


def list_workers_call(stale_after: float | timedelta | None = None) -> Call[list[WorkerInfo]]:
    return Call(
        "SELECT * FROM pgjobs.list_workers(stale_after => %(s)s)",
        {"s": None if stale_after is None else interval(stale_after)},
        lambda rows: [WorkerInfo.from_row(r) for r in rows],
        read=True,
    )


def unhandled_kinds_call(queues: list[str] | None = None, sample: int = 1000) -> Call[list[UnhandledKind]]:
    return Call(
        "SELECT * FROM pgjobs.unhandled_kinds(queues => %(q)s, sample => %(n)s)",
        {"q": queues, "n": sample},
        lambda rows: [UnhandledKind.from_row(r) for r in rows],
        read=True,
    )


def deregister_worker_call(worker: str) -> Call[bool]:
    return Call("SELECT pgjobs.deregister_worker(worker => %(worker)s)", {"worker": worker}, scalar)


class WorkerOps(SyncRunner):
    def worker_heartbeat(
        self, worker: str, meta: dict[str, Any] | None = None, *, conn: SyncConn | None = None
    ) -> datetime:
        return self._run(worker_heartbeat_call(worker, meta), conn)

    def reap_workers(self, stale_after: float | timedelta = 60.0, *, conn: SyncConn | None = None) -> int:
        """Forgets workers silent for ``stale_after`` and frees their jobs at once; returns how many."""
        return self._run(reap_workers_call(stale_after), conn)

    def list_workers(
        self, stale_after: float | timedelta | None = None, *, conn: SyncConn | None = None
    ) -> list[WorkerInfo]:
        """Registered workers, each ``status`` 'live' or 'stale' (silent for ``stale_after``, default three
        of its heartbeat intervals)."""
        return self._run(list_workers_call(stale_after), conn)

    def deregister_worker(self, worker: str, *, conn: SyncConn | None = None) -> bool:
        """Removes a stopped worker (its held jobs become claimable at once); False if it was not registered."""
        return self._run(deregister_worker_call(worker), conn)

    def unhandled_kinds(
        self, queues: list[str] | None = None, sample: int = 1000, *, conn: SyncConn | None = None
    ) -> list[UnhandledKind]:
        """Kinds whose claimable jobs no live worker takes (in ``queues``, default all), read from the first
        ``sample`` jobs of each queue in claim order, where jobs nobody takes collect."""
        return self._run(unhandled_kinds_call(queues, sample), conn)


class AsyncWorkerOps(AsyncRunner):
    async def worker_heartbeat(
        self, worker: str, meta: dict[str, Any] | None = None, *, conn: AsyncConn | None = None
    ) -> datetime:
        return await self._run(worker_heartbeat_call(worker, meta), conn)

    async def reap_workers(self, stale_after: float | timedelta = 60.0, *, conn: AsyncConn | None = None) -> int:
        return await self._run(reap_workers_call(stale_after), conn)

    async def list_workers(
        self, stale_after: float | timedelta | None = None, *, conn: AsyncConn | None = None
    ) -> list[WorkerInfo]:
        return await self._run(list_workers_call(stale_after), conn)

    async def deregister_worker(self, worker: str, *, conn: AsyncConn | None = None) -> bool:
        return await self._run(deregister_worker_call(worker), conn)

    async def unhandled_kinds(
        self, queues: list[str] | None = None, sample: int = 1000, *, conn: AsyncConn | None = None
    ) -> list[UnhandledKind]:
        return await self._run(unhandled_kinds_call(queues, sample), conn)
