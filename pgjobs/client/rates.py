"""Rate limits: ``pgjobs.configure_rate_limit`` and ``pgjobs.list_rate_limits`` (sql/rate_limits.sql).

A key's limit caps the starts of the jobs enqueued with that ``rate_key``; a queue's limit (set with
``configure_queue(max_starts=, per=)``) caps the starts of all its jobs. Both are exact across every worker:
the claim that takes a job takes its token in the same transaction.
"""

from __future__ import annotations

from datetime import timedelta

from pgjobs.client._call import AsyncConn, AsyncRunner, Call, SyncConn, SyncRunner
from pgjobs.records import RateLimit


def _interval(per: float | timedelta | None) -> timedelta | None:
    return timedelta(seconds=per) if isinstance(per, int | float) else per


def configure_rate_limit_call(
    key: str, max_starts: int, per: float | timedelta | None = None, burst: int = 0
) -> Call[RateLimit | None]:
    return Call(
        "SELECT * FROM pgjobs.configure_rate_limit(key => %(key)s, max_starts => %(max_starts)s,"
        " per => %(per)s::interval, burst => %(burst)s)",
        {"key": key, "max_starts": max_starts, "per": _interval(per), "burst": burst},
        lambda rows: RateLimit.from_row(rows[0]) if rows and rows[0]["key"] is not None else None,
    )


def rate_limits_call() -> Call[list[RateLimit]]:
    return Call(
        "SELECT * FROM pgjobs.list_rate_limits()", {}, lambda rows: [RateLimit.from_row(r) for r in rows], read=True
    )


def rate_limited_call(queues: list[str]) -> Call[bool]:
    """Whether a rate limit may hold back jobs of ``queues`` (a key's limit, or one of theirs): a worker then
    re-reads its next due time after a claim that came back short (runtime/listener.py)."""
    return Call(
        "SELECT EXISTS (SELECT 1 FROM pgjobs.list_rate_limits() AS l"
        " WHERE l.scope = 'key' OR l.key = ANY (%(queues)s::text[]))",
        {"queues": queues},
        lambda rows: bool(rows and next(iter(rows[0].values()))),
        read=True,
    )


class RateOps(SyncRunner):
    def configure_rate_limit(
        self,
        key: str,
        max_starts: int,
        per: float | timedelta | None = None,
        *,
        burst: int = 0,
        conn: SyncConn | None = None,
    ) -> RateLimit | None:
        """At most ``max_starts`` starts of the jobs whose ``rate_key`` is ``key`` in any window of ``per``
        (seconds or a timedelta), plus ``burst``, across every worker; ``max_starts=0`` removes the limit
        (returns None)."""
        return self._run(configure_rate_limit_call(key, max_starts, per, burst), conn)

    def rate_limits(self, *, conn: SyncConn | None = None) -> list[RateLimit]:
        """Every limit, keys' and queues', with its tokens now and its next token's time."""
        return self._run(rate_limits_call(), conn)


class AsyncRateOps(AsyncRunner):
    async def configure_rate_limit(
        self,
        key: str,
        max_starts: int,
        per: float | timedelta | None = None,
        *,
        burst: int = 0,
        conn: AsyncConn | None = None,
    ) -> RateLimit | None:
        return await self._run(configure_rate_limit_call(key, max_starts, per, burst), conn)

    async def rate_limits(self, *, conn: AsyncConn | None = None) -> list[RateLimit]:
        return await self._run(rate_limits_call(), conn)
