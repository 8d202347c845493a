"""Dropping a dry group's cursor (_forget_group, sql/fairness.sql) under a held snapshot: its checks pass every
dead entry of the group's claimed jobs and of the queue's completed ones, so once a call proved dear the session
keeps the cursors of served groups for a while, and still checks never-served ones (while one exists the fast
path does not run). Deterministic: which cursors are left, no timings."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from conftest import ConnectFactory

from tests.helpers.fair import work
from tests.helpers.foundation import call, held_snapshot

Conn = psycopg.Connection[Any]

_CURSORS = (
    "SELECT group_key, served_seq > 0 FROM pgjobs.group_cursors"
    " WHERE queue = 'q' AND group_key IN ('A', 'B', 'N') ORDER BY 1"
)


def _dry_groups(conn: Conn) -> None:
    """Cursors of groups without a job: A and B served once, N registered and never served (as a group whose
    only job went before a claim served it). Written here, not by claims: a claim that meets a dry cursor
    would drop it itself."""
    conn.execute(
        "INSERT INTO pgjobs.group_cursors (queue, group_key, served_seq)"
        " VALUES ('q', 'A', nextval('pgjobs.served_seq_seq')), ('q', 'B', nextval('pgjobs.served_seq_seq')),"
        " ('q', 'N', 0)"
    )
    conn.execute("INSERT INTO pgjobs.fair_groups (queue, group_key) VALUES ('q', 'A'), ('q', 'B'), ('q', 'N')")
    conn.execute("SELECT set_config('pgjobs.fair_kept', '', false)")  # what the claims before kept: forgotten
    assert conn.execute(_CURSORS).fetchall() == [("A", True), ("B", True), ("N", False)]


_CHECK_VISITS = (
    "SELECT pg_stat_get_xact_tuples_returned('pgjobs.jobs_group_idx'::regclass)"
    " + pg_stat_get_xact_tuples_returned('pgjobs.jobs_active_idx'::regclass)"
    " + pg_stat_get_xact_tuples_returned('pgjobs.jobs_group_later_idx'::regclass)"
)


def _forget(conn: Conn, group: str) -> int:
    """A call as a claim makes it: under _claim_controlled's planner settings (index scans, generic plans; on a
    table this small the planner would rather read the whole heap, and the checks would visit no index). The
    entries of the jobs' indexes its checks were handed."""
    with conn.transaction():
        conn.execute(
            "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off;"
            " SET LOCAL plan_cache_mode = force_generic_plan"
        )
        before = conn.execute(_CHECK_VISITS).fetchone()[0]  # type: ignore[index]
        conn.execute("SELECT pgjobs._forget_group('q', %s)", [group])
        return int(conn.execute(_CHECK_VISITS).fetchone()[0] - before)  # type: ignore[index]


def test_after_a_dear_forget_served_cursors_stay_for_a_while(conn: Conn, connect: ConnectFactory) -> None:
    """The check that proved dear closes the shared gate for 60 s: served cursors stay, for this session and for
    another that keeps reads (the soak's probe: its count is dear too), until the gate opens; never-served ones
    go."""
    call(conn, "configure_queue", queue="q", fair=True)
    conn.execute("SET pgjobs.fair_count_every = 0.5")
    other = connect()
    other.execute("SET pgjobs.fair_count_every = 0.5")
    with held_snapshot(connect):
        # 1,200 jobs of group C claimed and completed: dead entries the checks pass
        call(conn, "enqueue_many", jobs=[{"kind": "k", "queue": "q", "group_key": "C"} for _ in range(1200)])
        assert work(conn, 24, 50) == 1200
        assert work(other, 1, 1) == 0  # its count of the active jobs proved dear: it keeps reads
        # (what it kept of its own checks, if its claim met C's cursor dry: only the gate may spare it below)
        other.execute(
            "SELECT set_config('pgjobs.fair_kept', (current_setting('pgjobs.fair_kept')::jsonb - 'f q')::text, false)"
        )
        assert other.execute("SELECT current_setting('pgjobs.fair_kept')::jsonb ? 'a q'").fetchone()[0] is True
        _dry_groups(conn)
        assert _forget(conn, "A") >= 1200  # checked (passing them all): dropped, and the gate closes
        assert conn.execute(_CURSORS).fetchall() == [("B", True), ("N", False)]
        # served: kept, by the other session too, and not checked (before: the checks ran all the same, a
        # one-time filter of the delete, 1,200 entries each)
        assert _forget(other, "B") == 0
        assert _forget(conn, "B") == 0
        assert _forget(conn, "N") >= 1200  # never served: checked and dropped all the same
        assert conn.execute(_CURSORS).fetchall() == [("B", True)]
        # closed for 60 s (not pgjobs.fair_count_every: a dropped cursor costs again when its group comes back)
        end = "SELECT ((last_value >> 20) / 1000.0 + 1577836800 - extract(epoch FROM clock_timestamp()))::float8"
        assert 50 <= conn.execute(end + " FROM pgjobs.fair_gate_f").fetchone()[0] <= 61  # type: ignore[index]
        conn.execute("SELECT setval('pgjobs.fair_gate_f', 1)")  # its time up
        deadline = time.monotonic() + 5  # (what this session kept: pgjobs.fair_count_every, as much grace at most)
        while conn.execute(_CURSORS).fetchall() and time.monotonic() < deadline:
            time.sleep(0.2)
            _forget(conn, "B")
        assert conn.execute(_CURSORS).fetchall() == []


def test_without_a_held_snapshot_every_forget_checks(conn: Conn) -> None:
    """Cheap checks keep nothing: each dry group's cursor goes at once, and the session keeps no read."""
    call(conn, "configure_queue", queue="q", fair=True)
    _dry_groups(conn)
    for group in ("A", "B", "N"):
        _forget(conn, group)
    assert conn.execute(_CURSORS).fetchall() == []
    assert conn.execute("SELECT current_setting('pgjobs.fair_kept', true)").fetchone()[0] in (None, "", "{}")


_CURSOR_VISITS = (
    "SELECT sum(pg_stat_get_xact_tuples_returned(i.indexrelid))::bigint FROM pg_index AS i"
    " WHERE i.indrelid = 'pgjobs.group_cursors'::regclass"
)


def test_the_checks_find_the_cursor_by_its_ctid_and_leave_a_held_one(conn: Conn, connect: ConnectFactory) -> None:
    """Under a held snapshot a group's cursor has a version per serve. Finding it reads the newest only (index
    entries of group_cursors the call was handed; by its group the delete walked them all), and a cursor
    another session holds locked stays (it is being served)."""
    call(conn, "configure_queue", queue="q", fair=True)
    _dry_groups(conn)
    with held_snapshot(connect):
        for _ in range(200):  # 200 serves of A and of B: versions the snapshot keeps
            conn.execute(
                "UPDATE pgjobs.group_cursors SET served_seq = nextval('pgjobs.served_seq_seq')"
                " WHERE queue = 'q' AND group_key IN ('A', 'B')"
            )
        fresh = connect()  # (keeps no read: the checks run)
        with fresh.transaction():  # (under the claim's planner settings, as _forget: else a table scan)
            fresh.execute(
                "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off;"
                " SET LOCAL plan_cache_mode = force_generic_plan"
            )
            before = fresh.execute(_CURSOR_VISITS).fetchone()[0]  # type: ignore[index]
            fresh.execute("SELECT pgjobs._forget_group('q', 'A')")
            visits = fresh.execute(_CURSOR_VISITS).fetchone()[0] - before  # type: ignore[index]
        assert ("A", True) not in conn.execute(_CURSORS).fetchall()
        holder = connect()
        with holder.transaction():
            holder.execute("SELECT 1 FROM pgjobs.group_cursors WHERE queue = 'q' AND group_key = 'B' FOR UPDATE")
            _forget(fresh, "B")
            assert ("B", True) in conn.execute(_CURSORS).fetchall()
        _forget(fresh, "B")  # released: dropped
        assert ("B", True) not in conn.execute(_CURSORS).fetchall()
    assert visits <= 5, visits
