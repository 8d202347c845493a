"""The discovery sweep of a fair queue (sql/fairness.sql, _discover_groups and _fair_next_group): a skip scan over
the queue's groups that registers those without a cursor. It steps over the groups that have one by their
fair_groups key and reads jobs_group_idx only in the gaps between them: under a held snapshot a step read on the
index alone passed the dead entry of every job the next group had claimed since (a sweep of 16 groups took
0.5-1.2 s in the ten-minute fair soak's hold). Counted without timers: index entries each call was handed."""

from __future__ import annotations

from typing import Any

import psycopg
from conftest import ConnectFactory

from tests.helpers.fair import work
from tests.helpers.foundation import call, held_snapshot

Conn = psycopg.Connection[Any]

GROUPS = 20
_VISITS = "SELECT pg_stat_get_xact_tuples_returned('pgjobs.jobs_group_idx'::regclass)"
_SWEEP = "SELECT met, last_key, added FROM pgjobs._discover_groups('q', %s, %s)"


def _registered(conn: Conn) -> list[str]:
    rows = conn.execute("SELECT group_key FROM pgjobs.fair_groups WHERE queue = 'q' ORDER BY 1").fetchall()
    cursors = conn.execute("SELECT group_key FROM pgjobs.group_cursors WHERE queue = 'q' ORDER BY 1").fetchall()
    assert rows == cursors  # a row in fair_groups for every cursor, and no other
    return [str(r[0]) for r in rows]


def _forget(conn: Conn, *groups: str) -> None:
    """The groups lose their cursor (as when they ran dry), their pending work left where it is."""
    conn.execute("DELETE FROM pgjobs.fair_groups WHERE queue = 'q' AND group_key = ANY(%s)", [list(groups)])
    conn.execute("DELETE FROM pgjobs.group_cursors WHERE queue = 'q' AND group_key = ANY(%s)", [list(groups)])


def _sweep(conn: Conn, after: str | None, steps: int) -> tuple[tuple[int, str | None, int], int]:
    """One sweep: (groups met, the last of them, cursors added) and the jobs_group_idx entries it was handed."""
    with conn.transaction():
        before = conn.execute(_VISITS).fetchone()[0]  # type: ignore[index]
        got = conn.execute(_SWEEP, [after, steps]).fetchone()
        visits = conn.execute(_VISITS).fetchone()[0] - before  # type: ignore[index]
    assert got is not None
    return (int(got[0]), got[1], int(got[2])), int(visits)


def test_a_sweep_steps_over_the_groups_with_a_cursor_without_reading_their_claimed_jobs(
    conn: Conn, connect: ConnectFactory
) -> None:
    """Under a held snapshot, 20 groups with a cursor and ~200 claimed jobs each: a sweep of 16 meets 16 groups
    and is handed no entry of their jobs (before: every claimed job of each, 3,200 and more); a group that lost
    its cursor is read up to its first pending job, and registered."""
    call(conn, "configure_queue", queue="q", fair=True)
    jobs = [{"kind": "k", "queue": "q", "group_key": f"g{i % GROUPS:02}"} for i in range(9000)]
    call(conn, "enqueue_many", jobs=jobs)
    with held_snapshot(connect):
        assert work(conn, 400, 10) == 4000  # ~200 claimed jobs of every group, their dead entries all kept
        assert len(_registered(conn)) == GROUPS
        (met, last, added), visits = _sweep(conn, None, 16)
        assert (met, last, added) == (16, "g15", 0)
        assert visits <= 16, visits
        (met, last, added), visits = _sweep(conn, "g15", 16)
        assert (met, last, added) == (4, "g19", 0)  # ran out of groups: the next sweep starts from the first
        assert visits <= 16, visits

        _forget(conn, "g03")
        (met, last, added), visits = _sweep(conn, None, 16)
        assert (met, last, added) == (16, "g15", 1)
        assert "g03" in _registered(conn)
        # g03's claimed jobs (its first pending job is behind them), and no other group's
        assert 150 <= visits <= 300, visits


def test_a_sweep_finds_every_group_without_a_cursor_wherever_its_key_falls(conn: Conn) -> None:
    """Groups without a cursor before the first group that has one (the empty key too), between two, and after
    the last, with work pending: a sweep of the queue meets each group once, in key order, registers those
    without a cursor, and resumes after the last it met."""
    call(conn, "configure_queue", queue="q", fair=True)
    call(conn, "enqueue_many", jobs=[{"kind": "k", "queue": "q", "group_key": k} for k in ["b", "d"]])
    assert _sweep(conn, None, 16)[0] == (2, "d", 2)
    assert _registered(conn) == ["b", "d"]
    call(conn, "enqueue_many", jobs=[{"kind": "k", "queue": "q", "group_key": k} for k in ["", "a", "c", "e", "f"]])

    assert _sweep(conn, None, 3)[0] == (3, "b", 2)  # '' and a registered, b met
    assert _sweep(conn, "b", 3)[0] == (3, "e", 2)  # c and e registered, d met
    assert _sweep(conn, "e", 3)[0] == (1, "f", 1)  # f registered: the groups ran out
    assert _registered(conn) == ["", "a", "b", "c", "d", "e", "f"]
    assert _sweep(conn, None, 16)[0] == (7, "f", 0)  # all met, none added
