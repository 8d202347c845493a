"""Producing work: ``pgjobs.enqueue`` and ``pgjobs.enqueue_many`` (sql/enqueue.sql).

``queue``, ``priority`` and ``max_attempts`` left as None take the declared defaults of the kind when the
client was made with ``app=`` (:mod:`pgjobs.client.defaults`), else the SQL defaults.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from pgjobs.client._call import AsyncConn, AsyncRunner, Call, Rows, SyncConn, SyncRunner, jsonb
from pgjobs.client.defaults import EnqueueDefaults, fill_spec, resolve
from pgjobs.records import Enqueued, EnqueuedSpec


def enqueue_call(
    kind: str,
    payload: Any = None,
    *,
    queue: str | None = None,
    run_at: datetime | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    unique_key: str | None = None,
    unique_live_only: bool = False,
    group_key: str | None = None,
    meta: Mapping[str, Any] | None = None,
    defaults: EnqueueDefaults | None = None,
) -> Call[Enqueued]:
    options = resolve(defaults, kind, {"queue": queue, "priority": priority, "max_attempts": max_attempts})
    return Call(
        "SELECT * FROM pgjobs.enqueue(kind => %(kind)s, payload => %(payload)s, queue => %(queue)s,"
        " run_at => %(run_at)s, priority => %(priority)s::smallint, max_attempts => %(max_attempts)s,"
        " unique_key => %(unique_key)s, unique_live_only => %(unique_live_only)s,"
        " group_key => %(group_key)s, meta => %(meta)s)",
        {
            "kind": kind,
            "payload": jsonb({} if payload is None else payload),
            "queue": options["queue"],
            "run_at": run_at,
            "priority": options["priority"],
            "max_attempts": options["max_attempts"],
            "unique_key": unique_key,
            "unique_live_only": unique_live_only,
            "group_key": group_key,
            "meta": jsonb(dict(meta) if meta else {}),
        },
        lambda rows: Enqueued.from_row(rows[0]),
    )


def _specs(rows: Rows) -> list[EnqueuedSpec]:
    return [EnqueuedSpec.from_row(r) for r in rows]


def enqueue_many_call(
    jobs: Iterable[Mapping[str, Any]], as_batch: bool = False, defaults: EnqueueDefaults | None = None
) -> Call[list[EnqueuedSpec]]:
    specs = [_spec(fill_spec(defaults, j)) for j in jobs]
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
    _enqueue_defaults: EnqueueDefaults | None = None  # Client(app=...)

    def enqueue(
        self,
        kind: str,
        payload: Any = None,
        *,
        queue: str | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        unique_key: str | None = None,
        unique_live_only: bool = False,
        group_key: str | None = None,
        meta: Mapping[str, Any] | None = None,
        conn: SyncConn | None = None,
    ) -> Enqueued:
        """Enqueues one job. With ``conn``, inside the caller's transaction. ``queue``/``priority``/
        ``max_attempts`` not given: the kind's declared defaults (``Client(app=...)``), else default/0/20."""
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
                defaults=self._enqueue_defaults,
            ),
            conn,
        )

    def enqueue_many(
        self, jobs: Iterable[Mapping[str, Any]], *, as_batch: bool = False, conn: SyncConn | None = None
    ) -> list[EnqueuedSpec]:
        """Enqueues job specs (dicts of enqueue arguments, plus ``ref``/``depends_on``) all or nothing; a spec
        without ``queue``/``priority``/``max_attempts`` gets its kind's declared ones (``Client(app=...)``)."""
        return self._run(enqueue_many_call(jobs, as_batch, self._enqueue_defaults), conn)


class AsyncEnqueueOps(AsyncRunner):
    _enqueue_defaults: EnqueueDefaults | None = None  # AsyncClient(app=...)

    async def enqueue(
        self,
        kind: str,
        payload: Any = None,
        *,
        queue: str | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
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
                defaults=self._enqueue_defaults,
            ),
            conn,
        )

    async def enqueue_many(
        self, jobs: Iterable[Mapping[str, Any]], *, as_batch: bool = False, conn: AsyncConn | None = None
    ) -> list[EnqueuedSpec]:
        return await self._run(enqueue_many_call(jobs, as_batch, self._enqueue_defaults), conn)
