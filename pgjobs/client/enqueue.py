"""Producing work: ``pgjobs.enqueue``, ``pgjobs.enqueue_many`` and ``pgjobs.enqueue_staged`` (sql/enqueue.sql).

``queue``, ``priority`` and ``max_attempts`` left as None take the declared defaults of the kind when the
client was made with ``app=`` (:mod:`pgjobs.client.defaults`), else the SQL defaults.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Literal, LiteralString, cast

import psycopg
import psycopg.errors
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from pgjobs.client import staging
from pgjobs.client._call import (
    AsyncConn,
    AsyncRunner,
    Call,
    FastCall,
    Rows,
    SyncConn,
    SyncRunner,
    Tuples,
    jsonb,
    unprepared,
)
from pgjobs.client.arguments import NO_PAYLOAD, check_priority, payload_object, run_at_time
from pgjobs.client.defaults import EnqueueDefaults, fill_spec, resolve, resolve_rate_key
from pgjobs.client.tracecontext import traced_many, traced_many_async, traced_one, traced_one_async
from pgjobs.errors import translate
from pgjobs.records import Enqueued, EnqueuedSpec, JobState, slot_setters

Method = Literal["auto", "json", "copy"]
Staged = tuple[list[str], list[tuple[Any, ...]]]


# The hot path of a producer (one job, one commit): positional parameters, tuple rows, and (when the
# client allows it) a statement prepared once per connection. The common spec (nothing but kind, payload
# and queue) sends three parameters and lets the SQL defaults fill the rest; any other spec sends all ten.
# Both name their arguments, so a reordering of enqueue's parameters cannot misplace a value.
_ENQUEUE_COMMON: LiteralString = "SELECT id, created, state FROM pgjobs.enqueue(kind => %s, payload => %s, queue => %s)"
_ENQUEUE_FULL: LiteralString = (
    "SELECT id, created, state FROM pgjobs.enqueue(kind => %s, payload => %s, queue => %s, run_at => %s,"
    " priority => %s::smallint, max_attempts => %s, unique_key => %s, unique_live_only => %s,"
    " group_key => %s, meta => %s, rate_key => %s)"
)


def _enqueued(rows: Tuples) -> Enqueued:
    row = rows[0]
    return Enqueued(row[0], row[1], JobState(row[2]))


def enqueue_fast_call(
    kind: str,
    payload: Any = NO_PAYLOAD,
    queue: str | None = None,
    run_at: datetime | str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    unique_key: str | None = None,
    unique_live_only: bool = False,
    group_key: str | None = None,
    meta: Mapping[str, Any] | None = None,
    defaults: EnqueueDefaults | None = None,
    rate_key: str | None = None,
) -> FastCall[Enqueued]:
    """What ``enqueue`` sends (``pgjobs.enqueue`` with its arguments named; a declared kind's defaults applied)."""
    doc = Jsonb(payload_object(payload))
    run_at = run_at_time(run_at)
    if defaults is not None or queue is None or priority is None or max_attempts is None:
        options = resolve(defaults, kind, {"queue": queue, "priority": priority, "max_attempts": max_attempts})
        queue, priority, max_attempts = options["queue"], options["priority"], options["max_attempts"]
    rate_key = resolve_rate_key(defaults, kind, doc.obj, rate_key)
    check_priority(priority)
    if (
        run_at is None
        and priority == 0
        and max_attempts == 20
        and unique_key is None
        and not unique_live_only
        and group_key is None
        and not meta
        and rate_key is None
    ):
        return FastCall(_ENQUEUE_COMMON, (kind, doc, queue), _enqueued)
    params = (
        kind,
        doc,
        queue,
        run_at,
        priority,
        max_attempts,
        unique_key,
        unique_live_only,
        group_key,
        Jsonb(dict(meta) if meta else {}),
        rate_key,
    )
    return FastCall(_ENQUEUE_FULL, params, _enqueued)


def _specs(rows: Rows) -> list[EnqueuedSpec]:
    # The four columns by name: EnqueuedSpec.from_row (which reads the dataclass's fields for every row)
    # cost 12 us a row, most of the client's time of a 1,000-spec call. Extra columns are ignored all the same.
    return [EnqueuedSpec(r["ref"], r["id"], r["created"], r["batch_id"]) for r in rows]


def enqueue_many_call(
    jobs: Iterable[Mapping[str, Any]], as_batch: bool = False, defaults: EnqueueDefaults | None = None
) -> Call[list[EnqueuedSpec]]:
    # (fill_spec copies each spec; without an app there is nothing to fill)
    if defaults is None:
        specs = [_spec(j, i) for i, j in enumerate(jobs)]
    else:
        specs = [_spec(fill_spec(defaults, j), i) for i, j in enumerate(jobs)]
    return Call(
        "SELECT * FROM pgjobs.enqueue_many(jobs => %(jobs)s, as_batch => %(as_batch)s)",
        {"jobs": jsonb(specs), "as_batch": as_batch},
        _specs,
    )


# enqueue_many's path for the common bulk load: specs of kind, queue and payload alone (a ``ref`` string, and
# other keys at their SQL defaults, allowed) cross as columns, the payloads as one JSON array, and one id a
# row comes back (sql/enqueue.sql, enqueue_arrays). Any other spec goes as JSON, which also words the errors:
# a spec this test lets through is one the server accepts (lengths within limits; a bounded queue's PJ001
# reads the same either way).
# (The two lists go in binary: psycopg's text form tests every element for quoting, twice the time.)
_ENQUEUE_ARRAYS: LiteralString = "SELECT id FROM pgjobs.enqueue_arrays(kinds => %b, payloads => %s, queues => %b)"
_LEAN_KEYS = frozenset({"kind", "queue", "payload", "ref"})
_AT_DEFAULT: dict[str, Any] = {
    "priority": 0,
    "max_attempts": 20,
    "run_at": None,
    "unique_key": None,
    "unique_live_only": False,
    "group_key": None,
    "meta": None,
    "rate_key": None,
}
_MAX_ARRAYS = 100_000  # (limits: sql/checks.sql) more goes as JSON, which refuses it
_REF_TYPES = frozenset({str, type(None)})


def _names_ok(values: list[Any]) -> bool:
    """Every value a name the server takes (limits: checks.sql: 1 to 1,000 bytes). Whole-list tests in C:
    a loop over the specs in Python cost more than the server's own checks."""
    if set(map(type, values)) != {str} or min(map(len, values)) == 0:
        return False
    # a UTF-8 character is at most 4 bytes
    return max(map(len, values)) <= 250 or all(len(v.encode()) <= 1000 for v in values)


def _at_default(spec: Mapping[str, Any]) -> bool:
    """True when every key of ``spec`` beyond kind, queue, payload and ref holds its SQL default, with the
    default's own type (``priority: False`` is refused by the server, not read as 0)."""
    for key, value in spec.items():
        if key in _LEAN_KEYS:
            continue
        if key not in _AT_DEFAULT:
            return False
        default = _AT_DEFAULT[key]
        if not (
            value is default or (type(value) is type(default) and value == default) or (key == "meta" and value == {})
        ):
            return False
    return True


Columns = tuple[list[str], Jsonb | None, list[str], list[Any]]


def lean_columns(specs: list[Mapping[str, Any]]) -> Columns | None:
    """The specs as enqueue_arrays' columns (kinds, payloads, queues, refs), or None when one of them needs
    the JSON path (another setting, a dependency, a value the server would refuse)."""
    if not 0 < len(specs) <= _MAX_ARRAYS or set(map(type, specs)) != {dict}:
        return None
    # (issuperset through map: the keys of every spec tested in C, 2x a generator's speed)
    if not (all(map(_LEAN_KEYS.issuperset, specs)) or all(map(_at_default, specs))):
        return None
    kinds = [s.get("kind") for s in specs]
    queues = [s.get("queue", "default") for s in specs]
    payloads = [s.get("payload", {}) for s in specs]
    refs = [s.get("ref") for s in specs]
    if not (_names_ok(kinds) and _names_ok(queues)) or None in payloads or not set(map(type, refs)) <= _REF_TYPES:
        return None
    # No payload anywhere (all {} or left out): NULL, which the server reads as {} for every job without a
    # JSON array to parse (3 % of a 1,000-job call at the server, pgbench).
    doc = None if payloads.count({}) == len(payloads) else Jsonb(payloads)
    return cast(list[str], kinds), doc, queues, refs


# EnqueuedSpec(ref, id, True, None) with its slots set directly (records.slot_setters): the frozen
# dataclass's __init__ was the largest client cost of a 1,000-job call (0.68 ms; this: 0.49 ms).
_SET_REF, _SET_ID, _SET_CREATED, _SET_BATCH = slot_setters(EnqueuedSpec, ("ref", "id", "created", "batch_id"))
_NEW = object.__new__


def _made_spec(ref: str | None, id_: int) -> EnqueuedSpec:
    """``EnqueuedSpec(ref, id_, True, None)``, made in two thirds of the time."""
    spec: EnqueuedSpec = _NEW(EnqueuedSpec)
    _SET_REF(spec, ref)
    _SET_ID(spec, id_)
    _SET_CREATED(spec, True)
    _SET_BATCH(spec, None)
    return spec


def enqueue_arrays_call(columns: Columns) -> FastCall[list[EnqueuedSpec]]:
    kinds, payloads, queues, refs = columns

    def specs(rows: Tuples) -> list[EnqueuedSpec]:
        if len(rows) != len(refs):  # (never: one id per element, or an error)
            raise RuntimeError(f"enqueue_arrays returned {len(rows)} ids for {len(refs)} jobs")
        return list(map(_made_spec, refs, [r[0] for r in rows]))

    return FastCall(_ENQUEUE_ARRAYS, (kinds, payloads, queues), specs)


def bulk_call(
    jobs: Iterable[Mapping[str, Any]], as_batch: bool, method: Method, defaults: EnqueueDefaults | None
) -> Call[list[EnqueuedSpec]] | FastCall[list[EnqueuedSpec]]:
    """What ``enqueue_many`` sends (not ``method="copy"``): plain specs as columns when ``method`` is
    ``"auto"``, anything else as one JSON document."""
    if method == "auto" and not as_batch:
        specs = _with_defaults(jobs, defaults)
        columns = lean_columns(specs)
        return enqueue_many_call(specs, as_batch) if columns is None else enqueue_arrays_call(columns)
    return enqueue_many_call(jobs, as_batch, defaults)


# Sessions known to hold the staging table: connection -> its backend pid. On such a session the
# autocommit path skips creating (or emptying) the table, a statement and a plpgsql compile per call: at
# the start of our own transaction ON COMMIT DELETE ROWS has emptied it. Should the table be gone after
# all (DISCARD TEMP, or a pooler that put us on another server), the COPY fails with 42P01 before
# anything was written, and the call runs once more, creating it.
_STAGED: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def _copy_once_sync(conn: SyncConn, staged: Staged, as_batch: bool, prepare: bool, stage: bool) -> Tuples:
    columns, rows = staged
    cur = conn.cursor(row_factory=tuple_row)
    if stage:
        cur.execute(staging.STAGE, prepare=False)
    with cur.copy(staging.copy_statement(columns)) as copy:
        copy.set_types(staging.copy_types(columns))
        for row in rows:
            copy.write_row(row)
    cur.execute(staging.ENQUEUE_STAGED, (as_batch,), prepare=prepare)
    return cur.fetchall()


def _copy_sync(conn: SyncConn, staged: Staged, as_batch: bool, prepare: bool) -> Tuples:
    # One transaction: the staged rows and the jobs made from them stand or fall together, and the rows
    # vanish at its commit. On the caller's own (non-autocommit) connection that is the caller's
    # transaction, committed or rolled back by the caller, as every other call with ``conn=``; there
    # the table is always staged (an earlier call of the same transaction may have left rows in it).
    if not conn.autocommit:
        return _copy_once_sync(conn, staged, as_batch, prepare, stage=True)
    pid = conn.info.backend_pid
    known = _STAGED.get(conn) == pid
    try:
        with conn.transaction():
            out = _copy_once_sync(conn, staged, as_batch, prepare, stage=not known)
    except psycopg.errors.UndefinedTable:
        if not known:
            raise
        _STAGED.pop(conn, None)
        with conn.transaction():
            out = _copy_once_sync(conn, staged, as_batch, prepare, stage=True)
    _STAGED[conn] = pid
    return out


async def _copy_once_async(conn: AsyncConn, staged: Staged, as_batch: bool, prepare: bool, stage: bool) -> Tuples:
    columns, rows = staged
    cur = conn.cursor(row_factory=tuple_row)
    if stage:
        await cur.execute(staging.STAGE, prepare=False)
    async with cur.copy(staging.copy_statement(columns)) as copy:
        copy.set_types(staging.copy_types(columns))
        for row in rows:
            await copy.write_row(row)
    await cur.execute(staging.ENQUEUE_STAGED, (as_batch,), prepare=prepare)
    return await cur.fetchall()


async def _copy_async(conn: AsyncConn, staged: Staged, as_batch: bool, prepare: bool) -> Tuples:
    if not conn.autocommit:
        return await _copy_once_async(conn, staged, as_batch, prepare, stage=True)
    pid = conn.info.backend_pid
    known = _STAGED.get(conn) == pid
    try:
        async with conn.transaction():
            out = await _copy_once_async(conn, staged, as_batch, prepare, stage=not known)
    except psycopg.errors.UndefinedTable:
        if not known:
            raise
        _STAGED.pop(conn, None)
        async with conn.transaction():
            out = await _copy_once_async(conn, staged, as_batch, prepare, stage=True)
    _STAGED[conn] = pid
    return out


def _with_defaults(jobs: Iterable[Mapping[str, Any]], defaults: EnqueueDefaults | None) -> list[Mapping[str, Any]]:
    """The specs as a list, with the kinds' declared options filled in (``Client(app=...)``)."""
    if defaults is None:
        return jobs if isinstance(jobs, list) else list(jobs)
    return [fill_spec(defaults, j) for j in jobs]


def _spec_rows(rows: Tuples) -> list[EnqueuedSpec]:
    return [EnqueuedSpec(r[0], r[1], r[2], r[3]) for r in rows]


def _spec(job: Mapping[str, Any], index: int | None = None) -> dict[str, Any]:
    """A job spec as JSON: datetimes become ISO 8601 strings, nothing else is touched (a plain dict without
    a datetime is sent as it is: the call serialises it before it returns). A run_at string must be ISO
    8601 (:func:`~pgjobs.client.arguments.run_at_time`), not whatever PostgreSQL's date parser reads."""
    run_at = job.get("run_at")
    if type(run_at) is str:
        run_at_time(run_at, "job" if index is None else f"jobs[{index}]")
    if type(job) is dict and not isinstance(run_at, datetime):
        return job
    spec = dict(job)
    if isinstance(spec.get("run_at"), datetime):
        spec["run_at"] = spec["run_at"].isoformat()
    return spec


class EnqueueOps(SyncRunner):
    _enqueue_defaults: EnqueueDefaults | None = None  # Client(app=...)

    @traced_one  # with a span active: a create span, its trace context in meta (pgjobs/client/tracecontext.py)
    def enqueue(
        self,
        kind: str,
        payload: Any = NO_PAYLOAD,
        *,
        queue: str | None = None,
        run_at: datetime | str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        unique_key: str | None = None,
        unique_live_only: bool = False,
        group_key: str | None = None,
        meta: Mapping[str, Any] | None = None,
        rate_key: str | None = None,
        conn: SyncConn | None = None,
    ) -> Enqueued:
        """Enqueues one job. With ``conn``, inside the caller's transaction. ``queue``/``priority``/
        ``max_attempts`` not given: the kind's declared defaults (``Client(app=...)``), else default/0/20.
        ``payload``: a dict (left out: ``{}``; ``None`` is refused); ``run_at``: a datetime or an ISO 8601
        string (:mod:`pgjobs.client.arguments`). ``rate_key``: the rate limit its starts draw tokens from
        (:meth:`configure_rate_limit`; not given: the kind's declared one)."""
        return self._run_fast(
            enqueue_fast_call(
                kind, payload, queue, run_at, priority, max_attempts, unique_key, unique_live_only, group_key, meta,
                self._enqueue_defaults, rate_key,
            ),
            conn,
        )  # fmt: skip

    @traced_many
    def enqueue_many(
        self,
        jobs: Iterable[Mapping[str, Any]],
        *,
        as_batch: bool = False,
        method: Method = "auto",
        conn: SyncConn | None = None,
    ) -> list[EnqueuedSpec]:
        """Enqueues job specs (dicts of enqueue arguments, plus ``ref``/``depends_on``) all or nothing; a spec
        without ``queue``/``priority``/``max_attempts`` gets its kind's declared ones (``Client(app=...)``).

        ``method="auto"`` sends specs of kind, queue and payload alone as columns (``pgjobs.enqueue_arrays``),
        any other set as one JSON document (``"json"`` always does); ``"copy"`` sends them through COPY
        (:meth:`enqueue_copy`)."""
        if method == "copy":
            return self.enqueue_copy(jobs, as_batch=as_batch, conn=conn)
        call = bulk_call(jobs, as_batch, method, self._enqueue_defaults)
        return self._run_fast(call, conn) if isinstance(call, FastCall) else self._run(call, conn)

    @traced_many
    def enqueue_copy(
        self, jobs: Iterable[Mapping[str, Any]], *, as_batch: bool = False, conn: SyncConn | None = None
    ) -> list[EnqueuedSpec]:
        """``enqueue_many`` through COPY into a staging table: the same contract, for large batches."""
        specs = _with_defaults(jobs, self._enqueue_defaults)
        staged = staging.stage(specs)
        if staged is None:
            return self._run(enqueue_many_call(specs, as_batch), conn)
        prepared = self._prepare
        try:
            if conn is not None:
                return _spec_rows(_copy_sync(conn, staged, as_batch, prepared))
            with self._pool.connection() as pooled:
                return _spec_rows(_copy_sync(pooled, staged, as_batch, prepared))
        except psycopg.Error as exc:
            if prepared and unprepared(self, exc, conn):  # its transaction rolled back: nothing was enqueued
                return self.enqueue_copy(specs, as_batch=as_batch, conn=conn)
            raise translate(exc) from exc


class AsyncEnqueueOps(AsyncRunner):
    _enqueue_defaults: EnqueueDefaults | None = None  # AsyncClient(app=...)

    @traced_one_async
    async def enqueue(
        self,
        kind: str,
        payload: Any = NO_PAYLOAD,
        *,
        queue: str | None = None,
        run_at: datetime | str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        unique_key: str | None = None,
        unique_live_only: bool = False,
        group_key: str | None = None,
        meta: Mapping[str, Any] | None = None,
        rate_key: str | None = None,
        conn: AsyncConn | None = None,
    ) -> Enqueued:
        return await self._run_fast(
            enqueue_fast_call(
                kind, payload, queue, run_at, priority, max_attempts, unique_key, unique_live_only, group_key, meta,
                self._enqueue_defaults, rate_key,
            ),
            conn,
        )  # fmt: skip

    @traced_many_async
    async def enqueue_many(
        self,
        jobs: Iterable[Mapping[str, Any]],
        *,
        as_batch: bool = False,
        method: Method = "auto",
        conn: AsyncConn | None = None,
    ) -> list[EnqueuedSpec]:
        if method == "copy":
            return await self.enqueue_copy(jobs, as_batch=as_batch, conn=conn)
        call = bulk_call(jobs, as_batch, method, self._enqueue_defaults)
        return await (self._run_fast(call, conn) if isinstance(call, FastCall) else self._run(call, conn))

    @traced_many_async
    async def enqueue_copy(
        self, jobs: Iterable[Mapping[str, Any]], *, as_batch: bool = False, conn: AsyncConn | None = None
    ) -> list[EnqueuedSpec]:
        specs = _with_defaults(jobs, self._enqueue_defaults)
        staged = staging.stage(specs)
        if staged is None:
            return await self._run(enqueue_many_call(specs, as_batch), conn)
        prepared = self._prepare
        try:
            if conn is not None:
                return _spec_rows(await _copy_async(conn, staged, as_batch, prepared))
            async with self._pool.connection() as pooled:
                return _spec_rows(await _copy_async(pooled, staged, as_batch, prepared))
        except psycopg.Error as exc:
            if prepared and unprepared(self, exc, conn):  # its transaction rolled back: nothing was enqueued
                return await self.enqueue_copy(specs, as_batch=as_batch, conn=conn)
            raise translate(exc) from exc
