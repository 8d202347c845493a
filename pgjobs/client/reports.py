"""Read-only reports over ``pgjobs.jobs`` for the CLI (``pgjobs demo``'s live display and summary, ``pgjobs
queue show``): the SQL text stays in the client layer. Each builder returns a :class:`Call` whose rows are
plain tuples; :func:`run` / :func:`arun` execute one on a connection the caller holds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgjobs.client._call import AsyncConn, Call, Rows, SyncConn

Tuples = list[tuple[Any, ...]]


def _tuples(rows: Rows) -> Tuples:
    # (the rows are dicts: every column has a name of its own, so none is lost)
    return [tuple(r.values()) for r in rows]


def run(conn: SyncConn, call: Call[Any]) -> Any:
    from pgjobs.client._call import SyncRunner

    return call.parse(SyncRunner._fetch(conn, call))


async def arun(conn: AsyncConn, call: Call[Any]) -> Any:
    from pgjobs.client._call import AsyncRunner

    return call.parse(await AsyncRunner._fetch(conn, call))


def state_counts(ids: Sequence[int]) -> Call[Tuples]:
    """(state, jobs) of the jobs ``ids``."""
    return Call(
        "SELECT state::text AS state, count(*)::int AS jobs FROM pgjobs.jobs WHERE id = ANY(%(ids)s) GROUP BY state",
        {"ids": list(ids)},
        _tuples,
    )


def tracked(ids: Sequence[int]) -> Call[Tuples]:
    """(id, kind, state, attempt, progress, checkpoint) of the jobs ``ids``."""
    return Call(
        "SELECT id, kind, state::text AS state, attempt, progress, checkpoint FROM pgjobs.jobs WHERE id = ANY(%(ids)s)",
        {"ids": list(ids)},
        _tuples,
    )


def kind_summary(ids: Sequence[int]) -> Call[Tuples]:
    """(kind, state, jobs, attempts, errors) of the jobs ``ids``."""
    return Call(
        "SELECT kind, state::text AS state, count(*)::int AS jobs, sum(attempt)::int AS attempts,"
        " sum(jsonb_array_length(errors))::int AS errors"
        " FROM pgjobs.jobs WHERE id = ANY(%(ids)s) GROUP BY kind, state ORDER BY kind, state",
        {"ids": list(ids)},
        _tuples,
    )


def span(ids: Sequence[int]) -> Call[tuple[Any, ...] | None]:
    """(seconds from the first enqueue to the last completion, jobs that needed more than one attempt)."""
    return Call(
        "SELECT extract(epoch FROM max(completed_at) - min(created_at))::float8 AS seconds,"
        " count(*) FILTER (WHERE attempt > 1)::int AS retried"
        " FROM pgjobs.jobs WHERE id = ANY(%(ids)s) AND first_started_at IS NOT NULL",
        {"ids": list(ids)},
        lambda rows: _tuples(rows)[0] if rows else None,
    )


def first_failed(ids: Sequence[int]) -> Call[tuple[Any, ...] | None]:
    """(kind, last_error) of the first failed job among ``ids``."""
    return Call(
        "SELECT kind, last_error FROM pgjobs.jobs WHERE id = ANY(%(ids)s) AND state = 'failed' ORDER BY id LIMIT 1",
        {"ids": list(ids)},
        lambda rows: _tuples(rows)[0] if rows else None,
    )


def queue_live(queues: Sequence[str]) -> Call[Tuples]:
    """(queue, pending, active, groups in the fair ring) per queue."""
    return Call(
        "SELECT q.queue,"
        " (SELECT count(*) FROM pgjobs.jobs AS j WHERE j.state = 'pending' AND j.queue = q.queue) AS pending,"
        " (SELECT count(*) FROM pgjobs.jobs AS j WHERE j.state = 'active' AND j.queue = q.queue) AS active,"
        " (SELECT count(*) FROM pgjobs.fair_ring_groups(q.queue) AS g WHERE g.group_key IS NOT NULL) AS groups"
        " FROM unnest(%(queues)s::text[]) AS q(queue)",
        {"queues": list(queues)},
        _tuples,
    )
