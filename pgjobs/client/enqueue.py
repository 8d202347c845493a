"""Producing work: ``pgjobs.enqueue`` and ``pgjobs.enqueue_many`` (sql/enqueue.sql)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from pgjobs.client._call import AsyncConn, AsyncRunner, Call, Rows, SyncConn, SyncRunner, jsonb
from pgjobs.records import Enqueued, EnqueuedSpec


def enqueue_call(
    kind: str,
    payload: Any = None,
    *,
    queue: str = "default",
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int = 20,
    unique_key: str | None = None,
    unique_live_only: bool = False,
    group_key: str | None = None,
    meta: Mapping[str, Any] | None = None,
) -> Call[Enqueued]:
    return Call(
        "SELECT * FROM pgjobs.enqueue(kind => %(kind)s, payload => %(payload)s, queue => %(queue)s,"
        " run_at => %(run_at)s, priority => %(priority)s::smallint, max_attempts => %(max_attempts)s,"
        " unique_key => %(unique_key)s, unique_live_only => %(unique_live_only)s,"
        " group_key => %(group_key)s, meta => %(meta)s)",
        {
            "kind": kind,
            "payload": jsonb({} if payload is None else payload),
            "queue": queue,
            "run_at": run_at,
            "priority": priority,
            "max_attempts": max_attempts,
            "unique_key": unique_key,
            "unique_live_only": unique_live_only,
            "group_key": group_key,
            "meta": jsonb(dict(meta) if meta else {}),
        },
        lambda rows: Enqueued.from_row(rows[0]),
    )


def _specs(rows: Rows) -> list[EnqueuedSpec]:
    return [EnqueuedSpec.from_row(r) for r in rows]


def enqueue_many_call(jobs: Iterable[Mapping[str, Any]], as_batch: bool = False) -> Call[list[EnqueuedSpec]]:
    specs = [_spec(j) for j in jobs]
    return Call(
        "SELECT * FROM pgjobs.enqueue_many(jobs => %(jobs)s, as_batch => %(as_batch)s)",
        {"jobs": jsonb(specs), "as_batch": as_batch},
        _specs,
    )


def _spec(job: Mapping[str, Any]) -> dict[str, Any]:
    """A job spec as JSON: datetimes become ISO 8601 strings, nothing else is touched."""
    spec = dict(job)
    if isinstance(spec.get("run_at"), datetime):
        spec["run_at"] = spec["run_at"].isoformat()
    return spec


class EnqueueOps(SyncRunner):
    def enqueue(
        self,
        kind: str,
        payload: Any = None,
        *,
        queue: str = "default",
        run_at: datetime | None = None,
        priority: int = 0,
        max_attempts: int = 20,
        unique_key: str | None = None,
        unique_live_only: bool = False,
        group_key: str | None = None,
        meta: Mapping[str, Any] | None = None,
        conn: SyncConn | None = None,
    ) -> Enqueued:
        """Enqueues one job. With ``conn``, inside the caller's transaction."""
        return self._run(
            enqueue_call(
                kind,
                payload,
                queue=queue,
                run_at=run_at,
                priority=priority,
                max_attempts=max_attempts,
                unique_key=unique_key,
                unique_live_only=unique_live_only,
                group_key=group_key,
                meta=meta,
            ),
            conn,
        )

    def enqueue_many(
        self, jobs: Iterable[Mapping[str, Any]], *, as_batch: bool = False, conn: SyncConn | None = None
    ) -> list[EnqueuedSpec]:
        """Enqueues job specs (dicts of enqueue arguments, plus ``ref``/``depends_on``) all or nothing."""
        return self._run(enqueue_many_call(jobs, as_batch), conn)


class AsyncEnqueueOps(AsyncRunner):
    async def enqueue(
        self,
        kind: str,
        payload: Any = None,
        *,
        queue: str = "default",
        run_at: datetime | None = None,
        priority: int = 0,
        max_attempts: int = 20,
        unique_key: str | None = None,
        unique_live_only: bool = False,
        group_key: str | None = None,
        meta: Mapping[str, Any] | None = None,
        conn: AsyncConn | None = None,
    ) -> Enqueued:
        return await self._run(
            enqueue_call(
                kind,
                payload,
                queue=queue,
                run_at=run_at,
                priority=priority,
                max_attempts=max_attempts,
                unique_key=unique_key,
                unique_live_only=unique_live_only,
                group_key=group_key,
                meta=meta,
            ),
            conn,
        )

    async def enqueue_many(
        self, jobs: Iterable[Mapping[str, Any]], *, as_batch: bool = False, conn: AsyncConn | None = None
    ) -> list[EnqueuedSpec]:
        return await self._run(enqueue_many_call(jobs, as_batch), conn)
