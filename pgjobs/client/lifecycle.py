"""Doing work: the lease-token compare-and-set calls a worker makes (sql/lifecycle.sql).

Every call returns False/None when the token no longer holds the job: a benign outcome.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, LiteralString
from uuid import UUID

from pgjobs.client._call import AsyncConn, AsyncRunner, Call, SyncConn, SyncRunner, interval, jsonb, scalar
from pgjobs.records import JobState, Renewed


def _state(rows: list[dict[str, Any]]) -> JobState | None:
    value = scalar(rows)
    return None if value is None else JobState(value)


def renew_lease_call(id: int, lease_token: UUID, lease: float | timedelta = 30.0) -> Call[bool]:
    return Call(
        "SELECT pgjobs.renew_lease(id => %(id)s, lease_token => %(tok)s, lease => %(lease)s)",
        {"id": id, "tok": lease_token, "lease": interval(lease)},
        scalar,
    )


def renew_leases_call(ids: Sequence[int], tokens: Sequence[UUID], lease: float | timedelta) -> Call[list[Renewed]]:
    return Call(
        "SELECT * FROM pgjobs.renew_leases(ids => %(ids)s::bigint[], lease_tokens => %(toks)s::uuid[],"
        " lease => %(lease)s)",
        {"ids": list(ids), "toks": list(tokens), "lease": interval(lease)},
        lambda rows: [Renewed.from_row(r) for r in rows],
    )


def checkpoint_call(id: int, lease_token: UUID | str, checkpoint: Any) -> Call[bool]:
    return Call(
        "SELECT pgjobs.checkpoint(id => %(id)s, lease_token => %(tok)s, checkpoint => %(cp)s)",
        {"id": id, "tok": lease_token, "cp": jsonb(checkpoint)},
        scalar,
    )


def progress_call(id: int, lease_token: UUID | str, progress: Any) -> Call[bool]:
    return Call(
        "SELECT pgjobs.progress(id => %(id)s, lease_token => %(tok)s, progress => %(p)s)",
        {"id": id, "tok": lease_token, "p": jsonb(progress)},
        scalar,
    )


def complete_call(id: int, lease_token: UUID, result: Any = None, continuations: Any = None) -> Call[bool]:
    return Call(
        "SELECT pgjobs.complete(id => %(id)s, lease_token => %(tok)s, result => %(result)s, continuations => %(cont)s)",
        {"id": id, "tok": lease_token, "result": jsonb(result), "cont": jsonb(continuations)},
        scalar,
    )


def complete_many_call(ids: Sequence[int], tokens: Sequence[UUID], results: Sequence[Any] | None = None) -> Call[int]:
    return Call(
        "SELECT pgjobs.complete_many(ids => %(ids)s::bigint[], lease_tokens => %(toks)s::uuid[],"
        " results => %(results)s::jsonb[])",
        {
            "ids": list(ids),
            "toks": list(tokens),
            "results": None if results is None else [jsonb(r) for r in results],
        },
        scalar,
    )


def fail_call(id: int, lease_token: UUID | str, error: str, retry_at: datetime | None = None) -> Call[JobState | None]:
    return Call(
        "SELECT pgjobs.fail(id => %(id)s, lease_token => %(tok)s, error => %(error)s, retry_at => %(retry_at)s)",
        {"id": id, "tok": lease_token, "error": error, "retry_at": retry_at},
        _state,
    )


def dead_letter_call(id: int, lease_token: UUID, error: str) -> Call[bool]:
    return Call(
        "SELECT pgjobs.dead_letter(id => %(id)s, lease_token => %(tok)s, error => %(error)s)",
        {"id": id, "tok": lease_token, "error": error},
        scalar,
    )


def release_call(id: int, lease_token: UUID | str, run_at: datetime | None = None) -> Call[bool]:
    return Call(
        "SELECT pgjobs.release(id => %(id)s, lease_token => %(tok)s, run_at => %(run_at)s)",
        {"id": id, "tok": lease_token, "run_at": run_at},
        scalar,
    )


def ack_cancel_call(id: int, lease_token: UUID | str) -> Call[bool]:
    return Call(
        "SELECT pgjobs.ack_cancel(id => %(id)s, lease_token => %(tok)s)", {"id": id, "tok": lease_token}, scalar
    )


# --- the worker's hot path -----------------------------------------------------------------------
# Prepared statements with positional parameters; arrays go out as array literals (ids "{1,2}", tokens
# "{uuid,uuid}") built with str.join, a fraction of the cost of psycopg's per-element list dumping.

# (ids, lease_tokens): the worker's batched completions without results.
COMPLETE_MANY_SQL: LiteralString = "SELECT pgjobs.complete_many(ids => %s::bigint[], lease_tokens => %s::uuid[])"
# (ids, lease_tokens, results as one JSON array text, null for no result): a jsonb[] parameter would cost a
# jsonb dump per element; one JSON array unnested in order costs one.
COMPLETE_MANY_RESULTS_SQL: LiteralString = (
    "SELECT pgjobs.complete_many(ids => %s::bigint[], lease_tokens => %s::uuid[],"
    " results => ARRAY(SELECT nullif(r.e, 'null'::jsonb) FROM jsonb_array_elements(%s::jsonb)"
    " WITH ORDINALITY AS r(e, n) ORDER BY r.n))"
)
# (ids, lease_tokens, lease interval): rows (id, cancel_requested, renewed) of the jobs still held (renewed false:
# busy in another transaction, not renewed this time).
RENEW_LEASES_SQL: LiteralString = (
    "SELECT id, cancel_requested, renewed FROM pgjobs.renew_leases(ids => %s::bigint[], lease_tokens => %s::uuid[],"
    " lease => %s::interval)"
)


class LifecycleOps(SyncRunner):
    def renew_lease(
        self, id: int, lease_token: UUID, lease: float | timedelta = 30.0, *, conn: SyncConn | None = None
    ) -> bool:
        return self._run(renew_lease_call(id, lease_token, lease), conn)

    def renew_leases(
        self,
        ids: Sequence[int],
        lease_tokens: Sequence[UUID],
        lease: float | timedelta = 30.0,
        *,
        conn: SyncConn | None = None,
    ) -> list[Renewed]:
        """Renews many leases in one round trip; returns the jobs still held (``renewed`` False: busy in
        another transaction, not renewed this time, not lost; ask again). It never waits for a row lock."""
        return self._run(renew_leases_call(ids, lease_tokens, lease), conn)

    def checkpoint(self, id: int, lease_token: UUID, checkpoint: Any, *, conn: SyncConn | None = None) -> bool:
        return self._run(checkpoint_call(id, lease_token, checkpoint), conn)

    def progress(self, id: int, lease_token: UUID, progress: Any, *, conn: SyncConn | None = None) -> bool:
        return self._run(progress_call(id, lease_token, progress), conn)

    def complete(
        self,
        id: int,
        lease_token: UUID,
        result: Any = None,
        continuations: Any = None,
        *,
        conn: SyncConn | None = None,
    ) -> bool:
        return self._run(complete_call(id, lease_token, result, continuations), conn)

    def complete_many(
        self,
        ids: Sequence[int],
        lease_tokens: Sequence[UUID],
        results: Sequence[Any] | None = None,
        *,
        conn: SyncConn | None = None,
    ) -> int:
        return self._run(complete_many_call(ids, lease_tokens, results), conn)

    def fail(
        self,
        id: int,
        lease_token: UUID,
        error: str,
        retry_at: datetime | None = None,
        *,
        conn: SyncConn | None = None,
    ) -> JobState | None:
        return self._run(fail_call(id, lease_token, error, retry_at), conn)

    def dead_letter(self, id: int, lease_token: UUID, error: str, *, conn: SyncConn | None = None) -> bool:
        return self._run(dead_letter_call(id, lease_token, error), conn)

    def release(
        self, id: int, lease_token: UUID, run_at: datetime | None = None, *, conn: SyncConn | None = None
    ) -> bool:
        return self._run(release_call(id, lease_token, run_at), conn)

    def ack_cancel(self, id: int, lease_token: UUID, *, conn: SyncConn | None = None) -> bool:
        return self._run(ack_cancel_call(id, lease_token), conn)


class AsyncLifecycleOps(AsyncRunner):
    async def renew_lease(
        self, id: int, lease_token: UUID, lease: float | timedelta = 30.0, *, conn: AsyncConn | None = None
    ) -> bool:
        return await self._run(renew_lease_call(id, lease_token, lease), conn)

    async def renew_leases(
        self,
        ids: Sequence[int],
        lease_tokens: Sequence[UUID],
        lease: float | timedelta = 30.0,
        *,
        conn: AsyncConn | None = None,
    ) -> list[Renewed]:
        return await self._run(renew_leases_call(ids, lease_tokens, lease), conn)

    async def checkpoint(self, id: int, lease_token: UUID, checkpoint: Any, *, conn: AsyncConn | None = None) -> bool:
        return await self._run(checkpoint_call(id, lease_token, checkpoint), conn)

    async def progress(self, id: int, lease_token: UUID, progress: Any, *, conn: AsyncConn | None = None) -> bool:
        return await self._run(progress_call(id, lease_token, progress), conn)

    async def complete(
        self,
        id: int,
        lease_token: UUID,
        result: Any = None,
        continuations: Any = None,
        *,
        conn: AsyncConn | None = None,
    ) -> bool:
        return await self._run(complete_call(id, lease_token, result, continuations), conn)

    async def complete_many(
        self,
        ids: Sequence[int],
        lease_tokens: Sequence[UUID],
        results: Sequence[Any] | None = None,
        *,
        conn: AsyncConn | None = None,
    ) -> int:
        return await self._run(complete_many_call(ids, lease_tokens, results), conn)

    async def fail(
        self,
        id: int,
        lease_token: UUID,
        error: str,
        retry_at: datetime | None = None,
        *,
        conn: AsyncConn | None = None,
    ) -> JobState | None:
        return await self._run(fail_call(id, lease_token, error, retry_at), conn)

    async def dead_letter(self, id: int, lease_token: UUID, error: str, *, conn: AsyncConn | None = None) -> bool:
        return await self._run(dead_letter_call(id, lease_token, error), conn)

    async def release(
        self, id: int, lease_token: UUID, run_at: datetime | None = None, *, conn: AsyncConn | None = None
    ) -> bool:
        return await self._run(release_call(id, lease_token, run_at), conn)

    async def ack_cancel(self, id: int, lease_token: UUID, *, conn: AsyncConn | None = None) -> bool:
        return await self._run(ack_cancel_call(id, lease_token), conn)
