"""The walk of a fair claim under a held snapshot: its end (sql/fairness.sql, _fair_finish) gives groups
stamped ahead but not picked their old place back, and stamps the picked groups a take-again served. Both
found the cursor by its group in a join with the groups; planned generic on a table whose statistics said it
was empty (a VACUUM under the hold can leave reltuples at 0), that join walked the index entries of every
version of every cursor of the queue, once per group: 10-12 s a claim in the ten-minute fair soak, the worker
stalled behind it. Also a take-again's head probe (from the group's cursor's floor) and the long sweep of a
claim that came up short (behind the 's' gate). Counted without timers: index entries each call was handed."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.fair import work
from tests.helpers.foundation import call, held_snapshot

Conn = psycopg.Connection[Any]

GROUPS = 20

_VISITS = (
    "SELECT pg_stat_get_xact_tuples_returned('pgjobs.group_cursors_key_idx'::regclass)"
    " + pg_stat_get_xact_tuples_returned('pgjobs.group_cursors_seq_idx'::regclass)"
)
_FINISH = (
    "SELECT pgjobs._fair_finish('q', %(n)s, 0, ARRAY[%(g)s], ARRAY[%(old)s]::bigint[], ARRAY[%(at)s]::timestamptz[],"
    " %(nseq)s::bigint[], ARRAY[false], %(unstamped)s, %(l2)s::text[], %(l2seq)s::bigint[], %(l2pick)s::boolean[],"
    " %(l2wrote)s::boolean[], NULL, false, NULL, false, false, NULL, 0, true, 0)"
)


# (the planner settings _claim_controlled runs the walk under)
_WALK_PLANS = "SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off; SET enable_bitmapscan = off"


def _fill(conn: Conn) -> None:
    """A fair queue q with 9,000 jobs over GROUPS groups; 400 claims of 10 under a held snapshot then leave ~200
    claimed jobs before every group's head and ~200 versions of every cursor."""
    call(conn, "configure_queue", queue="q", fair=True)
    call(conn, "enqueue_many", jobs=[{"kind": "k", "queue": "q", "group_key": f"g{i % GROUPS}"} for i in range(9000)])


def _finish_visits(conn: Conn, group: str, back: bool) -> int:
    """Entries of group_cursors' indexes one _fair_finish call was handed: `back`, a cursor this transaction
    stamped and did not pick (its old place given back); else a picked group whose cursor was not stamped."""
    with conn.transaction(force_rollback=True):
        old, at = conn.execute(
            "SELECT served_seq, last_served_at FROM pgjobs.group_cursors WHERE queue = 'q' AND group_key = %s",
            [group],
        ).fetchone()  # type: ignore[misc]
        new = conn.execute(
            "UPDATE pgjobs.group_cursors SET served_seq = nextval('pgjobs.served_seq_seq')"
            " WHERE queue = 'q' AND group_key = %s RETURNING served_seq",
            [group],
        ).fetchone()[0]  # type: ignore[index]
        before = conn.execute(_VISITS).fetchone()[0]  # type: ignore[index]
        args = {"g": group, "old": old, "at": at}
        if back:
            args |= {"n": 1, "nseq": [new], "unstamped": False, "l2": [], "l2seq": [], "l2pick": [], "l2wrote": []}
        else:
            args |= {"n": 0, "nseq": [None], "unstamped": True, "l2": [group], "l2seq": [new + 1000],
                     "l2pick": [True], "l2wrote": [False]}  # fmt: skip
        conn.execute(_FINISH, args)
        return int(conn.execute(_VISITS).fetchone()[0] - before)  # type: ignore[index]


@pytest.mark.parametrize("back", [True, False], ids=["place-given-back", "take-again-stamped"])
def test_the_end_of_a_walked_claim_finds_each_cursor_from_its_group(
    conn: Conn, connect: ConnectFactory, back: bool
) -> None:
    _fill(conn)
    with held_snapshot(connect):
        assert work(conn, 400, 10) == 4000  # ~200 versions of every cursor, all kept
        conn.execute("UPDATE pg_class SET reltuples = 0 WHERE oid = 'pgjobs.group_cursors'::regclass")
        other = connect()
        other.execute("SET plan_cache_mode = force_generic_plan")  # (as a long-lived session's plans end up)
        visits = [_finish_visits(other, f"g{i}", back) for i in range(3)]
    # back: the version this transaction stamped, one index entry (before: 4,021 and more, the queue's); else the
    # picked group's newest stamp first (before: one walk of that group's ~200 versions, 202; two before that, 404)
    assert max(visits) <= 5, visits


_TAKE_AGAIN = (
    "SELECT t.v_id FROM pgjobs._fair_take_again('q', %(g)s, NULL, '{}', NULL, 1, 1, 1, 0, '{}', '{}', '{}', '{}',"
    " '{}', '{}') AS t"
)
_LOCK_HEADS = (
    "SELECT (t.l1_lid)[1] FROM pgjobs._fair_lock_heads('q', 1, 1, NULL, '{}', NULL, ARRAY[%(g)s],"
    " ARRAY[(SELECT c.ctid FROM pgjobs.group_cursors AS c WHERE c.queue = 'q' AND c.group_key = %(g)s)],"
    " '{f}', '{f}', '{NULL}', '{NULL}', '{NULL}', '{NULL}', '{NULL}', '{}') AS t"
)
_SET_FLOOR = """
UPDATE pgjobs.group_cursors AS c
   SET floor_priority = h.priority, floor_run_at = h.run_at, floor_id = h.id,
       floor_epoch = coalesce(pg_sequence_last_value('pgjobs.claim_floor_epoch'), 0),
       floor_until = now() + %s::interval
  FROM (SELECT j.priority, j.run_at, j.id FROM pgjobs.jobs AS j
         WHERE j.state = 'pending' AND j.queue = 'q' AND j.group_key = %s
         ORDER BY j.priority, j.run_at, j.id LIMIT 1) AS h
 WHERE c.queue = 'q' AND c.group_key = %s
RETURNING h.id
"""

_NO_HINT = "SELECT set_config('pgjobs.fair_hint', '{}', false)"
_CLAIMED_A_SECOND_AGO = (
    "SELECT set_config('pgjobs.fair_hint',"
    " jsonb_build_object('q', jsonb_build_array(0, 0, extract(epoch FROM clock_timestamp()) - 1))::text, false)"
)


@pytest.mark.parametrize("probe", [_TAKE_AGAIN, _LOCK_HEADS], ids=["take-again", "lock-heads"])
def test_the_walk_probes_a_group_from_its_cursors_floor(conn: Conn, connect: ConnectFactory, probe: str) -> None:
    """The walk's head locks (a run of the ring) and its take-again (a group picked again), in a session without
    a floor of its own for the group, probe the group's head from the floor in its cursor while that holds, not
    from the front past every job of the group claimed under the held snapshot (jobs_group_idx entries the call
    was handed). Before, the head locks did: 6-8.5 s a walk ten minutes into the fair soak's hold."""
    _fill(conn)
    with held_snapshot(connect):
        assert work(conn, 400, 10) == 4000  # ~200 claimed jobs of every group before its head
        held = conn.execute(_SET_FLOOR, ["1 minute", "g1", "g1"]).fetchone()[0]  # type: ignore[index]
        conn.execute(_SET_FLOOR, ["-1 second", "g2", "g2"])  # a floor past its end: from the front
        conn.execute(_SET_FLOOR, ["-1 second", "g3", "g3"])  # the same, to a session that claims now and then
        other = connect()  # (under _claim_controlled's planner settings, as the walk calls it)
        other.execute(_WALK_PLANS)
        visits = "SELECT pg_stat_get_xact_tuples_returned('pgjobs.jobs_group_idx'::regclass)"
        seen: dict[str, tuple[int, int]] = {}
        for group in ("g1", "g2", "g3"):
            # g3: its previous claim of the queue a second ago (its hint): the floor holds for it two seconds
            # past its end (_fair_grace), the safety net left to a session that claims more
            other.execute(_CLAIMED_A_SECOND_AGO if group == "g3" else _NO_HINT)
            with other.transaction(force_rollback=True):
                before = other.execute(visits).fetchone()[0]  # type: ignore[index]
                got = other.execute(probe, {"g": group}).fetchone()[0]  # type: ignore[index]
                seen[group] = (got, other.execute(visits).fetchone()[0] - before)  # type: ignore[index]
    assert seen["g1"][0] == held
    assert seen["g1"][1] <= 10, seen  # from the floor (before: from the front, as g2 below)
    assert seen["g2"][1] >= 150, seen
    assert seen["g3"][1] <= 10, seen  # (before the grace: from the front, as g2)


def test_the_long_sweep_of_a_claim_that_came_up_short_waits_for_the_gate(conn: Conn, connect: ConnectFactory) -> None:
    """The walk's sweep of 256 groups (a quiet claim that came up short) passes every job each group without a
    cursor had claimed under a held snapshot (groups that ran dry lost theirs, and their work came back without a
    new job); once one proved dear, the next wait for the 's' gate, in this session and in another that keeps
    reads (jobs_group_idx entries each call was handed; the cursors are dropped again before each call)."""
    _fill(conn)
    other = connect()
    with held_snapshot(connect):
        assert work(conn, 400, 10) == 4000
        assert work(other, 1, 1) == 1  # its count of the active jobs proved dear: it keeps reads
        conn.execute("SELECT set_config('pgjobs.fair_kept', '', false)")  # what its claims kept: forgotten
        sweep = "SELECT * FROM pgjobs._fair_sweep('q', false, 256, NULL, false, false)"
        visits = "SELECT pg_stat_get_xact_tuples_returned('pgjobs.jobs_group_idx'::regclass)"
        seen = []
        for session in (conn, other, conn):
            session.execute("SET pgjobs.fair_count_every = 60")
            conn.execute("DELETE FROM pgjobs.fair_groups WHERE queue = 'q'")
            conn.execute("DELETE FROM pgjobs.group_cursors WHERE queue = 'q'")
            with session.transaction():
                before = session.execute(visits).fetchone()[0]  # type: ignore[index]
                session.execute(sweep)
                seen.append(session.execute(visits).fetchone()[0] - before)  # type: ignore[index]
    assert seen[0] >= 4000, seen  # the first: ~200 claimed jobs of each of the 20 groups
    assert seen[1:] == [0, 0], seen


def test_the_end_of_a_walk_passes_over_a_cursor_another_claim_holds(conn: Conn, connect: ConnectFactory) -> None:
    """A picked group whose cursor another claim holds is left to it, and finding that out reads the newest
    version only: a lock skipped within the scan by group went on through every older version (index entries
    of group_cursors the call was handed; the cursor's stamp stays as it was)."""
    _fill(conn)
    stamp = "SELECT served_seq FROM pgjobs.group_cursors WHERE queue = 'q' AND group_key = 'g1'"
    with held_snapshot(connect):
        assert work(conn, 400, 10) == 4000  # ~200 versions of every cursor, all kept
        holder, other = connect(), connect()
        other.execute(_WALK_PLANS)
        old = conn.execute(stamp).fetchone()[0]  # type: ignore[index]
        with holder.transaction():
            holder.execute(stamp + " FOR UPDATE")
            with other.transaction():
                before = other.execute(_VISITS).fetchone()[0]  # type: ignore[index]
                other.execute(
                    _FINISH,
                    {"g": "g1", "old": old, "at": None, "n": 0, "nseq": [None], "unstamped": True, "l2": ["g1"],
                     "l2seq": [old + 1000], "l2pick": [True], "l2wrote": [False]},
                )  # fmt: skip
                visits = other.execute(_VISITS).fetchone()[0] - before  # type: ignore[index]
        assert conn.execute(stamp).fetchone()[0] == old
    assert visits <= 5, visits


_TAKE_U = (
    "SELECT t.v_id, t.u_out FROM pgjobs._fair_take_ungrouped('q', NULL, '{}', 1, 1, '{}', '{}', '{}', 1, false, false,"
    " 0, NULL, false, NULL, false, false) AS t"
)


def test_the_ungrouped_turn_waits_for_the_look_gate(conn: Conn, connect: ConnectFactory) -> None:
    """U's turn in the walk (an all-grouped queue: the last look found no ungrouped job) reads the queue's claim
    order from its front, past every job claimed under a held snapshot; while the look is gated, a session
    that keeps reads takes U out instead (jobs_pending_idx entries the call was handed)."""
    _fill(conn)
    with held_snapshot(connect):
        assert work(conn, 400, 10) == 4000
        assert conn.execute("SELECT ungrouped_empty FROM pgjobs.fair_queues WHERE queue = 'q'").fetchone()[0] is True
        visits = "SELECT pg_stat_get_xact_tuples_returned('pgjobs.jobs_pending_idx'::regclass)"
        seen = []
        for gated in (False, True):
            conn.execute("SELECT set_config('pgjobs.fair_kept', '', false), setval('pgjobs.fair_gate_u', 1)")
            if gated:  # a look that proved dear a moment ago: kept, and its gate closed for a minute
                conn.execute("SET pgjobs.fair_count_every = 60")
                conn.execute("SELECT pgjobs._fair_keep('u q', true, clock_timestamp())")
            with conn.transaction(force_rollback=True):
                before = conn.execute(visits).fetchone()[0]  # type: ignore[index]
                got = conn.execute(_TAKE_U).fetchone()
                seen.append((got, conn.execute(visits).fetchone()[0] - before))  # type: ignore[index]
    assert seen[0][1] >= 4000, seen  # from the front, past the claimed jobs
    assert seen[1] == ((None, True), 0), seen


_FLOOR_EMPTY = (
    "SELECT cardinality(pgjobs._fair_floor_empty('q', 0, now() + interval '1 minute', %(o)s::int[], %(t)s::tid[],"
    " %(p)s::smallint[], %(t)s::tid[]))"
)
_SEQ_SCANS = "SELECT coalesce(seq_scan, 0) FROM pg_stat_xact_user_tables WHERE relid = 'pgjobs.group_cursors'::regclass"


def test_the_floors_of_groups_found_empty_are_written_by_ctid(conn: Conn, connect: ConnectFactory) -> None:
    """_fair_floor_empty rewrites the cursors of the groups the fast path found empty from the front by the ctid
    it locked them at: no index entry and no sequential scan of group_cursors, whatever number of dead versions a
    held snapshot keeps (a guard, planned generic on a table whose statistics say it is empty: one call took 7 s
    near the end of a ten-minute fair hold, run M, and this plan is not shown to be why)."""
    _fill(conn)
    with held_snapshot(connect):
        assert work(conn, 400, 10) == 4000  # ~200 versions of every cursor, all kept
        conn.execute("UPDATE pg_class SET reltuples = 0 WHERE oid = 'pgjobs.group_cursors'::regclass")
        other = connect()
        other.execute(_WALK_PLANS)
        with other.transaction(force_rollback=True):
            tids = other.execute(
                "SELECT array_agg(ctid::text ORDER BY group_key) FROM pgjobs.group_cursors WHERE queue = 'q'"
            ).fetchone()[0]  # type: ignore[index]
            before = other.execute(_VISITS).fetchone()[0], other.execute(_SEQ_SCANS).fetchone()[0]  # type: ignore[index]
            n = len(tids)
            written = other.execute(_FLOOR_EMPTY, {"o": list(range(1, n + 1)), "t": tids, "p": [0] * n}).fetchone()
            after = other.execute(_VISITS).fetchone()[0], other.execute(_SEQ_SCANS).fetchone()[0]  # type: ignore[index]
            floored = other.execute("SELECT count(*) FROM pgjobs.group_cursors WHERE floor_until > now()").fetchone()
    assert written == (n,) and floored == (n,) and n == GROUPS
    assert (after[0] - before[0], after[1] - before[1]) == (0, 0), (before, after)
