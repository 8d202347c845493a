"""The status stream: ``async for event in client.subscribe(...)`` over the durable event log.

Every transition and progress report is a row of ``pgjobs.read_events`` (sql/stream.sql), in ``event_id`` order.
A subscriber keeps a cursor (the last ``event_id`` it has read) and reads after it: on each ``pgjobs_status``
hint (a NOTIFY that only says "there is more"; its payload is never trusted), on every (re)connect of its
LISTEN connection, and every ``poll_interval`` seconds as a fallback. So a missed or forged notification costs
latency at most, never an event, and a reconnect resumes exactly where the stream was. After a read that
returned events it reads again by itself, until a read comes back empty: writers send no hint while the
follower's last read found events (a notifying commit serialises with every other), so under load the stream
costs the hot path no NOTIFY at all. That next read starts at once when the last one took ``chase_interval``
seconds or more (under load: each read ticks and waits for its commit's WAL flush, so a sleep between reads
would only add to every event's delay), else when ``chase_interval`` has passed since it started (a trickle
of events is read in at most 1/chase_interval reads a second, not in as many as the server can answer).
Each read is one page of up to 1,000 events, handed to the consumer before the next page is read (a full
page is followed by the next at once): a subscriber far behind holds one page, never its whole backlog.

Where the stream starts: with ``after_id`` it resumes after that event. Otherwise a stream of known jobs
(``job_ids`` and/or ``batch_id``) replays their retained history from the log, and for watched jobs with no
event in it (older than the log's retention, or in a queue whose ``status_events`` is ``none``) reads their
current state from the jobs themselves (``resync`` events); a stream by ``queue``/``kinds`` alone starts at the
head of the log. Jobs whose queue logs nothing are re-read every ``resync_interval`` seconds.

A stream over explicit ``job_ids`` (and no ``batch_id``) ends by itself once every one of them is terminal
(succeeded, failed, cancelled); ids that do not exist count as ended. Other streams run until the consumer
stops iterating (``break``, or cancel the task).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString

import anyio
import psycopg

from pgjobs.client._call import AsyncRunner, Call, Rows, SyncRunner, scalar
from pgjobs.client.listen import Connected, Listener, ListenEvent, Notifications, Tick
from pgjobs.records import JobState, slot_setters

log = logging.getLogger("pgjobs.stream")

STATUS_CHANNEL = "pgjobs_status"
_TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
_STATES = {s.value: s for s in JobState}  # a dict lookup per event, not an Enum call (the follower's hot loop)
_PAGE = 1000
# The log's newest id read in the same statement, before read_events looks: every id up to it is committed
# and seen by the read, so a filtered read that comes back short lets the cursor move up to it (a quiet
# filter then never rescans what it has already passed).
_READ_SQL: LiteralString = (
    "SELECT b.newest_id, e.event_id, e.at, e.id, e.state::text, e.queue, e.kind, e.attempt, e.batch_id, e.progress"
    " FROM pgjobs.stream_head() AS b"
    " LEFT JOIN LATERAL pgjobs.read_events(after_id => %s, max_rows => %s, queue => %s, job_ids => %s::bigint[],"
    " batch_id => %s) AS e ON true"
)
_HEAD_SQL: LiteralString = "SELECT coalesce((SELECT newest_id FROM pgjobs.stream_head()), 0) AS head"
_SNAPSHOT_SQL: LiteralString = (
    "SELECT id, state::text, queue, kind, attempt, batch_id, progress"
    " FROM pgjobs.status_snapshot(job_ids => %s::bigint[], in_batch => %s::bigint, live_only => false)"
)


@dataclass(frozen=True, slots=True)
class StatusEvent:
    """One transition of one job (or a progress report: ``active`` again with ``progress`` set).
    ``event_id`` and ``at`` come from the event log; ``resync`` is True (and ``event_id`` None) when the event
    comes from a read of the job's current state instead (a job with no event in the log)."""

    id: int
    state: JobState
    queue: str
    kind: str
    attempt: int
    batch_id: int | None
    progress: Any = None
    resync: bool = False
    event_id: int | None = None
    at: datetime | None = None

    @property
    def terminal(self) -> bool:
        return self.state in _TERMINAL


# StatusEvent's fields set straight through its slots: half the cost of the frozen dataclass's __init__
# (ten object.__setattr__ calls), which was a fifth of a follower's CPU per event. Only for rows of the log.
_S_ID, _S_STATE, _S_QUEUE, _S_KIND, _S_ATTEMPT, _S_BATCH, _S_PROGRESS, _S_RESYNC, _S_EVENT, _S_AT = slot_setters(
    StatusEvent, ("id", "state", "queue", "kind", "attempt", "batch_id", "progress", "resync", "event_id", "at")
)
_NEW = object.__new__


def _logged_event(row: tuple[Any, ...]) -> StatusEvent:
    """The StatusEvent of one _READ_SQL row (head, event_id, at, id, state, queue, kind, attempt, batch_id,
    progress): equal to ``StatusEvent(id, state, queue, kind, attempt, batch_id, progress, False, event_id,
    at)``, made in half the time."""
    _, event_id, at, id_, state, queue, kind, attempt, batch_id, progress = row
    ev: StatusEvent = _NEW(StatusEvent)
    _S_ID(ev, id_)
    _S_STATE(ev, _STATES[state])
    _S_QUEUE(ev, queue)
    _S_KIND(ev, kind)
    _S_ATTEMPT(ev, attempt)
    _S_BATCH(ev, batch_id)
    _S_PROGRESS(ev, progress)
    _S_RESYNC(ev, False)
    _S_EVENT(ev, event_id)
    _S_AT(ev, at)
    return ev


def read_events_call(
    after_id: int = 0,
    max_rows: int = _PAGE,
    queue: str | None = None,
    job_ids: Iterable[int] | None = None,
    batch_id: int | None = None,
) -> Call[list[StatusEvent]]:
    ids = None if job_ids is None else [int(i) for i in job_ids]
    return Call(
        "SELECT event_id, at, id, state::text AS state, queue, kind, attempt, batch_id, progress"
        " FROM pgjobs.read_events(after_id => %(after_id)s, max_rows => %(max_rows)s, queue => %(queue)s,"
        " job_ids => %(job_ids)s::bigint[], batch_id => %(batch_id)s)",
        {"after_id": after_id, "max_rows": max_rows, "queue": queue, "job_ids": ids, "batch_id": batch_id},
        _parse_rows,
        read=True,
    )


def _parse_rows(rows: Rows) -> list[StatusEvent]:
    out = []
    for r in rows:
        state = JobState(r["state"])
        out.append(StatusEvent(r["id"], state, r["queue"], r["kind"], r["attempt"], r["batch_id"], r["progress"],
                               False, r["event_id"], r["at"]))  # fmt: skip
    return out


def hint_wants_read(payload: str, cursor: int) -> bool:
    """Whether a pgjobs_status payload asks for a read. Anything unexpected does (a read is harmless); only a
    ticker's ``{"event_id": N}`` with N at or below the cursor says nothing new."""
    try:
        data = json.loads(payload)
        return bool(data.get("pending")) or int(data["event_id"]) > cursor
    except (ValueError, TypeError, KeyError, AttributeError):
        return True


class _Stream:
    """The state of one subscription: the cursor, what was said per watched job, which jobs are still awaited."""

    def __init__(
        self,
        ids: set[int] | None,
        batch_id: int | None,
        queue: str | None,
        kinds: frozenset[str] | None,
        after_id: int | None,
    ) -> None:
        self.ids = ids
        self.batch_id = batch_id
        self.queue = queue
        self.kinds = kinds
        self.tracked = ids is not None or batch_id is not None
        self.remaining: set[int] | None = None if ids is None else set(ids)
        self.cursor = after_id
        self.logged: set[int] = set()  # watched jobs heard of in the log: the log is their truth
        self.last: dict[int, tuple[str, int, str | None]] = {}
        self.last_page = 0  # rows of the last read_events call: more than 0 means "read again by yourself"
        self.read_started = 0.0  # time.monotonic() when the last read began (the chase's pacing)
        self.next_resync = 0.0  # time.monotonic() after which a poll also re-reads jobs the log says nothing of

    def wants(self, ev: StatusEvent) -> bool:
        if self.queue is not None and ev.queue != self.queue:
            return False
        return self.kinds is None or ev.kind in self.kinds

    def done(self) -> bool:
        return self.remaining is not None and not self.remaining and self.batch_id is None

    def note(self, ev: StatusEvent) -> None:
        if self.tracked:
            self.last[ev.id] = (ev.state.value, ev.attempt, None if ev.progress is None else json.dumps(ev.progress))
            if not ev.resync:
                self.logged.add(ev.id)
        if self.remaining is not None and ev.terminal:
            self.remaining.discard(ev.id)

    async def read(self, conn: psycopg.AsyncConnection[Any], drain: bool = False) -> list[StatusEvent]:
        """The events after the cursor, moving it: one page (``last_page`` says whether it was full: a live
        stream hands a page to its consumer before it reads the next, so a follower far behind holds one
        page, not its whole backlog), or with ``drain`` every page up to the head."""
        self.read_started = time.monotonic()
        out: list[StatusEvent] = []
        while True:
            assert self.cursor is not None
            ids = None if self.ids is None else sorted(self.ids)
            cur = await conn.execute(_READ_SQL, (self.cursor, _PAGE, self.queue, ids, self.batch_id))
            rows = await cur.fetchall()
            head = rows[0][0] if rows else None
            # An empty page is one row of NULLs (the LEFT JOIN), a full one has no NULL event_id.
            got = [] if not rows or rows[0][1] is None else rows
            self.last_page = len(got)
            if self.kinds is None:  # read_events has filtered by queue: every event is wanted
                out.extend(map(_logged_event, got))
            else:
                out.extend(ev for ev in map(_logged_event, got) if self.wants(ev))
            if got:
                self.cursor = max(self.cursor, got[-1][1])  # in event_id order
            if len(got) < _PAGE:
                if head is not None:
                    self.cursor = max(self.cursor, head)
                return out
            if not drain:
                return out

    async def woken(self, item: ListenEvent, resync_interval: float) -> list[StatusEvent]:
        """The first read after the listener woke: (re)connected, hinted, or its poll's tick."""
        if isinstance(item, Connected):
            return await (self.start(item.conn) if self.cursor is None else self.read(item.conn))
        if isinstance(item, Notifications):
            cursor = self.cursor
            assert cursor is not None
            hinted = any(c == STATUS_CHANNEL and hint_wants_read(p, cursor) for c, p in item.items)
            return await self.read(item.conn) if hinted else []
        assert isinstance(item, Tick)
        batch = await self.read(item.conn)
        # (At the head only: a job whose events are in pages not read yet is no job to resync.)
        if self.tracked and self.last_page < _PAGE and time.monotonic() >= self.next_resync:
            self.next_resync = time.monotonic() + resync_interval
            batch += await self.resync(item.conn, exclude={e.id for e in batch}, full=False)
        return batch

    async def start(self, conn: psycopg.AsyncConnection[Any]) -> list[StatusEvent]:
        """Where the stream starts (see the module docstring)."""
        if self.cursor is not None:
            return await self.read(conn)
        if not self.tracked:
            # The head of the log, read before the call ticks: what commits from now on is after it.
            cur = await conn.execute(_READ_SQL, (2**63 - 2, 1, None, None, None))
            row = await cur.fetchone()
            self.cursor = int(row[0]) if row and row[0] is not None else 0
            return []
        self.cursor = 0
        history = await self.read(conn, drain=True)  # all of it: the resync below must not repeat it
        heard = {ev.id for ev in history}
        return history + await self.resync(conn, exclude=heard, full=True)

    async def resync(self, conn: psycopg.AsyncConnection[Any], exclude: set[int], full: bool) -> list[StatusEvent]:
        """Current state of watched jobs the log says nothing of; the events for what changed since last said."""
        want = sorted(self.remaining) if self.remaining is not None else []
        if not full:
            want = sorted(set(want) | {i for i, (st, _, _) in self.last.items() if st not in _TERMINAL_TEXT})
        cur = await conn.execute(_SNAPSHOT_SQL, (want, self.batch_id))
        rows = await cur.fetchall()
        out: list[StatusEvent] = []
        seen: set[int] = set()
        for id_, state, q, kind, attempt, b, progress in rows:
            seen.add(id_)
            ev = StatusEvent(id_, JobState(state), q, kind, attempt, b, progress, True)
            if not self.wants(ev):
                if self.remaining is not None:
                    self.remaining.discard(id_)  # outside the queue/kinds filter: it will never be reported
                continue
            if id_ in exclude or id_ in self.logged:
                continue
            key = (state, attempt, None if progress is None else json.dumps(progress))
            if self.last.get(id_) != key:
                out.append(ev)
        if self.remaining is not None:
            for gone in [i for i in want if i in self.remaining and i not in seen]:
                self.remaining.discard(gone)  # no such job (never existed, or deleted): nothing to wait for
        return out


_TERMINAL_TEXT = frozenset(s.value for s in _TERMINAL)


async def subscribe(
    dsn: str,
    job_ids: Iterable[int] | None = None,
    batch_id: int | None = None,
    queue: str | None = None,
    kinds: Iterable[str] | None = None,
    *,
    after_id: int | None = None,
    poll_interval: float = 1.0,
    resync_interval: float = 5.0,
    chase_interval: float = 0.004,
    application_name: str = "pgjobs-subscribe",
) -> AsyncGenerator[StatusEvent, None]:
    """Yields :class:`StatusEvent` s of the jobs selected by ``job_ids`` / ``batch_id`` (either matches),
    narrowed by ``queue`` and ``kinds``; with none of them, every job's. See the module docstring."""
    st = _Stream(
        None if job_ids is None else {int(i) for i in job_ids},
        batch_id,
        queue,
        None if kinds is None else frozenset(kinds),
        after_id,
    )
    if st.done():
        return
    # synchronous_commit off on this connection: its reads' ticks then return without waiting for their
    # own WAL flush (under load the largest part of the delivery time). Safe for every event: ids come
    # from blocks whose end is flushed before they are handed out, and a crash makes the next tick start
    # above that end (sql/stream.sql, "IDS AND CRASHES"; the tick that reserves a block raises the
    # setting back itself). Nothing else this connection writes needs durability (follower marks).
    # standby_ok: on a hot standby (a read DSN) read_events does not tick and writes nothing, and there is no
    # LISTEN: the stream reads every poll_interval what the primary's ticks replicated (sql/stream.sql).
    listener = Listener(
        dsn, [STATUS_CHANNEL], application_name=application_name, options="-c jit=off -c synchronous_commit=off",
        standby_ok=True,
    )  # fmt: skip
    events = listener.events(tick=poll_interval)
    st.next_resync = time.monotonic() + resync_interval
    try:
        async for item in events:
            try:
                batch = await st.woken(item, resync_interval)
                confirmed = st.last_page == 0
                while True:
                    if st.tracked:
                        for ev in batch:
                            st.note(ev)
                            yield ev
                            if st.done():
                                return
                    else:  # nothing to note, never done (a queue's follower: its hot loop)
                        for ev in batch:
                            yield ev
                    if st.last_page == 0:
                        if confirmed:
                            break
                        # The first empty read armed the hint; a writer that looked just before that, and
                        # so sent none, is caught by one more read.
                        confirmed = True
                    else:
                        confirmed = False
                    # Events came: more are likely on their way. Read again, without waiting for a hint
                    # (writers send none while this follower's last read found events), until a read comes
                    # back empty; that one tells writers to hint again. Paced: at most one read started per
                    # chase_interval (a sleep of 0 when the last read took that long, or when its page was full:
                    # still a checkpoint).
                    pause = 0.0 if st.last_page >= _PAGE else st.read_started + chase_interval - time.monotonic()
                    await anyio.sleep(max(0.0, pause))
                    batch = await st.read(item.conn)
            except (psycopg.OperationalError, psycopg.InterfaceError):
                continue  # the listener finds the connection broken and reconnects; the cursor stays
            if st.done():
                return
    finally:
        with anyio.CancelScope(shield=True):
            await events.aclose()


class StreamOps(AsyncRunner):
    """``AsyncClient.subscribe`` and ``read_events``: the status stream (see :mod:`pgjobs.client.stream`)."""

    def subscribe(
        self,
        job_ids: Iterable[int] | None = None,
        batch_id: int | None = None,
        queue: str | None = None,
        kinds: Iterable[str] | None = None,
        *,
        after_id: int | None = None,
        poll_interval: float = 1.0,
        resync_interval: float = 5.0,
        read_dsn: str | None = None,
    ) -> AsyncGenerator[StatusEvent, None]:
        """``async for event in client.subscribe(job_ids=[...])``: status events from the durable event log,
        woken by ``pgjobs_status`` hints. Ends by itself when all of ``job_ids`` are terminal. Uses a dedicated
        LISTEN connection to ``read_dsn``, else the client's ``read_dsn``, else its DSN (or its pool's conninfo).
        On a hot standby the stream reads every ``poll_interval`` seconds (a standby cannot LISTEN) and writes
        nothing; the cursor carries over when the DSN lists several servers and the connection moves on."""
        dsn = read_dsn or getattr(self, "read_dsn", None) or getattr(self, "dsn", None) or self._pool.conninfo
        if not isinstance(dsn, str):
            raise ValueError("subscribe needs the client's DSN or a pool with a string conninfo")
        return subscribe(
            dsn, job_ids, batch_id, queue, kinds,
            after_id=after_id, poll_interval=poll_interval, resync_interval=resync_interval,
        )  # fmt: skip

    async def read_events(
        self,
        after_id: int = 0,
        max_rows: int = _PAGE,
        queue: str | None = None,
        job_ids: Iterable[int] | None = None,
        batch_id: int | None = None,
    ) -> list[StatusEvent]:
        """One page of ``pgjobs.read_events``: events after ``after_id``, in ``event_id`` order."""
        return await self._run(read_events_call(after_id, max_rows, queue, job_ids, batch_id))


@dataclass(frozen=True, slots=True)
class MaintenanceAction:
    """One thing a ``pgjobs.maintain()`` pass did: ``tick`` (events given ids), ``truncate`` (an inbox
    partition emptied), ``rotate`` (the log moved to a partition it emptied), ``wait`` (rotation waits for the
    retention), ``skip`` (a partition was busy, retried next pass), ``forget`` (expired follower marks), ``busy``
    (another pass was running: nothing done)."""

    action: str
    target: str
    rows: int | None


def maintain_call() -> Call[list[MaintenanceAction]]:
    return Call(
        "SELECT action, target, rows FROM pgjobs.maintain()",
        {},
        lambda rows: [MaintenanceAction(r["action"], r["target"], r["rows"]) for r in rows],
    )


class SyncStreamOps(SyncRunner):
    """``Client.read_events``, ``Client.stream_head`` and ``Client.maintain``."""

    def stream_head(self) -> int:
        """The newest event id in the log (0 when it is empty): a live follower's starting cursor."""
        return int(self._run(Call(_HEAD_SQL, {}, scalar, read=True)) or 0)

    def maintain(self) -> list[MaintenanceAction]:
        """One maintenance pass of the status stream (workers run one every few seconds by themselves)."""
        return self._run(maintain_call())

    def read_events(
        self,
        after_id: int = 0,
        max_rows: int = _PAGE,
        queue: str | None = None,
        job_ids: Iterable[int] | None = None,
        batch_id: int | None = None,
    ) -> list[StatusEvent]:
        """One page of ``pgjobs.read_events``: events after ``after_id``, in ``event_id`` order."""
        return self._run(read_events_call(after_id, max_rows, queue, job_ids, batch_id))
