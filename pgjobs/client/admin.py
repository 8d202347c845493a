"""Managing work: cancel, retry, delete, purge and queue settings (sql/admin.sql; purge: sql/maintain.sql)."""

from __future__ import annotations

from datetime import timedelta

from pgjobs.client._call import AsyncConn, AsyncRunner, Call, SyncConn, SyncRunner, interval, scalar
from pgjobs.records import QueueSettings


def cancel_call(id: int) -> Call[bool]:
    return Call("SELECT pgjobs.cancel(id => %(id)s)", {"id": id}, scalar)


def retry_call(id: int) -> Call[bool]:
    return Call("SELECT pgjobs.retry(id => %(id)s)", {"id": id}, scalar)


def delete_call(id: int) -> Call[bool]:
    return Call("SELECT pgjobs.delete(id => %(id)s)", {"id": id}, scalar)


def purge_call(succeeded_before: float | timedelta | None, failed_before: float | timedelta | None) -> Call[int]:
    return Call(
        "SELECT pgjobs.purge(succeeded_before => %(s)s, failed_before => %(f)s)",
        {
            "s": None if succeeded_before is None else interval(succeeded_before),
            "f": None if failed_before is None else interval(failed_before),
        },
        scalar,
    )


def configure_queue_call(
    queue: str,
    *,
    max_length: int | None = None,
    paused: bool | None = None,
    fair: bool | None = None,
    noisy_share: float | None = None,
    noisy_min_active: int | None = None,
    max_active_per_group: int | None = None,
    max_active: int | None = None,
    status_events: str | None = None,
    retention: timedelta | None = None,
    max_starts: int | None = None,
    per: float | timedelta | None = None,
) -> Call[QueueSettings]:
    return Call(
        "SELECT * FROM pgjobs.configure_queue(queue => %(queue)s, max_length => %(max_length)s,"
        " paused => %(paused)s, fair => %(fair)s, noisy_share => %(noisy_share)s::real,"
        " noisy_min_active => %(noisy_min_active)s, max_active_per_group => %(max_active_per_group)s,"
        " max_active => %(max_active)s, status_events => %(status_events)s, retention => %(retention)s::interval,"
        " max_starts => %(max_starts)s, per => %(per)s::interval)",
        {
            "queue": queue,
            "max_length": max_length,
            "paused": paused,
            "fair": fair,
            "noisy_share": noisy_share,
            "noisy_min_active": noisy_min_active,
            "max_active_per_group": max_active_per_group,
            "max_active": max_active,
            "status_events": status_events,
            "retention": retention,
            "max_starts": max_starts,
            "per": timedelta(seconds=per) if isinstance(per, int | float) else per,
        },
        lambda rows: QueueSettings.from_row(rows[0]),
    )


def queues_call() -> Call[list[QueueSettings]]:
    return Call(
        "SELECT * FROM pgjobs.list_queues()", {}, lambda rows: [QueueSettings.from_row(r) for r in rows], read=True
    )


class AdminOps(SyncRunner):
    def cancel(self, id: int, *, conn: SyncConn | None = None) -> bool:
        """Cancels a job not yet running, or asks the worker of a running one to stop. False if terminal."""
        return self._run(cancel_call(id), conn)

    def retry(self, id: int, *, conn: SyncConn | None = None) -> bool:
        return self._run(retry_call(id), conn)

    def delete(self, id: int, *, conn: SyncConn | None = None) -> bool:
        return self._run(delete_call(id), conn)

    def purge(
        self,
        succeeded_before: float | timedelta | None = None,
        failed_before: float | timedelta | None = None,
        *,
        conn: SyncConn | None = None,
    ) -> int:
        return self._run(purge_call(succeeded_before, failed_before), conn)

    def configure_queue(
        self,
        queue: str,
        *,
        max_length: int | None = None,
        paused: bool | None = None,
        fair: bool | None = None,
        noisy_share: float | None = None,
        noisy_min_active: int | None = None,
        max_active_per_group: int | None = None,
        max_active: int | None = None,
        status_events: str | None = None,
        retention: timedelta | None = None,
        max_starts: int | None = None,
        per: float | timedelta | None = None,
        conn: SyncConn | None = None,
    ) -> QueueSettings:
        """Changes a queue's settings: None leaves a setting as it is, 0 removes a limit (``retention``: how long
        finished jobs are kept before maintenance drops them; ``timedelta(0)`` removes it). ``max_starts`` and
        ``per`` (seconds or a timedelta): at most that many of the queue's jobs start in any window of ``per``,
        across every worker (``max_starts=0`` removes the limit; :meth:`rate_limits` shows it)."""
        return self._run(
            configure_queue_call(
                queue,
                max_length=max_length,
                paused=paused,
                fair=fair,
                noisy_share=noisy_share,
                noisy_min_active=noisy_min_active,
                max_active_per_group=max_active_per_group,
                max_active=max_active,
                status_events=status_events,
                retention=retention,
                max_starts=max_starts,
                per=per,
            ),
            conn,
        )

    def queues(self, *, conn: SyncConn | None = None) -> list[QueueSettings]:
        return self._run(queues_call(), conn)


class AsyncAdminOps(AsyncRunner):
    async def cancel(self, id: int, *, conn: AsyncConn | None = None) -> bool:
        return await self._run(cancel_call(id), conn)

    async def retry(self, id: int, *, conn: AsyncConn | None = None) -> bool:
        return await self._run(retry_call(id), conn)

    async def delete(self, id: int, *, conn: AsyncConn | None = None) -> bool:
        return await self._run(delete_call(id), conn)

    async def purge(
        self,
        succeeded_before: float | timedelta | None = None,
        failed_before: float | timedelta | None = None,
        *,
        conn: AsyncConn | None = None,
    ) -> int:
        return await self._run(purge_call(succeeded_before, failed_before), conn)

    async def configure_queue(
        self,
        queue: str,
        *,
        max_length: int | None = None,
        paused: bool | None = None,
        fair: bool | None = None,
        noisy_share: float | None = None,
        noisy_min_active: int | None = None,
        max_active_per_group: int | None = None,
        max_active: int | None = None,
        status_events: str | None = None,
        retention: timedelta | None = None,
        max_starts: int | None = None,
        per: float | timedelta | None = None,
        conn: AsyncConn | None = None,
    ) -> QueueSettings:
        return await self._run(
            configure_queue_call(
                queue,
                max_length=max_length,
                paused=paused,
                fair=fair,
                noisy_share=noisy_share,
                noisy_min_active=noisy_min_active,
                max_active_per_group=max_active_per_group,
                max_active=max_active,
                status_events=status_events,
                retention=retention,
                max_starts=max_starts,
                per=per,
            ),
            conn,
        )

    async def queues(self, *, conn: AsyncConn | None = None) -> list[QueueSettings]:
        return await self._run(queues_call(), conn)
