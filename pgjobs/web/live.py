"""Live updates: ONE shared reader of the event log per dashboard process, fanned out to every SSE client.

The reader follows ``pgjobs.read_events`` from the log's head on the reader pool (one pooled connection
per read, whatever the number of browsers), and puts each event into the queue of every subscriber whose
filter matches. Like ``subscribe()`` it reads when a ``pgjobs_status`` hint arrives (one LISTEN connection
per dashboard process, when given ``listen_dsn``), again by itself ``chase_interval`` after a read that
returned events (writers send no hint while a follower's last read found some), and every
``poll_interval`` as a fallback. It never reads events from NOTIFY payloads (any role can send one; a hint
only makes it read, and the log is the only source of what happened). A subscriber that cannot keep up
(its queue full) is told to resync (reload what it shows) rather than slowing the others down.

The reader also tells the subscribers whether the database answers (``db`` messages), so pages can show
their "database unreachable" banner the moment it goes away and drop it when it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pgjobs.client.dashboard import AsyncDashboard, Event
from pgjobs.client.listen import Connected, Listener, Notifications
from pgjobs.client.stream import STATUS_CHANNEL, hint_wants_read
from pgjobs.errors import SchemaMissing
from pgjobs.jsonable import to_jsonable
from pgjobs.web.backend import unavailable_reason

log = logging.getLogger("pgjobs.web.live")

READ_BATCH = 1000
QUEUE_SIZE = 1000


@dataclass(eq=False)  # compared and hashed by identity: one per open stream
class Subscriber:
    job_ids: frozenset[int] | None = None
    batch_id: int | None = None
    queue: str | None = None
    inbox: asyncio.Queue[dict[str, Any] | None] = field(default_factory=lambda: asyncio.Queue(QUEUE_SIZE))
    lagged: bool = False

    def wants(self, ev: dict[str, Any]) -> bool:
        if self.job_ids is not None or self.batch_id is not None:
            by_id = self.job_ids is not None and ev.get("id") in self.job_ids
            by_batch = self.batch_id is not None and ev.get("batch_id") == self.batch_id
            if not (by_id or by_batch):
                return False
        return self.queue is None or ev.get("queue") == self.queue

    def offer(self, message: dict[str, Any]) -> None:
        try:
            self.inbox.put_nowait(message)
        except asyncio.QueueFull:
            self.lagged = True


class Hub:
    """The shared reader. ``subscribe()`` / ``unsubscribe()`` from SSE handlers; started on first need."""

    def __init__(
        self,
        dash: AsyncDashboard,
        poll_interval: float = 0.5,
        *,
        listen_dsn: str | None = None,
        chase_interval: float = 0.1,  # a page, not a program: 10 reads a second at most while busy
        application_name: str = "pgjobs-web-listen",
    ) -> None:
        self.dash = dash
        self.poll_interval = poll_interval
        self.listen_dsn = listen_dsn
        self.chase_interval = chase_interval
        self.application_name = application_name
        self.cursor: int | None = None  # the newest event id read (None: not following)
        self.hints = 0  # pgjobs_status hints that asked for a read
        self._hinted: asyncio.Event | None = None
        self._listen_task: asyncio.Task[None] | None = None
        self.subscribers: set[Subscriber] = set()
        self.db_ok: bool | None = None
        self.db_error: str | None = None
        self.mode: str | None = None  # "log" once the reader follows the event log
        self.events_seen = 0
        self._task: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- subscribers ---------------------------------------------------------------------------------
    def subscribe(self, job_ids: Iterable[int] | None, batch_id: int | None, queue: str | None) -> Subscriber:
        sub = Subscriber(None if job_ids is None else frozenset(job_ids), batch_id, queue)
        self.subscribers.add(sub)
        if self.db_ok is not None:
            sub.offer(self._db_message())
        self.start()
        if self._hinted is not None:
            self._hinted.set()  # a reader waiting for its first subscriber starts now
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)

    def _db_message(self) -> dict[str, Any]:
        return {"type": "db", "ok": bool(self.db_ok), "error": self.db_error}

    def _set_db(self, ok: bool, error: str | None = None) -> None:
        if ok != self.db_ok or (not ok and error != self.db_error):
            self.db_ok, self.db_error = ok, error
            message = self._db_message()
            for sub in list(self.subscribers):
                sub.offer(message)

    def publish(self, events: list[dict[str, Any]]) -> None:
        self.events_seen += len(events)
        for sub in list(self.subscribers):
            for ev in events:
                if sub.wants(ev):
                    sub.offer({"type": "event", **ev})

    # -- the reader ----------------------------------------------------------------------------------
    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="pgjobs-web-live")

    def end_streams(self) -> None:
        """Ends every open SSE stream (they never end by themselves): before a server stops, so that it
        need not wait out its graceful-shutdown timeout. Safe from any thread."""
        loop = self.loop
        if loop is None:
            return

        def end() -> None:
            for sub in list(self.subscribers):
                with contextlib.suppress(asyncio.QueueFull):
                    sub.inbox.put_nowait(None)

        loop.call_soon_threadsafe(end)

    async def stop(self) -> None:
        for task in (self._task, self._listen_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._task = self._listen_task = None
        for sub in list(self.subscribers):
            with contextlib.suppress(asyncio.QueueFull):
                sub.inbox.put_nowait(None)  # ends the stream

    async def _run(self) -> None:
        delay = self.poll_interval
        while True:
            try:
                has_log = await self.dash.has_event_log()
            except Exception as exc:
                self._set_db(False, unavailable_reason(exc) or str(exc))
                await asyncio.sleep(min(delay, 5.0))
                delay *= 2
                continue
            self._set_db(True)
            if not has_log:  # a schema older than this code: nothing to follow until it is migrated
                log.warning("no event log in this database (run pgjobs migrate): the live view waits for one")
                await asyncio.sleep(5.0)
                continue
            self.mode = "log"
            await self._follow_log()
            return

    async def _head(self) -> int:
        """The newest event id now: the reader starts there (pages show the present; events are news)."""
        try:
            return await self.dash.stream_head()
        except SchemaMissing:  # a log without stream_head(): read to its end
            pass
        after = 0
        while True:
            batch = await self.dash.read_events(after_id=after, max_rows=READ_BATCH)
            if batch:
                after = batch[-1].event_id
            if len(batch) < READ_BATCH:
                return after

    async def _listen(self) -> None:
        """Sets the hint flag on each pgjobs_status hint that may mean news, and after every (re)connect
        (a hint sent while it was down is lost: read once). Connection errors are the reads' to report."""
        assert self.listen_dsn is not None and self._hinted is not None
        listener = Listener(
            self.listen_dsn, [STATUS_CHANNEL], application_name=self.application_name,
            on_error=lambda exc, delay: None, standby_ok=True,  # a standby (--read-dsn): the poll reads
        )  # fmt: skip
        events = listener.events()
        try:
            async for item in events:
                if isinstance(item, Connected):
                    self._hinted.set()
                elif isinstance(item, Notifications):
                    cursor = self.cursor if self.cursor is not None else 2**63 - 1
                    if any(c == STATUS_CHANNEL and hint_wants_read(p, cursor) for c, p in item.items):
                        self.hints += 1
                        self._hinted.set()
        finally:
            await events.aclose()

    async def _pause(self, seconds: float) -> None:
        """Sleeps ``seconds``, or less when a hint comes first."""
        if self._hinted is None:
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._hinted.wait(), seconds)
        self._hinted.clear()

    async def _follow_log(self) -> None:
        if self.listen_dsn is None:
            await self._read_log()
            return
        self._hinted = asyncio.Event()
        task = asyncio.get_running_loop().create_task(self._listen(), name="pgjobs-web-listen")
        self._listen_task = task
        try:
            await self._read_log()
        finally:
            # The LISTEN connection goes with the reader: a reader that ended (cancelled, or an error out of
            # the loop) is started again by the next subscribe(), with a listener of its own.
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            if self._listen_task is task:
                self._listen_task = None

    async def _read_log(self) -> None:
        after: int | None = None
        failures = 0
        while True:
            self.cursor = after
            if not self.subscribers:
                # Nobody is watching: no read_events call, so the dashboard does not count as a follower
                # of the stream (writers then skip the pgjobs_status hint and its commit lock); the next
                # subscriber starts from the head again.
                after = None
                await self._pause(self.poll_interval)
                continue
            try:
                if after is None:
                    after = await self._head()
                if self._hinted is not None:
                    self._hinted.clear()  # what it announced is read now
                batch = await self.dash.read_events(after_id=after, max_rows=READ_BATCH)
            except Exception as exc:
                reason = unavailable_reason(exc)
                if reason is None:
                    log.exception("the live event reader failed")
                self._set_db(False, reason or str(exc))
                failures += 1
                await asyncio.sleep(min(self.poll_interval * 2**failures, 5.0))
                continue
            failures = 0
            self._set_db(True)
            if batch:
                after = batch[-1].event_id
                self.publish([event_json(e) for e in batch])
            if len(batch) == READ_BATCH:
                continue
            # After events, read again soon by itself (no writer hints while its last read found some); after
            # an empty read, the next hint (or the poll) wakes it.
            await self._pause(self.chase_interval if batch else self.poll_interval)


def event_json(e: Event) -> dict[str, Any]:
    out: dict[str, Any] = to_jsonable(e)
    return out
