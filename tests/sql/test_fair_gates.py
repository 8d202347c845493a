"""Shared gates for a fair claim's dear reads under a held snapshot (sql/fairness.sql, "Shared gates"): the
count of the queue's active jobs, the look for ungrouped work and the discovery sweep. A session whose read
proved dear closes the read's gate (a sequence) for every session, so one session pays each read per period,
not every session: a claimer that claims now and then no longer pays one in every few claims.

Counted without timers: index entries a claim was handed (pg_stat_get_xact_tuples_returned). The sleeps only
age what a session kept, the way pgjobs.fair_count_every measures it.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.fair import claim_entries, work
from tests.helpers.foundation import call, held_snapshot

Conn = psycopg.Connection[Any]

GROUPS = 20
PER_CLAIM = 10
CLAIMS = 300  # 3,000 jobs claimed and completed under the held snapshot


def _entries(conn: Conn) -> tuple[int, int]:
    """Entries of jobs_active_idx and jobs_pending_idx (live or dead) one fair claim of one job was handed."""
    (active, pending), got = claim_entries(conn, "jobs_active_idx", "jobs_pending_idx")
    assert len(got) == 1
    return active, pending


def _setup(conn: Conn) -> None:
    call(conn, "configure_queue", queue="q", fair=True)
    call(conn, "enqueue_many", jobs=[{"kind": "k", "queue": "q", "group_key": f"g{i % GROUPS}"} for i in range(6000)])


def test_a_count_one_session_paid_spares_the_others_while_its_gate_is_closed(
    conn: Conn, connect: ConnectFactory
) -> None:
    """Under a held snapshot a session's count that proved dear closes the count's gate: another session,
    whose own count is older than it keeps for itself, reuses it instead of passing every dead entry again,
    until its count is 30 x pgjobs.fair_count_every old; with the gate open it counts at once."""
    _setup(conn)
    conn.execute("SET pgjobs.fair_count_every = 30")  # its dear count closes the gate for 60 s (the most)
    other = connect()
    other.execute("SET pgjobs.fair_count_every = 0.1")  # keeps its own count 0.1 s, reuses it for 3 s
    with held_snapshot(connect):
        assert work(conn, CLAIMS, PER_CLAIM) == CLAIMS * PER_CLAIM
        counted, _ = _entries(other)  # nothing kept yet: it counts, and the count proved dear
        assert counted >= CLAIMS * PER_CLAIM, counted
        assert work(conn, 1, PER_CLAIM) == PER_CLAIM
        conn.execute("SELECT set_config('pgjobs.fair_kept', '', false)")
        assert work(conn, 1, PER_CLAIM) == PER_CLAIM  # counts again, dear: the gate is closed for 60 s
        time.sleep(0.2)  # the other session's own count is too old to serve by itself
        reused, _ = _entries(other)
        assert reused <= 10, (reused, counted)
        time.sleep(3.0)  # now too old to reuse at all, gate or not
        again, _ = _entries(other)
        assert again >= CLAIMS * PER_CLAIM, again
        other.execute("SELECT setval('pgjobs.fair_gate_a', 1)")  # the gate open (as after its time)
        time.sleep(0.2)
        opened, _ = _entries(other)
        assert opened >= CLAIMS * PER_CLAIM, opened


def test_a_session_whose_own_count_is_too_old_reuses_the_newest_count_another_session_wrote(
    conn: Conn, connect: ConnectFactory
) -> None:
    """A dear count is also written to fair_counts: while the gate is closed, a session whose own count is
    past 30 x pgjobs.fair_count_every reuses that one instead of counting past every dead entry again (a
    session claiming now and then counted every 30 s, the soak probe's p99). Its rows are insert-only."""
    _setup(conn)
    conn.execute("SET pgjobs.fair_count_every = 30")
    other = connect()
    other.execute("SET pgjobs.fair_count_every = 0.1")  # its own count serves 0.1 s, is reused up to 3 s
    with held_snapshot(connect):
        assert work(conn, CLAIMS, PER_CLAIM) == CLAIMS * PER_CLAIM
        counted, _ = _entries(other)
        assert counted >= CLAIMS * PER_CLAIM, counted
        time.sleep(3.2)  # its own count is now too old to reuse at all
        conn.execute("SELECT set_config('pgjobs.fair_kept', '', false)")
        assert work(conn, 1, PER_CLAIM) == PER_CLAIM  # counts (dear), closes the gate, writes its count
        reused, _ = _entries(other)
        assert reused <= 10, (reused, counted)
        rows = conn.execute("SELECT count(*) FROM pgjobs.fair_counts WHERE queue = 'q'").fetchone()
        assert rows is not None and rows[0] >= 2, rows  # the other's count and this one, each a row


def test_a_session_whose_last_count_was_dear_closes_the_gate_before_it_counts_again(
    conn: Conn, connect: ConnectFactory
) -> None:
    """Once a gate's time is up, the next claim to count closes it before counting (for
    pgjobs.fair_count_every seconds), so that the claims starting while it counts skip the count instead of
    each paying it too: here the count then proves cheap (no snapshot held any more), and the gate is
    closed all the same. The gate opens to every session alike: none goes first."""
    _setup(conn)
    with held_snapshot(connect):
        assert work(conn, CLAIMS, PER_CLAIM) == CLAIMS * PER_CLAIM
        conn.execute("SELECT set_config('pgjobs.fair_kept', '', false)")
        assert work(conn, 1, PER_CLAIM) == PER_CLAIM  # a dear count: kept, the gate closed
    kept = conn.execute("SELECT current_setting('pgjobs.fair_kept')::jsonb ? 'a q'").fetchone()
    assert kept is not None and kept[0]
    conn.execute("VACUUM pgjobs.jobs_live")  # the next count is cheap: it closes nothing after it
    conn.execute("SELECT setval('pgjobs.fair_gate_a', 1)")  # the gate's time up
    time.sleep(1.1)  # this session's own count too old (pgjobs.fair_count_every: 1 s)
    closed = "SELECT pgjobs._fair_gate_closed('a', 'q')"
    assert not conn.execute(closed).fetchone()[0]  # type: ignore[index]
    counted, _ = _entries(conn)
    assert counted < 1000, counted
    assert conn.execute(closed).fetchone()[0]  # type: ignore[index]


def test_the_look_for_ungrouped_work_one_session_paid_is_skipped_by_the_others(
    conn: Conn, connect: ConnectFactory
) -> None:
    """The 8th claim's look for ungrouped work walks jobs_pending_idx past every job claimed since the held
    snapshot. Once one session's look proved dear, the others' 8th claims skip it too while its gate is
    closed (what the look finds is shared: fair_queues), and look again once it is open."""
    call(conn, "configure_queue", queue="q", fair=True)
    (u,) = call(conn, "enqueue", kind="k", queue="q")  # ungrouped, claimed before the snapshot
    call(conn, "enqueue_many", jobs=[{"kind": "k", "queue": "q", "group_key": f"g{i % GROUPS}"} for i in range(5000)])
    taken = call(connect(), "claim", worker="x", queues=["q"], max_jobs=1)
    assert [r["id"] for r in taken] == [u["id"]]
    conn.execute("SET pgjobs.fair_count_every = 30")
    with held_snapshot(connect):
        assert work(conn, CLAIMS, PER_CLAIM) == CLAIMS * PER_CLAIM
        _ = [_entries(conn) for _ in range(16)]  # its 8th claims looked (dear): the gate is closed
        other = connect()
        other.execute("SET pgjobs.fair_count_every = 0.001")  # nothing it keeps itself serves its next claim
        _entries(other)  # (its first claim keeps nothing yet: it would look whatever the gate says)
        skipped = [_entries(other)[1] for _ in range(16)]  # two 8th claims among them
        assert max(skipped) <= 100, skipped
        other.execute("SELECT setval('pgjobs.fair_gate_u', 1)")
        looked = [_entries(other)[1] for _ in range(16)]
        assert max(looked) >= CLAIMS * PER_CLAIM, looked


@pytest.mark.smoke  # (on PostgreSQL 18 too: hashtext, pg_sequence_last_value, the bit arithmetic)
def test_a_gate_holds_only_for_its_read_and_queue_and_for_ten_minutes_at_most(conn: Conn) -> None:
    """What a gate says: closed for the read and the queue it was closed for, for the time asked (at most
    60 s), never shortened (a shorter close leaves it, a longer one moves its end later), open to every
    session alike once its time is up, and a value further ahead than 10 minutes (which no claim writes)
    is taken as open."""

    def closed(kind: str, queue: str) -> bool:
        return bool(conn.execute("SELECT pgjobs._fair_gate_closed(%s, %s)", [kind, queue]).fetchone()[0])  # type: ignore[index]

    def close(kind: str, queue: str, seconds: float) -> None:
        conn.execute("SELECT pgjobs._fair_gate_close(%s, %s, %s::numeric)", [kind, queue, seconds])

    assert not closed("a", "q")
    close("a", "q", 30)
    assert closed("a", "q")
    assert not closed("a", "other") and not closed("u", "q") and not closed("s", "q")
    close("a", "q", 0.001)  # shorter: the gate stays closed as it was
    time.sleep(0.01)
    assert closed("a", "q")
    close("a", "other", 0.001)  # another queue's close replaces it (one queue per gate)
    assert not closed("a", "q")
    close("u", "q", 0.001)  # its time up, the gate is open to every session (none goes first)
    time.sleep(0.01)
    assert not closed("u", "q")

    def until(kind: str) -> float:
        end = "to_timestamp((last_value >> 20) / 1000.0 + 1577836800)"
        sql = f"SELECT extract(epoch FROM {end} - clock_timestamp())::float8 FROM pgjobs.fair_gate_{kind}"
        return float(conn.execute(sql).fetchone()[0])  # type: ignore[arg-type,index]

    close("s", "q", 3600)  # asked for an hour: 60 s
    assert 55 <= until("s") <= 61
    close("u", "q", 2)
    close("u", "q", 20)  # longer: its end moves later
    assert 15 <= until("u") <= 21
    close("u", "q", 2)  # shorter: left as it was
    assert 15 <= until("u") <= 21
    far = ((int(time.time()) - 1577836800 + 3600) * 1000) << 20
    assert closed("s", "q")
    conn.execute(
        "SELECT setval('pgjobs.fair_gate_s', %s::bigint | (hashtext('q') & 1048575)::bigint)", [far]
    )  # an hour ahead, as only the owner could write it
    assert not closed("s", "q")


def test_when_a_gate_ends_the_session_that_claims_most_reads_first(conn: Conn) -> None:
    """Past its end a gate stays closed to a session for ten times the time since its previous claim of the
    queue (at most twice pgjobs.fair_count_every; pgjobs.fair_count_every for a session that has not claimed
    it yet): a worker that claims every few ms reads at once, a probe that claimed a while ago leaves the read
    to it."""

    def kept_after_claiming(seconds_ago: float | None) -> Any:
        if seconds_ago is None:
            conn.execute("SELECT set_config('pgjobs.fair_hint', '{}', false)")
        else:
            conn.execute(
                "SELECT set_config('pgjobs.fair_hint', jsonb_build_object('q', jsonb_build_array(0, 0,"
                " extract(epoch FROM clock_timestamp()) - %s::numeric))::text, false)",
                [seconds_ago],
            )
        return conn.execute("SELECT pgjobs._fair_kept('u q')").fetchone()[0]  # type: ignore[index]

    conn.execute("SELECT pgjobs._fair_gate_close('u', 'q', 0.05)")
    time.sleep(0.1)  # ended 50 ms ago
    assert kept_after_claiming(2.0) == []  # (skipped: closed to it for two seconds more)
    assert kept_after_claiming(None) == []  # (for one)
    assert kept_after_claiming(0.001) is None  # read
    time.sleep(1.0)
    assert kept_after_claiming(None) is None  # a second past the end
    assert kept_after_claiming(0.05) is None  # (half a second of grace)
    assert kept_after_claiming(2.0) == []
    time.sleep(1.0)
    assert kept_after_claiming(2.0) is None  # two seconds past the end: open to every session


def _new_key_entries(conn: Conn) -> tuple[int, list[dict[str, Any]]]:
    """Entries of group_cursors_new_key (the never-served cursors, live or dead) one claim of one job was
    handed, and what it claimed (completed at once)."""
    (n,), got = claim_entries(conn, "group_cursors_new_key", worker="w", complete=True)
    return n, got


@pytest.mark.smoke
def test_the_look_for_never_served_cursors_runs_only_when_one_may_have_been_created(
    conn: Conn, connect: ConnectFactory
) -> None:
    """Under a held snapshot every group that came and went leaves a dead entry in group_cursors_new_key,
    and the look for never-served cursors passed them all on every claim. A claim now looks only when a
    cursor was created since its last look found none (the sequence fair_cursor_epoch) or that look is a
    second old; a group created by another session's claim still goes first at this session's next claim."""
    _setup(conn)
    with held_snapshot(connect):
        for i in range(300):  # groups that come (a never-served cursor) and go (served, then dry)
            call(conn, "enqueue", kind="k", queue="q", group_key=f"n{i}")
            _new_key_entries(conn)
        assert work(conn, 3, PER_CLAIM) == 3 * PER_CLAIM  # the last of them served too
        _new_key_entries(conn)  # nothing created since: its look found none
        quiet, _ = _new_key_entries(conn)
        conn.execute("SELECT set_config('pgjobs.fair_unserved', '', false)")  # as a session that never looked
        looked, _ = _new_key_entries(conn)
        assert quiet <= 2 and looked >= 300, (quiet, looked)

        other = connect()
        (late,) = call(other, "enqueue", kind="other", queue="q", group_key="late")
        # the other session's claim registers the new group (a never-served cursor) but takes only kind k
        assert call(other, "claim", worker="x", queues=["q"], max_jobs=1, kind_limits={"k": 1})
        _, got = _new_key_entries(conn)
        assert [r["id"] for r in got] == [late["id"]]  # never served: first


def test_a_never_served_cursor_a_look_missed_goes_first_within_a_second(conn: Conn, connect: ConnectFactory) -> None:
    """The race the sequence leaves open: a claim that created a cursor drew its nextval before this session
    read the sequence and committed after this session's look. This session then skips the look, but for a
    second at most: the cursor goes first then, late, never lost."""
    _setup(conn)
    assert work(conn, 2, PER_CLAIM) == 2 * PER_CLAIM  # every group served; the last look found none
    other = connect()
    (late,) = call(other, "enqueue", kind="other", queue="q", group_key="late")
    assert call(other, "claim", worker="x", queues=["q"], max_jobs=1, kind_limits={"k": 1})  # registers it
    # as if this session had read the sequence after that nextval and looked before that commit
    conn.execute(
        "SELECT set_config('pgjobs.fair_unserved', jsonb_build_object('q', jsonb_build_array("
        " (SELECT last_value FROM pgjobs.fair_cursor_epoch), extract(epoch FROM clock_timestamp())))::text, false)"
    )
    _, got = _new_key_entries(conn)
    assert [r["id"] for r in got] != [late["id"]]  # skipped: the look is under a second old
    time.sleep(1.1)
    _, got = _new_key_entries(conn)
    assert [r["id"] for r in got] == [late["id"]]  # looked again: never served, first
