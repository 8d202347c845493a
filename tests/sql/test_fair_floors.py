"""A fair claim under a held snapshot, what it still read per group (issue 10, item 1): the versions of the
group's cursor (each stamp checked group_cursors' unique key against all of them) and the dead prefix of the
group's claimed jobs on jobs_group_idx. Cursors now carry no unique key in the index a stamp writes
(migrations/deploy/claim.sql: fair_groups decides who creates a group's cursor), and a session
whose head probes proved dear starts them at per-group floors (sql/fairness.sql, "Head floors"). Counted
deterministically: blocks of pgjobs relations one claim fetched, no timings. And the floors hide nothing a
claim must find: more urgent work, work filed with an old run_at, promoted or released work.
"""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.fair import claim_and_complete, claim_entries
from tests.helpers.foundation import call, held_snapshot, vacuum_clean

Conn = psycopg.Connection[Any]

GROUPS = 20
PER_CLAIM = 10

_RELS = """
SELECT c.relname, pg_stat_get_xact_blocks_fetched(c.oid)
  FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace AND n.nspname = 'pgjobs'
 WHERE c.relkind IN ('r', 'i') AND pg_stat_get_xact_blocks_fetched(c.oid) > 0
"""


def _probe(conn: Conn, n: int = PER_CLAIM) -> dict[str, int]:
    """Blocks per pgjobs relation that one fair claim of n jobs fetched."""
    with conn.transaction():
        before = dict(conn.execute(_RELS).fetchall())
        got = call(conn, "claim", worker="probe", queues=["q"], max_jobs=n)
        after = dict(conn.execute(_RELS).fetchall())
        call(conn, "complete_many", ids=[r["id"] for r in got], lease_tokens=[r["lease_token"] for r in got])
    assert len(got) == n
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}


def _setup(conn: Conn, jobs: int = 8000) -> None:
    call(conn, "configure_queue", queue="q", fair=True)
    call(
        conn, "enqueue_many", jobs=[{"kind": "k", "queue": "q", "group_key": f"g{i % GROUPS:02}"} for i in range(jobs)]
    )
    for _ in range(4):
        claim_and_complete(conn, PER_CLAIM)  # every group served: the ring is warm
    _probe(conn)  # the session's plans are cached
    vacuum_clean(conn, "jobs", "group_cursors", "fair_queues")
    # what a session keeps serves it for the whole test (by default for 1 s)
    conn.execute("SET pgjobs.fair_count_every = 3600")


def _floors(conn: Conn) -> dict[str, Any]:
    kept = json.loads(conn.execute("SELECT current_setting('pgjobs.fair_kept', true)").fetchone()[0] or "{}")  # type: ignore[index]
    return kept.get("h q", [None, None, {}])[2]  # type: ignore[no-any-return]


@pytest.mark.smoke  # (PostgreSQL 18 plans the ring read differently: sql/fairness.sql, _fair_fast)
def test_a_fair_claim_reads_no_more_after_thousands_of_jobs_under_a_held_snapshot(
    conn: Conn, connect: ConnectFactory
) -> None:
    """After 4,000 jobs claimed and completed over 20 groups under a held snapshot (200 stamps of every cursor,
    200 dead entries in front of every group's head), one claim of 10 reads what it read when the snapshot was
    taken, give or take a few blocks per relation. Before: the cursors' heap 10 blocks per stamp and group,
    the jobs' heap one per dead entry of every group served (~4,200 blocks against ~300)."""
    _setup(conn)
    with held_snapshot(connect):
        r0 = _probe(conn)
        for _ in range(400):
            claim_and_complete(conn, PER_CLAIM)
        assert len(_floors(conn)) == GROUPS  # the head probes proved dear: the session keeps floors
        r1 = _probe(conn)
    grew = {k: (r0.get(k, 0), v) for k, v in r1.items() if v > r0.get(k, 0) + 2 * PER_CLAIM + 4}
    assert not grew, (sum(r0.values()), sum(r1.values()), grew)
    assert sum(r1.values()) <= sum(r0.values()) + 60, (r0, r1)


def test_work_below_a_head_floor_is_claimed_at_the_next_claim(conn: Conn, connect: ConnectFactory) -> None:
    """With floors kept under a held snapshot, a claim that serves every group still takes a group's work that
    sorts below its floor: a job more urgent than the group's level, a job filed with an old run_at (the claim
    epoch moves), a scheduled job promoted when due, and the queue's work is all claimed in the end."""
    _setup(conn, jobs=4000)
    with held_snapshot(connect):
        for _ in range(200):
            claim_and_complete(conn, PER_CLAIM)
        assert len(_floors(conn)) == GROUPS
        urgent = call(conn, "enqueue", kind="k", queue="q", group_key="g03", priority=-5)[0]["id"]
        got = claim_and_complete(conn, GROUPS)
        assert urgent in [r["id"] for r in got]
        old = call(conn, "enqueue", kind="k", queue="q", group_key="g05", run_at="2020-01-01T00:00:00Z")[0]["id"]
        got = claim_and_complete(conn, GROUPS)
        assert old in [r["id"] for r in got]
        for _ in range(5):
            claim_and_complete(conn, PER_CLAIM)  # floors again
        assert _floors(conn)
        due = call(conn, "enqueue", kind="k", queue="q", group_key="g07", run_at="2020-01-01T00:00:00Z")[0]["id"]
        conn.execute("UPDATE pgjobs.jobs SET state = 'scheduled' WHERE id = %s", [due])  # as if promoted late
        got = claim_and_complete(conn, GROUPS)
        assert due in [r["id"] for r in got]
        while claim_and_complete(conn, 100):
            pass
    left = conn.execute("SELECT count(*) FROM pgjobs.jobs WHERE queue = 'q' AND state = 'pending'").fetchone()
    assert left == (0,)


def test_without_a_held_snapshot_no_floor_is_kept(conn: Conn) -> None:
    """Head probes that visit about what they take keep nothing: the usual claim pays no floor."""
    _setup(conn, jobs=4000)
    for _ in range(100):
        conn.execute("VACUUM pgjobs.jobs_live") if _ % 20 == 0 else None
        claim_and_complete(conn, PER_CLAIM)
    assert _floors(conn) == {}


def test_one_never_served_cursor_a_group_whoever_inserts_it(conn: Conn) -> None:
    """group_cursors has no unique key on (queue, group_key) any more (a stamp would check it against every
    version of the cursor); a second never-served cursor of a group is still refused by the arbiter that the
    previous functions' ON CONFLICT DO NOTHING relies on while an upgrade installs the new ones, and a stamped
    cursor does not enter that index."""
    call(conn, "configure_queue", queue="q", fair=True)
    for _ in range(2):
        conn.execute("INSERT INTO pgjobs.group_cursors (queue, group_key) VALUES ('q', 'a') ON CONFLICT DO NOTHING")
    assert conn.execute("SELECT count(*) FROM pgjobs.group_cursors WHERE group_key = 'a'").fetchone() == (1,)
    conn.execute("UPDATE pgjobs.group_cursors SET served_seq = 7 WHERE group_key = 'a'")
    unique = conn.execute(
        "SELECT count(*) FROM pg_index WHERE indrelid = 'pgjobs.group_cursors'::regclass AND indisunique"
        " AND indpred IS NULL"
    ).fetchone()
    assert unique == (0,)


# A group's floor in its cursor row (sql/fairness.sql, "Head floors"; migrations/deploy/claim.sql):
# set by the claims of a session that keeps floors, read by every session.


def _kinds(n: int) -> dict[str, int]:
    return {"k": n}  # the kind_limits of a worker that runs kind 'k' only


def _claim_kinds(conn: Conn, n: int) -> list[dict[str, Any]]:
    rows = call(conn, "claim", worker="w", queues=["q"], max_jobs=n, kind_limits=_kinds(n))
    if rows:
        call(conn, "complete_many", ids=[r["id"] for r in rows], lease_tokens=[r["lease_token"] for r in rows])
    return rows


def test_a_session_with_no_floor_of_its_own_starts_where_the_group_was_last_served(
    conn: Conn, connect: ConnectFactory
) -> None:
    """A session that claims one job now and then (bench/soak.py's probe) kept no floor of its own and probed
    each group from the front, past the dead entry of every job of the group claimed since (~100 heap blocks a
    claim of one here). The floor in the group's cursor, left there by the worker's last claim of the group,
    is where it starts now: one claim of one reads what it read when the snapshot was taken."""
    _setup(conn)
    probe = connect()
    probe.execute("SET pgjobs.fair_count_every = 3600")  # (its count and sweep, once dear, kept: not measured)
    _probe(probe, 1)  # the session's plans are cached
    with held_snapshot(connect):
        r0 = _probe(probe, 1)
        for _ in range(400):
            _claim_kinds(conn, PER_CLAIM)
        _probe(probe, 1)  # pays the reads it keeps (the active count, the sweep)
        r1 = _probe(probe, 1)
        assert _floors(probe) == {}  # no head floor of its own: the cursor's
    # (the head probe's relations: the claim's other reads, the sweep of every 8th claim, are not this test's)
    head = ("jobs_live", "jobs_group_idx")
    assert sum(r1.get(k, 0) for k in head) <= sum(r0.get(k, 0) for k in head) + 6, (r0, r1)


def test_a_floor_in_a_cursor_hides_no_job_of_another_kind_or_one_another_session_holds(
    conn: Conn, connect: ConnectFactory
) -> None:
    """The floor is the group's first pending job of any kind, locked or not, as the claim that served the group
    last saw it; not that claim's own pick. A worker that runs kind 'k' only passes over g03's job of another
    kind (filed with an old run_at: at the group's front), and over g05's head while another session holds
    its row (then rolls back): a session that claims any kind gets both at its next claim of those groups."""
    _setup(conn, jobs=4000)
    other = call(conn, "enqueue", kind="other", queue="q", group_key="g03", run_at="2020-01-01T00:00:00Z")[0]["id"]
    with held_snapshot(connect):
        for _ in range(200):
            _claim_kinds(conn, PER_CLAIM)
        floors = conn.execute("SELECT count(*) FROM pgjobs.group_cursors WHERE floor_until > now()").fetchone()
        assert floors == (GROUPS,)
        held = connect(autocommit=False)
        head = held.execute(
            "SELECT id FROM pgjobs.jobs WHERE state = 'pending' AND group_key = 'g05'"
            " ORDER BY priority, run_at, id LIMIT 1 FOR UPDATE"
        ).fetchone()[0]
        for _ in range(4):
            _claim_kinds(conn, GROUPS)  # g05 served past its held head, the floors carried on
        held.rollback()
        got = [r["id"] for r in claim_and_complete(connect(), GROUPS, worker="any")]
        assert other in got and head in got, (other, head, got)


def test_a_job_committed_late_below_a_cursors_floor_is_claimed_once_the_floor_runs_out(
    conn: Conn, connect: ConnectFactory
) -> None:
    """What a floor can miss: a producer whose transaction began more than 300 ms before it commits files a job
    below the floor that the group's claims moved on to meanwhile. The floor holds for a while (here about a
    second: pgjobs.fair_count_every), and every claim that probes from it carries it on without making it
    live longer: then the group is probed from the front again, and the job is claimed. Here the group never
    runs dry (a job comes before every claim), so nothing but the floor's end can bring the job back."""
    _setup(conn, jobs=4000)
    conn.execute("SET pgjobs.fair_count_every = 1")
    with held_snapshot(connect):
        for _ in range(200):
            claim_and_complete(conn, PER_CLAIM)
        producer = connect(autocommit=False)
        late = call(producer, "enqueue", kind="k", queue="q", group_key="gx")[0]["id"]
        time.sleep(0.4)
        deadline, committed, got = time.monotonic() + 20, False, []
        while time.monotonic() < deadline and late not in got:
            call(conn, "enqueue", kind="k", queue="q", group_key="gx")
            got = [r["id"] for r in claim_and_complete(conn, GROUPS + 1)]
            if not committed and conn.execute(_GX_FLOOR).fetchone() == (True,):
                producer.commit()  # below the floor gx got from the claim just now
                committed = True
        assert committed and late in got


_GX_FLOOR = "SELECT floor_until > now() FROM pgjobs.group_cursors WHERE group_key = 'gx'"


_KEEP_FLOORS = (
    "SELECT set_config('pgjobs.fair_kept', jsonb_build_object('h q', jsonb_build_array("
    " extract(epoch FROM clock_timestamp()), coalesce(pg_sequence_last_value('pgjobs.claim_floor_epoch'), 0),"
    " '{}'::jsonb, 0))::text, false)"
)
_FLOORED = "SELECT count(*) FILTER (WHERE floor_until > now()) FROM pgjobs.group_cursors WHERE queue = 'q'"
_ENDS = (
    "SELECT count(DISTINCT floor_until), extract(epoch FROM min(floor_until) - now()),"
    " extract(epoch FROM max(floor_until) - now()) FROM pgjobs.group_cursors WHERE queue = 'q'"
)


def test_a_group_found_empty_from_the_front_gets_a_floor_too(conn: Conn, connect: ConnectFactory) -> None:
    """Floors came only from picked heads: a group with nothing pending kept none, and every claim probed it from
    the front past every job of it claimed under the held snapshot (a queue drained at 60 % load: every group, at
    every claim, the fair soak's worker stalled for seconds). A claim of a session that keeps floors now leaves a
    floor in the cursor of each group it found empty from the front, and the next claim of another session
    starts there (jobs_group_idx entries it was handed). The floor hides no job that comes after, nor one more
    urgent."""
    _setup(conn, jobs=4000)
    with held_snapshot(connect):
        while claim_and_complete(conn, 50):
            pass  # the queue drained under the snapshot: ~200 dead entries before every group's end
        conn.execute("UPDATE pgjobs.group_cursors SET floor_until = now() - interval '1 minute' WHERE queue = 'q'")
        cursors = conn.execute("SELECT count(*) FROM pgjobs.group_cursors WHERE queue = 'q'").fetchone()[0]  # type: ignore[index]
        conn.execute(_KEEP_FLOORS)  # a session whose floors hold: it probes groups without one from the front
        assert claim_and_complete(conn, cursors) == []  # (the fast path's pass: as many groups as the claim's room)
        assert conn.execute(_FLOORED).fetchone()[0] == cursors >= GROUPS - 2  # type: ignore[index]
        # each ends at a time of its own in the last quarter of the floors' life (here the session's: an hour),
        # so that a claim meets a few ended at a time, not all at once
        ends = conn.execute(_ENDS).fetchone()
        assert ends is not None and ends[0] >= cursors - 1 and 2690 <= ends[1] <= ends[2] <= 3601, ends
        other = connect()
        other.execute("SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off; SET enable_bitmapscan = off")
        (visits,), got = claim_entries(other, "jobs_group_idx")
        assert got == []
        later = call(conn, "enqueue", kind="k", queue="q", group_key="g03")[0]["id"]
        urgent = call(conn, "enqueue", kind="k", queue="q", group_key="g04", priority=-1)[0]["id"]
        assert {r["id"] for r in claim_and_complete(other, 5)} == {later, urgent}
    # before: 8,885 (every group from the front); now ~200: the group whose cursor went when it ran dry (g00) is
    # looked for by the discovery sweep, past its ~200 claimed jobs (the 's' gate's, not a floor's)
    assert visits <= 300, visits
