"""Workflows: job graphs and batches (sql/graph.sql, sql/batch.sql).

The builder collects job specs with readable dependencies and submits them as one
``enqueue_many`` (all or nothing)::

    with client.batch() as b:
        resized = [b.enqueue("resize", {"image": name}) for name in names]
        zipped = b.enqueue("zip", {"to": "album.zip"}, after=resized)
        b.enqueue("alert", {"why": "zip failed"}, after=[on_failure(zipped)])
        b.then("notify", {"album": "album.zip"}, on="complete")  # after the whole batch settles
    print(b.batch_id, zipped.id)

``client.graph()`` is the same without a batch. Dependencies (``after=``) are :class:`JobRef`
handles from the same builder, ids of existing jobs, or :class:`Dep` values (``on_failure(x)``,
``on_complete(x)``, ``after_batch(batch_id)``) that carry their own trigger.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, LiteralString, Self
from uuid import UUID

from pgjobs.client._call import AsyncConn, AsyncRunner, Call, Rows, SyncConn, SyncRunner, jsonb, scalar
from pgjobs.client.arguments import NO_PAYLOAD, payload_object
from pgjobs.client.defaults import EnqueueDefaults
from pgjobs.client.enqueue import _spec, enqueue_many_call
from pgjobs.records import BatchStatus, EnqueuedSpec

Trigger = Literal["success", "failure", "complete"]
TRIGGERS: tuple[Trigger, ...] = ("success", "failure", "complete")


@dataclass(eq=False)
class JobRef:
    """A job added to a builder; ``id`` (and ``created``) are filled when the builder is submitted."""

    ref: str
    kind: str
    id: int | None = None
    created: bool | None = None
    batch_id: int | None = None


@dataclass(frozen=True)
class Dep:
    """A dependency with its trigger: on a :class:`JobRef`, an existing job id, or a batch id."""

    job: JobRef | int | None = None
    batch: int | None = None
    on: Trigger = "success"

    def __post_init__(self) -> None:
        if (self.job is None) == (self.batch is None):
            raise ValueError("a Dep names exactly one of job= or batch=")
        if self.on not in TRIGGERS:
            raise ValueError(f"unknown trigger {self.on!r}; expected one of {TRIGGERS}")


def on_success(job: JobRef | int) -> Dep:
    return Dep(job=job, on="success")


def on_failure(job: JobRef | int) -> Dep:
    return Dep(job=job, on="failure")


def on_complete(job: JobRef | int) -> Dep:
    return Dep(job=job, on="complete")


def after_batch(batch_id: int, on: Trigger = "success") -> Dep:
    return Dep(batch=batch_id, on=on)


After = JobRef | int | Dep


def _job_spec(
    kind: str,
    payload: Any,
    *,
    ref: str,
    depends_on: list[dict[str, Any]],
    queue: str | None,
    run_at: datetime | None,
    priority: int | None,
    max_attempts: int | None,
    unique_key: str | None,
    unique_live_only: bool | None,
    group_key: str | None,
    meta: Mapping[str, Any] | None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"kind": kind, "payload": payload_object(payload), "ref": ref}
    optional = {
        "queue": queue,
        "run_at": run_at,
        "priority": priority,
        "max_attempts": max_attempts,
        "unique_key": unique_key,
        "unique_live_only": unique_live_only,
        "group_key": group_key,
        "meta": None if meta is None else dict(meta),
    }
    spec.update({k: v for k, v in optional.items() if v is not None})
    if depends_on:
        spec["depends_on"] = depends_on
    return _spec(spec)


class GraphBuilder:
    """Collects specs; :class:`SyncGraphBuilder` / :class:`AsyncGraphBuilder` submit them."""

    def __init__(self, as_batch: bool) -> None:
        self.as_batch = as_batch
        self.batch_id: int | None = None
        self.results: list[EnqueuedSpec] = []
        self._specs: list[dict[str, Any]] = []
        self._jobs: dict[str, JobRef] = {}
        self._then: list[tuple[dict[str, Any], Trigger]] = []
        self._then_jobs: list[JobRef] = []
        self._submitted = False
        self._defaults: EnqueueDefaults | None = None  # the client's app= declarations, set by the subclasses

    def enqueue(
        self,
        kind: str,
        payload: Any = NO_PAYLOAD,
        *,
        after: Iterable[After] = (),
        on: Trigger = "success",
        ref: str | None = None,
        queue: str | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        unique_key: str | None = None,
        unique_live_only: bool | None = None,
        group_key: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> JobRef:
        """Adds a job that runs once every job in ``after`` settled as ``on`` says (default: succeeded)."""
        job = self._new_ref(kind, ref)
        spec = _job_spec(
            kind,
            payload,
            ref=job.ref,
            depends_on=self._deps(after, on),
            queue=queue,
            run_at=run_at,
            priority=priority,
            max_attempts=max_attempts,
            unique_key=unique_key,
            unique_live_only=unique_live_only,
            group_key=group_key,
            meta=meta,
        )
        self._specs.append(spec)
        self._jobs[job.ref] = job
        return job

    def then(
        self,
        kind: str,
        payload: Any = NO_PAYLOAD,
        *,
        on: Trigger = "success",
        queue: str | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        unique_key: str | None = None,
        group_key: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> JobRef:
        """A continuation of the whole batch: runs once the batch settles as ``on`` says. Not a member."""
        if not self.as_batch:
            raise ValueError("then() continues a batch; use enqueue(..., after=[...]) in a graph")
        if on not in TRIGGERS:
            raise ValueError(f"unknown trigger {on!r}; expected one of {TRIGGERS}")
        job = self._new_ref(kind, None)
        spec = _job_spec(
            kind,
            payload,
            ref=job.ref,
            depends_on=[],
            queue=queue,
            run_at=run_at,
            priority=priority,
            max_attempts=max_attempts,
            unique_key=unique_key,
            unique_live_only=None,
            group_key=group_key,
            meta=meta,
        )
        self._then.append((spec, on))
        self._then_jobs.append(job)
        return job

    @property
    def jobs(self) -> list[JobRef]:
        return [*self._jobs.values(), *self._then_jobs]

    def _new_ref(self, kind: str, ref: str | None) -> JobRef:
        if self._submitted:
            raise RuntimeError("this builder was already submitted")
        name = ref if ref is not None else f"{kind}#{len(self._jobs) + len(self._then_jobs) + 1}"
        if name in self._jobs or any(j.ref == name for j in self._then_jobs):
            raise ValueError(f"ref {name!r} is already used in this builder")
        return JobRef(ref=name, kind=kind)

    def _deps(self, after: Iterable[After], on: Trigger) -> list[dict[str, Any]]:
        if on not in TRIGGERS:
            raise ValueError(f"unknown trigger {on!r}; expected one of {TRIGGERS}")
        deps: list[dict[str, Any]] = []
        for item in after:
            dep = item if isinstance(item, Dep) else Dep(job=item, on=on)
            if dep.batch is not None:
                deps.append({"batch": dep.batch, "on": dep.on})
            elif isinstance(dep.job, JobRef):
                if self._jobs.get(dep.job.ref) is dep.job:
                    deps.append({"ref": dep.job.ref, "on": dep.on})
                elif dep.job.id is not None:
                    deps.append({"job": dep.job.id, "on": dep.on})
                else:
                    raise ValueError(f"{dep.job.ref!r} belongs to another builder that was not submitted yet")
            else:
                deps.append({"job": int(dep.job), "on": dep.on})  # type: ignore[arg-type]
        return deps

    def _members_call(self) -> Call[list[EnqueuedSpec]]:
        self._submitted = True
        return enqueue_many_call(self._specs, self.as_batch, self._defaults)

    def _then_call(self) -> Call[list[EnqueuedSpec]] | None:
        if not self._then:
            return None
        if self.batch_id is None:
            raise RuntimeError("then(): the batch has no member, so there is nothing to continue")
        specs = [{**spec, "depends_on": [{"batch": self.batch_id, "on": on}]} for spec, on in self._then]
        return enqueue_many_call(specs, False, self._defaults)

    def _record(self, rows: list[EnqueuedSpec], jobs: list[JobRef]) -> None:
        by_ref = {j.ref: j for j in jobs}
        members = jobs is not self._then_jobs
        for row in rows:
            job = by_ref.get(row.ref or "")
            if job is not None:
                job.id, job.created, job.batch_id = row.id, row.created, row.batch_id
            if members and self.as_batch and self.batch_id is None and row.created:
                self.batch_id = row.batch_id
        self.results.extend(rows)


class SyncGraphBuilder(GraphBuilder):
    """``with client.batch() as b:`` / ``with client.graph() as g:``: submits on a clean exit."""

    def __init__(self, runner: SyncRunner, as_batch: bool, conn: SyncConn | None = None) -> None:
        super().__init__(as_batch)
        self._runner = runner
        self._conn = conn
        self._defaults = getattr(runner, "_enqueue_defaults", None)

    def submit(self) -> list[EnqueuedSpec]:
        """Enqueues everything in one transaction (the batch's continuations in a second call within it)."""
        if self._submitted:
            raise RuntimeError("this builder was already submitted")
        if self._conn is not None:
            with self._conn.transaction():
                self._submit_on(self._conn)
        else:
            with self._runner._pool.connection() as conn, conn.transaction():
                self._submit_on(conn)
        return self.results

    def _submit_on(self, conn: SyncConn) -> None:
        if not self._specs:
            self._submitted = True
            return
        self._record(self._runner._run(self._members_call(), conn), list(self._jobs.values()))
        then = self._then_call()
        if then is not None:
            self._record(self._runner._run(then, conn), self._then_jobs)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if t is None:
            self.submit()


class AsyncGraphBuilder(GraphBuilder):
    """``async with client.batch() as b:``: submits on a clean exit."""

    def __init__(self, runner: AsyncRunner, as_batch: bool, conn: AsyncConn | None = None) -> None:
        super().__init__(as_batch)
        self._runner = runner
        self._conn = conn
        self._defaults = getattr(runner, "_enqueue_defaults", None)

    async def submit(self) -> list[EnqueuedSpec]:
        if self._submitted:
            raise RuntimeError("this builder was already submitted")
        if self._conn is not None:
            async with self._conn.transaction():
                await self._submit_on(self._conn)
        else:
            async with self._runner._pool.connection() as conn, conn.transaction():
                await self._submit_on(conn)
        return self.results

    async def _submit_on(self, conn: AsyncConn) -> None:
        if not self._specs:
            self._submitted = True
            return
        self._record(await self._runner._run(self._members_call(), conn), list(self._jobs.values()))
        then = self._then_call()
        if then is not None:
            self._record(await self._runner._run(then, conn), self._then_jobs)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if t is None:
            await self.submit()


# --- calls ---------------------------------------------------------------------------------------


def batch_status_call(batch_id: int) -> Call[BatchStatus | None]:
    return Call(
        "SELECT * FROM pgjobs.batch_status(batch_id => %(id)s)",
        {"id": batch_id},
        lambda rows: BatchStatus.from_row(rows[0]) if rows else None,
        read=True,
    )


def batch_graph_call(batch_id: int) -> Call[dict[str, Any] | None]:
    return Call("SELECT pgjobs.batch_graph(batch_id => %(id)s)", {"id": batch_id}, scalar, read=True)


def cancel_batch_call(batch_id: int) -> Call[int]:
    return Call("SELECT pgjobs.cancel_batch(batch_id => %(id)s)", {"id": batch_id}, scalar)


def delete_batch_call(batch_id: int) -> Call[int]:
    return Call("SELECT pgjobs.delete_batch(batch_id => %(id)s)", {"id": batch_id}, scalar)


def add_to_batch_call(
    id: int, lease_token: UUID | str, job: Mapping[str, Any], before_continuations: bool = False
) -> Call[int | None]:
    return Call(
        "SELECT pgjobs.add_to_batch(id => %(id)s, lease_token => %(tok)s, job => %(job)s,"
        " before_continuations => %(before)s)",
        {"id": id, "tok": lease_token, "job": jsonb(_spec(job)), "before": before_continuations},
        scalar,
    )


def _results(rows: Rows) -> dict[int, Any] | None:
    value = scalar(rows)
    return None if value is None else {int(k): v for k, v in value.items()}


def parent_results_call(id: int) -> Call[dict[int, Any] | None]:
    return Call("SELECT pgjobs.parent_results(id => %(id)s)", {"id": id}, _results)


def _many_results(rows: Rows) -> dict[int, dict[int, Any]]:
    return {int(r["id"]): {int(k): v for k, v in r["results"].items()} for r in rows}


def parent_results_many_call(ids: Iterable[int]) -> Call[dict[int, dict[int, Any]]]:
    return Call("SELECT * FROM pgjobs.parent_results_many(ids => %(ids)s::bigint[])", {"ids": list(ids)}, _many_results)


# The worker's hot path: a prepared statement, ids as an array literal ("{1,2}"); the results come back as
# JSON text, parsed by the job that reads them.
PARENT_RESULTS_MANY_SQL: LiteralString = "SELECT id, results::text FROM pgjobs.parent_results_many(ids => %s::bigint[])"


# --- mixins --------------------------------------------------------------------------------------


class GraphOps(SyncRunner):
    def batch(self, *, conn: SyncConn | None = None) -> SyncGraphBuilder:
        """A builder whose jobs become one batch: ``with client.batch() as b: ...``."""
        return SyncGraphBuilder(self, True, conn)

    def graph(self, *, conn: SyncConn | None = None) -> SyncGraphBuilder:
        """A builder of dependent jobs (no batch): ``with client.graph() as g: ...``."""
        return SyncGraphBuilder(self, False, conn)

    def batch_status(self, batch_id: int, *, conn: SyncConn | None = None) -> BatchStatus | None:
        """Counters, state and fraction settled; None for an unknown batch."""
        return self._run(batch_status_call(batch_id), conn)

    def batch_graph(self, batch_id: int, *, conn: SyncConn | None = None) -> dict[str, Any] | None:
        """``{"batch": ..., "nodes": [...], "edges": [...]}``; None for an unknown batch."""
        return self._run(batch_graph_call(batch_id), conn)

    def cancel_batch(self, batch_id: int, *, conn: SyncConn | None = None) -> int:
        """Cancels the members not yet terminal (running ones by request); returns how many."""
        return self._run(cancel_batch_call(batch_id), conn)

    def delete_batch(self, batch_id: int, *, conn: SyncConn | None = None) -> int:
        """Deletes a settled batch with its members and edges; returns the members removed."""
        return self._run(delete_batch_call(batch_id), conn)

    def add_to_batch(
        self,
        id: int,
        lease_token: UUID,
        job: Mapping[str, Any],
        before_continuations: bool = False,
        *,
        conn: SyncConn | None = None,
    ) -> int | None:
        """A running member adds a sibling; None when the lease token no longer holds the job. InvalidState
        (PJ004) when the job is not in a batch or its cancellation was requested (cancel, cancel_batch)."""
        return self._run(add_to_batch_call(id, lease_token, job, before_continuations), conn)

    def parent_results(self, id: int, *, conn: SyncConn | None = None) -> dict[int, Any] | None:
        """``{parent job id: result}`` over the job's parents (batch parents: every member)."""
        return self._run(parent_results_call(id), conn)

    def parent_results_many(self, ids: Iterable[int], *, conn: SyncConn | None = None) -> dict[int, dict[int, Any]]:
        """``parent_results`` of many jobs in one round trip; only jobs that have parents are keys."""
        return self._run(parent_results_many_call(ids), conn)


class AsyncGraphOps(AsyncRunner):
    def batch(self, *, conn: AsyncConn | None = None) -> AsyncGraphBuilder:
        return AsyncGraphBuilder(self, True, conn)

    def graph(self, *, conn: AsyncConn | None = None) -> AsyncGraphBuilder:
        return AsyncGraphBuilder(self, False, conn)

    async def batch_status(self, batch_id: int, *, conn: AsyncConn | None = None) -> BatchStatus | None:
        return await self._run(batch_status_call(batch_id), conn)

    async def batch_graph(self, batch_id: int, *, conn: AsyncConn | None = None) -> dict[str, Any] | None:
        return await self._run(batch_graph_call(batch_id), conn)

    async def cancel_batch(self, batch_id: int, *, conn: AsyncConn | None = None) -> int:
        return await self._run(cancel_batch_call(batch_id), conn)

    async def delete_batch(self, batch_id: int, *, conn: AsyncConn | None = None) -> int:
        return await self._run(delete_batch_call(batch_id), conn)

    async def add_to_batch(
        self,
        id: int,
        lease_token: UUID,
        job: Mapping[str, Any],
        before_continuations: bool = False,
        *,
        conn: AsyncConn | None = None,
    ) -> int | None:
        return await self._run(add_to_batch_call(id, lease_token, job, before_continuations), conn)

    async def parent_results(self, id: int, *, conn: AsyncConn | None = None) -> dict[int, Any] | None:
        return await self._run(parent_results_call(id), conn)

    async def parent_results_many(
        self, ids: Iterable[int], *, conn: AsyncConn | None = None
    ) -> dict[int, dict[int, Any]]:
        return await self._run(parent_results_many_call(ids), conn)
