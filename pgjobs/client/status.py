"""Reading state: job_status, stats, list_jobs, count_jobs (sql/status.sql)."""

from __future__ import annotations

from pgjobs.client._call import AsyncConn, AsyncRunner, Call, SyncConn, SyncRunner, scalar
from pgjobs.records import Job, JobState, JobStatus, QueueStat


def job_status_call(id: int) -> Call[JobStatus | None]:
    return Call(
        "SELECT * FROM pgjobs.job_status(id => %(id)s)",
        {"id": id},
        lambda rows: JobStatus.from_row(rows[0]) if rows else None,
        read=True,
    )


def stats_call() -> Call[list[QueueStat]]:
    return Call("SELECT * FROM pgjobs.stats()", {}, lambda rows: [QueueStat.from_row(r) for r in rows], read=True)


def list_jobs_call(
    state: JobState | str | None = None,
    queue: str | None = None,
    kind: str | None = None,
    search: str | None = None,
    max_rows: int = 100,
    skip_rows: int = 0,
) -> Call[list[Job]]:
    return Call(
        "SELECT * FROM pgjobs.list_jobs(state => %(state)s::pgjobs.job_state, queue => %(queue)s, kind => %(kind)s,"
        " search => %(search)s, max_rows => %(max_rows)s, skip_rows => %(skip_rows)s)",
        {
            "state": None if state is None else str(state),
            "queue": queue,
            "kind": kind,
            "search": search,
            "max_rows": max_rows,
            "skip_rows": skip_rows,
        },
        lambda rows: [Job.from_row(r) for r in rows],
        read=True,
    )


def count_jobs_call(
    state: JobState | str | None = None, queue: str | None = None, kind: str | None = None, search: str | None = None
) -> Call[int]:
    return Call(
        "SELECT pgjobs.count_jobs(state => %(state)s::pgjobs.job_state, queue => %(queue)s, kind => %(kind)s,"
        " search => %(search)s)",
        {"state": None if state is None else str(state), "queue": queue, "kind": kind, "search": search},
        lambda rows: int(scalar(rows) or 0),
        read=True,
    )


class StatusOps(SyncRunner):
    def job_status(self, id: int, *, conn: SyncConn | None = None) -> JobStatus | None:
        """The job with its incoming edges, or None when there is no such job."""
        return self._run(job_status_call(id), conn)

    def stats(self, *, conn: SyncConn | None = None) -> list[QueueStat]:
        return self._run(stats_call(), conn)

    def list_jobs(
        self,
        state: JobState | str | None = None,
        queue: str | None = None,
        kind: str | None = None,
        search: str | None = None,
        max_rows: int = 100,
        skip_rows: int = 0,
        *,
        conn: SyncConn | None = None,
    ) -> list[Job]:
        """Newest first; ``search`` matches kind, unique key or payload text (case-insensitive substring)."""
        return self._run(list_jobs_call(state, queue, kind, search, max_rows, skip_rows), conn)

    def count_jobs(
        self,
        state: JobState | str | None = None,
        queue: str | None = None,
        kind: str | None = None,
        search: str | None = None,
        *,
        conn: SyncConn | None = None,
    ) -> int:
        """How many jobs ``list_jobs`` with the same filters matches, all pages together."""
        return self._run(count_jobs_call(state, queue, kind, search), conn)


class AsyncStatusOps(AsyncRunner):
    async def job_status(self, id: int, *, conn: AsyncConn | None = None) -> JobStatus | None:
        return await self._run(job_status_call(id), conn)

    async def stats(self, *, conn: AsyncConn | None = None) -> list[QueueStat]:
        return await self._run(stats_call(), conn)

    async def list_jobs(
        self,
        state: JobState | str | None = None,
        queue: str | None = None,
        kind: str | None = None,
        search: str | None = None,
        max_rows: int = 100,
        skip_rows: int = 0,
        *,
        conn: AsyncConn | None = None,
    ) -> list[Job]:
        return await self._run(list_jobs_call(state, queue, kind, search, max_rows, skip_rows), conn)

    async def count_jobs(
        self,
        state: JobState | str | None = None,
        queue: str | None = None,
        kind: str | None = None,
        search: str | None = None,
        *,
        conn: AsyncConn | None = None,
    ) -> int:
        return await self._run(count_jobs_call(state, queue, kind, search), conn)
