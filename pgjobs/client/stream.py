"""The status stream: ``async for event in client.subscribe(...)`` over ``pgjobs_status``.

Every transition (and progress report) commits a small JSON notification on ``pgjobs_status`` (a single
object, or an array of them when one call changed many jobs). A subscriber LISTENs on its own connection
(``pgjobs/client/listen.py``: reconnects with backoff and jitter), filters, and yields :class:`StatusEvent` s.

NOTIFY is not durable, so when the subscriber watches *known* jobs (``job_ids`` and/or ``batch_id``) it also
re-reads their durable status (``pgjobs.status_snapshot``) when its connection (re)connects and every
``resync_interval`` seconds, and yields whatever changed since it last said: a notification missed during a
disconnect costs latency, never correctness. A stream filtered only by ``queue``/``kinds`` has nothing to
re-read and is live-only.

A stream over explicit ``job_ids`` (and no ``batch_id``) ends by itself once every one of them is terminal
(succeeded, failed, cancelled); ids that do not exist count as ended. Other streams run until the consumer
stops iterating (``break``, or cancel the task).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass
from typing import Any, LiteralString

import anyio
import psycopg

from pgjobs.client._call import AsyncRunner
from pgjobs.client.listen import Connected, Listener, Notifications, Tick
from pgjobs.records import JobState

log = logging.getLogger("pgjobs.stream")

STATUS_CHANNEL = "pgjobs_status"
_TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
_SNAPSHOT_SQL: LiteralString = (
    "SELECT id, state::text, queue, kind, attempt, batch_id, progress"
    " FROM pgjobs.status_snapshot(job_ids => %s::bigint[], in_batch => %s::bigint, live_only => %s)"
)


@dataclass(frozen=True, slots=True)
class StatusEvent:
    """One transition of one job. ``progress`` is the job's last reported progress (for ``active`` events
    of watched jobs and progress reports; None when unknown). ``resync`` is True when the event comes from
    a durable re-read rather than a notification."""

    id: int
    state: JobState
    queue: str
    kind: str
    attempt: int
    batch_id: int | None
    progress: Any = None
    resync: bool = False

    @property
    def terminal(self) -> bool:
        return self.state in _TERMINAL


class _Filter:
    __slots__ = ("batch_id", "ids", "kinds", "queue")

    def __init__(
        self, ids: set[int] | None, batch_id: int | None, queue: str | None, kinds: frozenset[str] | None
    ) -> None:
        self.ids = ids
        self.batch_id = batch_id
        self.queue = queue
        self.kinds = kinds

    def match(self, id: int, batch_id: int | None, queue: str, kind: str) -> bool:
        # job_ids and batch_id select jobs (either one matches); queue and kinds narrow further.
        if self.ids is not None or self.batch_id is not None:
            by_id = self.ids is not None and id in self.ids
            by_batch = self.batch_id is not None and batch_id == self.batch_id
            if not (by_id or by_batch):
                return False
        if self.queue is not None and queue != self.queue:
            return False
        return self.kinds is None or kind in self.kinds


def _parse(payload: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(payload)
    except ValueError:
        log.warning("ignoring a malformed pgjobs_status payload: %.200s", payload)
        return []
    if isinstance(data, dict):
        return [data]
    if isinstance(data, list):
        return [d for d in data if isinstance(d, dict)]
    return []


async def subscribe(
    dsn: str,
    job_ids: Iterable[int] | None = None,
    batch_id: int | None = None,
    queue: str | None = None,
    kinds: Iterable[str] | None = None,
    *,
    resync_interval: float = 5.0,
    application_name: str = "pgjobs-subscribe",
) -> AsyncGenerator[StatusEvent, None]:
    """Yields :class:`StatusEvent` s of the jobs selected by ``job_ids`` / ``batch_id`` (either matches),
    narrowed by ``queue`` and ``kinds``; with none of them, every job's. See the module docstring."""
    ids = None if job_ids is None else {int(i) for i in job_ids}
    kind_set = None if kinds is None else frozenset(kinds)
    flt = _Filter(ids, batch_id, queue, kind_set)
    tracked = ids is not None or batch_id is not None
    remaining: set[int] | None = None if ids is None else set(ids)
    if remaining is not None and not remaining and batch_id is None:
        return
    # last said per watched job: (state, attempt, progress json); and, for every stream, the attempt of the
    # jobs last seen active, so a progress report (active again, same attempt) can be told from a claim.
    last: dict[int, tuple[str, int, str | None]] = {}
    active: dict[int, int] = {}
    listener = Listener(dsn, [STATUS_CHANNEL], application_name=application_name)
    tick = resync_interval if tracked else None

    def note(ev: StatusEvent) -> bool:
        """Records what is said; False when it ended the stream's last watched job."""
        if ev.state == JobState.ACTIVE:
            active[ev.id] = ev.attempt
        else:
            active.pop(ev.id, None)
            if len(active) > 100_000:  # a live-only stream that missed the ends of many jobs
                active.clear()
        if tracked:
            last[ev.id] = (ev.state.value, ev.attempt, None if ev.progress is None else json.dumps(ev.progress))
        if remaining is not None and ev.state in _TERMINAL and ev.id in remaining:
            remaining.discard(ev.id)
            if not remaining and batch_id is None:
                return False
        return True

    events = listener.events(tick=tick)
    try:
        async for item in events:
            batch: list[StatusEvent] = []
            if isinstance(item, Notifications):
                need_progress = _notified(item, flt, active, batch)  # indexes into batch
                if need_progress:
                    progress = await _progress_of(item.conn, sorted({batch[i].id for i in need_progress}))
                    for i in need_progress:
                        if batch[i].id in progress:
                            batch[i] = _with_progress(batch[i], progress[batch[i].id])
            elif isinstance(item, Connected):
                if tracked:
                    got = await _snapshot(item.conn, True, flt, remaining, last, batch_id)
                    batch = got or []
            elif isinstance(item, Tick) and tracked:
                got = await _snapshot(item.conn, False, flt, remaining, last, batch_id)
                batch = got or []
            for ev in batch:
                keep_going = note(ev)
                yield ev
                if not keep_going:
                    return
            if remaining is not None and not remaining and batch_id is None:
                return
    finally:
        with anyio.CancelScope(shield=True):
            await events.aclose()


async def _snapshot(
    conn: psycopg.AsyncConnection[Any],
    full: bool,
    flt: _Filter,
    remaining: set[int] | None,
    last: dict[int, tuple[str, int, str | None]],
    batch_id: int | None,
) -> list[StatusEvent] | None:
    """Durable re-read of the watched jobs (``remaining`` is updated); the events for what changed (against
    ``last``). None on a connection error."""
    if full:
        want_ids = sorted(remaining) if remaining is not None else []
        live_only = False
    else:
        live = [i for i, (st, _, _) in last.items() if st not in _TERMINAL_TEXT]
        want_ids = sorted(set(live) | (remaining or set()))
        live_only = True
    try:
        cur = await conn.execute(_SNAPSHOT_SQL, (want_ids, batch_id, live_only))
        rows = await cur.fetchall()
    except (psycopg.OperationalError, psycopg.InterfaceError):
        return None
    out: list[StatusEvent] = []
    seen: set[int] = set()
    for id_, state, q, kind, attempt, b, progress in rows:
        seen.add(id_)
        if not flt.match(id_, b, q, kind):
            if remaining is not None:
                remaining.discard(id_)  # outside the queue/kinds filter: it will never be reported
            continue
        prev = last.get(id_)
        cur_key = (state, attempt, None if progress is None else json.dumps(progress))
        if prev == cur_key:
            continue
        out.append(StatusEvent(id_, JobState(state), q, kind, attempt, b, progress, True))
    if remaining is not None:
        for gone in [i for i in want_ids if i in remaining and i not in seen]:
            remaining.discard(gone)  # no such job (never existed, or deleted): nothing to wait for
    return out


def _notified(item: Notifications, flt: _Filter, active: dict[int, int], batch: list[StatusEvent]) -> list[int]:
    """Appends to ``batch`` the events of ``item`` that pass ``flt`` (``active``: the attempt of the jobs last
    seen active, updated); returns the indexes of those that are progress reports without their progress."""
    need_progress: list[int] = []
    for channel, payload in item.items:
        if channel != STATUS_CHANNEL:
            continue
        for e in _parse(payload):
            try:
                id_ = int(e["id"])
                state = JobState(e["state"])
                ev = StatusEvent(
                    id_, state, str(e.get("queue")), str(e.get("kind")), int(e.get("attempt") or 0),
                    e.get("batch_id"), e.get("progress"),
                )  # fmt: skip
            except (KeyError, ValueError, TypeError):
                continue
            if not flt.match(ev.id, ev.batch_id, ev.queue, ev.kind):
                continue
            if ev.state == JobState.ACTIVE and ev.progress is None and active.get(ev.id) == ev.attempt:
                need_progress.append(len(batch))  # active again, same attempt: a progress report
            if ev.state == JobState.ACTIVE:
                active[ev.id] = ev.attempt
            else:
                active.pop(ev.id, None)
            batch.append(ev)
    return need_progress


_TERMINAL_TEXT = frozenset(s.value for s in _TERMINAL)


def _with_progress(ev: StatusEvent, progress: Any) -> StatusEvent:
    return StatusEvent(ev.id, ev.state, ev.queue, ev.kind, ev.attempt, ev.batch_id, progress, ev.resync)


async def _progress_of(conn: psycopg.AsyncConnection[Any], ids: list[int]) -> dict[int, Any]:
    """Progress of jobs that just reported it (the notification carries only the transition's shape)."""
    try:
        cur = await conn.execute(_SNAPSHOT_SQL, (ids, None, False))
        rows = await cur.fetchall()
    except (psycopg.OperationalError, psycopg.InterfaceError):
        return {}
    return {r[0]: r[6] for r in rows if r[6] is not None}


class StreamOps(AsyncRunner):
    """``AsyncClient.subscribe``: the status stream (see :mod:`pgjobs.client.stream`)."""

    def subscribe(
        self,
        job_ids: Iterable[int] | None = None,
        batch_id: int | None = None,
        queue: str | None = None,
        kinds: Iterable[str] | None = None,
        *,
        resync_interval: float = 5.0,
    ) -> AsyncGenerator[StatusEvent, None]:
        """``async for event in client.subscribe(job_ids=[...])``: status events from ``pgjobs_status``, with
        durable re-reads for watched jobs. Ends by itself when all of ``job_ids`` are terminal. Uses a
        dedicated LISTEN connection to the client's DSN (or its pool's conninfo)."""
        dsn = getattr(self, "dsn", None) or self._pool.conninfo
        if not isinstance(dsn, str):
            raise ValueError("subscribe needs the client's DSN or a pool with a string conninfo")
        return subscribe(dsn, job_ids, batch_id, queue, kinds, resync_interval=resync_interval)
