"""Claiming work: ``pgjobs.claim`` and ``pgjobs.next_due_at`` (sql/claim.sql), ``pgjobs.capped_queues``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import LiteralString

from pgjobs.client._call import AsyncConn, AsyncRunner, Call, SyncConn, SyncRunner, interval, jsonb, scalar
from pgjobs.records import ClaimedJob


def claim_call(
    worker: str,
    queues: Sequence[str] = ("default",),
    max_jobs: int = 1,
    lease: float | timedelta = 30.0,
    kind_limits: Mapping[str, int] | None = None,
) -> Call[list[ClaimedJob]]:
    return Call(
        "SELECT * FROM pgjobs.claim(worker => %(worker)s, queues => %(queues)s::text[], max_jobs => %(max_jobs)s,"
        " lease => %(lease)s, kind_limits => %(kind_limits)s)",
        {
            "worker": worker,
            "queues": list(queues),
            "max_jobs": max_jobs,
            "lease": interval(lease),
            "kind_limits": jsonb(dict(kind_limits) if kind_limits is not None else None),
        },
        lambda rows: [ClaimedJob.from_row(r) for r in rows],
    )


def next_due_at_call(queues: Sequence[str]) -> Call[datetime | None]:
    return Call("SELECT pgjobs.next_due_at(%(queues)s::text[])", {"queues": list(queues)}, scalar)


def next_due_in_call(queues: Sequence[str], within: float) -> Call[float | None]:
    """Seconds until the next job of ``queues`` falls due within the next ``within`` seconds (None: none), by
    the server's clock: what the worker's poller sleeps for (``pgjobs.next_due_within``: under a held
    snapshot, next_due_at reads every completed job's old lease entry)."""
    return Call(
        "SELECT extract(epoch FROM pgjobs.next_due_within(%(queues)s::text[], make_interval(secs => %(within)s))"
        " - clock_timestamp())::float8",
        {"queues": list(queues), "within": float(within)},
        scalar,
    )


def _text_list(rows: list[dict[str, object]]) -> list[str]:
    value = scalar(rows)
    return [str(v) for v in value] if isinstance(value, list) else []


def capped_queues_call(queues: Sequence[str]) -> Call[list[str]]:
    """Which of ``queues`` have a cap (``max_active`` or ``max_active_per_group``): a worker claims again at
    once after it ends a job of one of them (``pgjobs.capped_queues``, sql/wakeups.sql)."""
    return Call("SELECT pgjobs.capped_queues(%(queues)s::text[])", {"queues": list(queues)}, _text_list)


# --- the worker's hot path -----------------------------------------------------------------------
# One prepared statement per claim, with positional parameters (worker, queues as an array literal
# (text_array_literal), max_jobs, lease as interval text, kind_limits as JSON text). jsonb columns come back
# as text: json.loads on the payload when the job runs is several times cheaper than psycopg's jsonb loader,
# and meta is only parsed if a handler reads it. Array parameters go out as array literals built with
# str.join, which costs a fraction of psycopg's per-element list dumping.
CLAIM_SQL: LiteralString = (
    "SELECT id, kind, queue, payload::text, attempt, max_attempts, lease_token::text, checkpoint::text, batch_id,"
    " meta::text FROM pgjobs.claim(worker => %s, queues => %s::text[], max_jobs => %s, lease => %s::interval,"
    " kind_limits => %s::jsonb)"
)


# Gives back jobs a claim returned after the worker began to stop (ids, tokens as array literals): one round trip.
RELEASE_CLAIMED_SQL: LiteralString = (
    "SELECT count(*) FILTER (WHERE pgjobs.release(id => r.id, lease_token => r.tok))"
    " FROM unnest(%s::bigint[], %s::uuid[]) AS r(id, tok)"
)


def text_array_literal(items: Sequence[str]) -> str:
    """A PostgreSQL array literal of text items, each quoted (a ``::text[]`` parameter)."""
    quoted = ['"' + i.replace("\\", "\\\\").replace('"', '\\"') + '"' for i in items]
    return "{" + ",".join(quoted) + "}"


def bigint_array_literal(ids: Sequence[int]) -> str:
    """A PostgreSQL array literal of integers (a ``::bigint[]`` parameter)."""
    return "{" + ",".join(map(str, ids)) + "}"


class ClaimOps(SyncRunner):
    def claim(
        self,
        worker: str,
        queues: Sequence[str] = ("default",),
        max_jobs: int = 1,
        lease: float | timedelta = 30.0,
        kind_limits: Mapping[str, int] | None = None,
        *,
        conn: SyncConn | None = None,
    ) -> list[ClaimedJob]:
        """Leases up to ``max_jobs`` due jobs to ``worker`` (``kind_limits``: only these kinds, at most n each)."""
        return self._run(claim_call(worker, queues, max_jobs, lease, kind_limits), conn)

    def next_due_at(self, queues: Sequence[str] = ("default",), *, conn: SyncConn | None = None) -> datetime | None:
        return self._run(next_due_at_call(queues), conn)


class AsyncClaimOps(AsyncRunner):
    async def claim(
        self,
        worker: str,
        queues: Sequence[str] = ("default",),
        max_jobs: int = 1,
        lease: float | timedelta = 30.0,
        kind_limits: Mapping[str, int] | None = None,
        *,
        conn: AsyncConn | None = None,
    ) -> list[ClaimedJob]:
        return await self._run(claim_call(worker, queues, max_jobs, lease, kind_limits), conn)

    async def next_due_at(
        self, queues: Sequence[str] = ("default",), *, conn: AsyncConn | None = None
    ) -> datetime | None:
        return await self._run(next_due_at_call(queues), conn)
