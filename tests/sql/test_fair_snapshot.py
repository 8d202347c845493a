"""A fair claim under a held snapshot (issue 10, item 1): what one claim reads, before and after claims made
while a foreign session sits idle in a transaction (``BEGIN; SELECT txid_current();`` then nothing), so no
version newer than its snapshot can be pruned and no dead index entry can be killed.

Deterministic: buffer counts of ``EXPLAIN (ANALYZE, BUFFERS)`` and per-relation block counts of the claiming
transaction (``pg_stat_get_xact_blocks_fetched``), no timings. Where a claim's reads no longer grow (the
discovery of new groups, the look for ungrouped work, the count of the active jobs a session keeps) the tests
assert it; what still grows grows per group (a group's claimed jobs and its cursor's versions: see
sql/fairness.sql, "Under a held snapshot"), and the whole claim's test bounds it so. The fair_groups
migration is checked on an upgraded installation.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.fair import claim_entries, work
from tests.helpers.foundation import call, expire, held_snapshot, run_threads, scalar, vacuum_clean

Conn = psycopg.Connection[Any]

GROUPS = 20
PER_CLAIM = 10
CLAIMS_UNDER_SNAPSHOT = 300  # 3,000 jobs claimed and completed while the snapshot is held

_RELS = """
SELECT c.relname, pg_stat_get_xact_blocks_fetched(c.oid)
  FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace AND n.nspname = 'pgjobs'
 WHERE c.relkind IN ('r', 'i') AND pg_stat_get_xact_blocks_fetched(c.oid) > 0
"""


def _probe(conn: Conn) -> tuple[int, dict[str, int]]:
    """Blocks of pgjobs relations one fair claim of one job fetched: the sum, and per relation. (Not EXPLAIN's
    total: that counts the catalog reads of a session's first calls too.)"""
    with conn.transaction():
        before = dict(conn.execute(_RELS).fetchall())
        got = call(conn, "claim", worker="probe", queues=["q"], max_jobs=1)
        after = dict(conn.execute(_RELS).fetchall())
    assert len(got) == 1
    rels = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}
    return sum(rels.values()), rels


def _work(conn: Conn, claims: int) -> int:
    return work(conn, claims, PER_CLAIM)


def _setup(conn: Conn) -> None:
    call(conn, "configure_queue", queue="q", fair=True)
    jobs = [{"kind": "k", "queue": "q", "group_key": f"g{i % GROUPS}"} for i in range(5000)]
    call(conn, "enqueue_many", jobs=jobs)
    _work(conn, 20)  # every group served: the ring is warm
    _probe(conn)  # the session's plans are cached
    vacuum_clean(conn, "jobs", "group_cursors", "fair_queues")


# What a fair claim still reads more of under a held snapshot, per group and not per job of the queue: the
# group's dead prefix on jobs_group_idx (its claimed jobs, one heap fetch each in jobs_live) and the versions
# of its cursor (group_cursors, and group_cursors_key_idx: the lookup by group, which replaced
# a unique key on the group: migrations/deploy/claim.sql). The rest of the bound (sql/fairness.sql,
# "What would bound the rest").
_PER_GROUP = {"group_cursors", "group_cursors_key_idx", "jobs_live", "jobs_group_idx"}


@pytest.mark.smoke  # (PostgreSQL 18 plans the ring read differently: sql/fairness.sql, _fair_fast)
def test_fair_claim_reads_grow_only_per_group_under_a_held_snapshot(conn: Conn, connect: ConnectFactory) -> None:
    """After 3,000 jobs claimed and completed under a held snapshot, one fair claim reads more only of what its
    own group left behind (at most 2 blocks per job of that group), not of every job completed since: the
    active count and the probe for leases to settle are kept by the session (main before: 2,493 blocks
    against 60)."""
    _setup(conn)
    # a kept count serves this session for the whole test (by default for 1 s: a claim then may count again)
    conn.execute("SET pgjobs.fair_count_every = 3600")
    with held_snapshot(connect):
        _probe(conn)
        b0, r0 = _probe(conn)
        assert _work(conn, CLAIMS_UNDER_SNAPSHOT) == CLAIMS_UNDER_SNAPSHOT * PER_CLAIM
        b1, r1 = _probe(conn)
    # the relations whose reads grew, for the failure message
    grew = {k: (r0.get(k, 0), v) for k, v in r1.items() if v > r0.get(k, 0) + 4}
    assert set(grew) <= _PER_GROUP, (b0, b1, grew)
    assert b1 <= 3 * b0 + 50 + 2 * CLAIMS_UNDER_SNAPSHOT * PER_CLAIM // GROUPS, (b0, b1, grew)


def _active_entries(conn: Conn) -> tuple[int, list[dict[str, Any]]]:
    """Entries of jobs_active_idx (live or dead) one fair claim of one job was handed, and what it claimed."""
    (n,), got = claim_entries(conn, "jobs_active_idx")
    return n, got


def test_a_fair_claimer_keeps_its_active_counts_while_a_held_snapshot_makes_counting_dear(
    conn: Conn, connect: ConnectFactory
) -> None:
    """Under a held snapshot a count of the active jobs passes the dead entry of every job completed since (a
    new session's claim shows it); a session whose count was that dear keeps it for
    pgjobs.fair_count_every seconds and its claims pass none, neither counting nor probing for leases to
    settle. A lease that runs out meanwhile is handed out again once the kept count is older than that."""
    _setup(conn)
    conn.execute("SET pgjobs.fair_count_every = 3600")
    with held_snapshot(connect):
        assert _work(conn, CLAIMS_UNDER_SNAPSHOT) == CLAIMS_UNDER_SNAPSHOT * PER_CLAIM
        fresh = connect()
        counted, _ = _active_entries(fresh)
        kept, got = _active_entries(conn)
        assert counted >= CLAIMS_UNDER_SNAPSHOT * PER_CLAIM, counted  # the dead entries are there to pass
        assert kept <= 10, (kept, counted)
        assert len(got) == 1

        # a lease that runs out while the count is kept: found at the first count after it ages out
        stuck = call(fresh, "claim", worker="gone", queues=["q"], max_jobs=1)[0]
        expire(fresh, stuck["id"])
        conn.execute("SET pgjobs.fair_count_every = 0.2")  # the kept count is now too old to serve
        seen: set[int] = set()
        deadline = time.monotonic() + 10
        while stuck["id"] not in seen and time.monotonic() < deadline:
            seen.update(r["id"] for r in call(conn, "claim", worker="w", queues=["q"], max_jobs=1))
            time.sleep(0.02)
        assert stuck["id"] in seen
        again = conn.execute("SELECT attempt, leased_by FROM pgjobs.jobs WHERE id = %s", [stuck["id"]]).fetchone()
        assert again == (2, "w")


def _pending_entries(conn: Conn) -> tuple[int, int]:
    """Entries of jobs_pending_idx and of jobs_group_idx (live or dead) one fair claim of one job was handed."""
    (pending, group), _ = claim_entries(conn, "jobs_pending_idx", "jobs_group_idx")
    return pending, group


def test_the_8th_claims_looks_are_not_paid_again_and_again_under_a_held_snapshot(
    conn: Conn, connect: ConnectFactory
) -> None:
    """On an all-grouped queue every 8th claim looks for ungrouped work that came back without a new job (a walk
    of jobs_pending_idx past every job claimed since the held snapshot) and sweeps 16 groups for work without a
    cursor (stepping over those with one: tests/sql/test_fair_sweep.py). Once such a read proved dear, the
    session skips it for pgjobs.fair_count_every seconds (the other sessions too, while its gate is closed); an
    ungrouped job released back to pending meanwhile is claimed once that time is up."""
    call(conn, "configure_queue", queue="q", fair=True)
    (u,) = call(conn, "enqueue", kind="k", queue="q")  # ungrouped, claimed by a worker before the snapshot
    call(conn, "enqueue_many", jobs=[{"kind": "k", "queue": "q", "group_key": f"g{i % GROUPS}"} for i in range(5000)])
    other = connect()
    taken = call(other, "claim", worker="x", queues=["q"], max_jobs=1)
    assert [r["id"] for r in taken] == [u["id"]]  # never served, the ungrouped turn goes first
    conn.execute("SET pgjobs.fair_count_every = 3600")
    with held_snapshot(connect):
        assert _work(conn, CLAIMS_UNDER_SNAPSHOT) == CLAIMS_UNDER_SNAPSHOT * PER_CLAIM
        entries = [_pending_entries(conn) for _ in range(16)]  # two 8th claims among them
        fresh = connect()
        # (the gates this session's dear reads closed would spare the new one too: tests/sql/test_fair_gates.py)
        fresh.execute("SELECT setval('pgjobs.fair_gate_u', 1), setval('pgjobs.fair_gate_s', 1)")
        looked = [_pending_entries(fresh) for _ in range(16)]
        # the look for ungrouped work: a session without the note pays for the dead entries
        assert max(e[0] for e in entries) <= 100, entries
        assert max(e[0] for e in looked) >= CLAIMS_UNDER_SNAPSHOT * PER_CLAIM, looked
        # the 8th claim's sweep of 16 groups steps over the groups with a cursor (all of them here) by their
        # fair_groups key, in either session: each claim's own head probe passes its group's claimed jobs, and
        # no more (before _fair_next_group the new session's sweep passed 16 groups' claimed jobs)
        per_group = CLAIMS_UNDER_SNAPSHOT * PER_CLAIM // GROUPS
        assert max(e[1] for e in entries) <= 2 * per_group + 100, entries
        assert max(e[1] for e in looked) <= 2 * per_group + 100, looked

        # the ungrouped job back to pending with its old id (no new job tells of it)
        assert scalar(other, "release", id=u["id"], lease_token=taken[0]["lease_token"]) is True
        conn.execute("SET pgjobs.fair_count_every = 0.2")
        seen: set[int] = set()
        deadline = time.monotonic() + 10
        while u["id"] not in seen and time.monotonic() < deadline:
            seen.update(r["id"] for r in call(conn, "claim", worker="w", queues=["q"], max_jobs=PER_CLAIM))
            time.sleep(0.02)
        assert u["id"] in seen


def test_without_a_held_snapshot_every_fair_claim_counts(conn: Conn) -> None:
    """Nothing is kept while counting is cheap (no held snapshot): every claim counts the active jobs, so the
    noisy rule and expired leases see the state of the moment, as before."""
    _setup(conn)
    _work(conn, 30)
    assert conn.execute("SELECT current_setting('pgjobs.fair_kept', true)").fetchone()[0] in (None, "", "{}")


def _fresh_jobs(conn: Conn, n: int, offset: int) -> None:
    jobs = [{"kind": "k", "queue": "q", "group_key": f"g{(offset + i) % GROUPS}"} for i in range(n)]
    call(conn, "enqueue_many", jobs=jobs)


_ENTRIES = """
SELECT c.relname, pg_stat_get_xact_tuples_returned(c.oid)
  FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace AND n.nspname = 'pgjobs'
 WHERE c.relname = 'jobs_group_idx'
"""


def _discovery_entries(conn: Conn) -> dict[str, int]:
    """Index entries of jobs_group_idx (what the skip scan reads, one group after another) one claim of one
    job was handed, dead ones included, with new jobs inserted just before it (a
    claim that is not quiet)."""
    _fresh_jobs(conn, 3, 0)
    with conn.transaction():
        before = dict(conn.execute(_ENTRIES).fetchall())
        assert len(call(conn, "claim", worker="probe", queues=["q"], max_jobs=1)) == 1
        after = dict(conn.execute(_ENTRIES).fetchall())
    return {k: v - before[k] for k, v in after.items()}


def test_new_groups_are_found_without_reading_what_a_held_snapshot_keeps(conn: Conn, connect: ConnectFactory) -> None:
    """A claim after new jobs registers their groups from the new ids (_discover_fresh) instead of a skip
    scan over 16 groups, which passes each group's claimed jobs on jobs_group_idx (and looks up each
    group's cursor, passing its versions): on main the entries one such claim is handed grow by about 16
    times what its own head probe passes (2,500 instead of 150 here)."""
    _setup(conn)
    with held_snapshot(connect):
        for _ in range(8):  # past the every-8th-claim sweep, whichever claim it falls on
            _discovery_entries(conn)
        e0 = [_discovery_entries(conn) for _ in range(8)]
        for i in range(CLAIMS_UNDER_SNAPSHOT):
            _fresh_jobs(conn, PER_CLAIM, i)
            _work(conn, 1)
        e1 = [_discovery_entries(conn) for _ in range(8)]
    # the claim's own head probe passes its group's claimed jobs (CLAIMS_UNDER_SNAPSHOT * PER_CLAIM / GROUPS
    # of them, still open); a skip scan over 16 groups would pass 16 times that
    grew = min(e["jobs_group_idx"] for e in e1) - min(e["jobs_group_idx"] for e in e0)
    assert grew <= 2 * CLAIMS_UNDER_SNAPSHOT * PER_CLAIM // GROUPS, (e0, e1)


def test_a_new_group_goes_first_at_the_next_claim_whatever_the_number_of_groups(conn: Conn) -> None:
    """A group that arrives with a new job gets its cursor at the next claim, also in a queue with more
    groups than one skip-scan sweep covers (16), and is served first (never served)."""
    call(conn, "configure_queue", queue="q", fair=True)
    call(conn, "enqueue_many", jobs=[{"kind": "k", "queue": "q", "group_key": f"g{i:03}"} for i in range(200)])
    for _ in range(40):  # every group discovered and most served
        _work(conn, 1)
    call(conn, "enqueue", kind="k", queue="q", group_key="zz-new")
    got = call(conn, "claim", worker="w", queues=["q"], max_jobs=1)
    assert [r["group_key"] for r in got] == ["zz-new"]


def test_a_pause_of_thousands_of_new_jobs_registers_their_groups_by_id(conn: Conn) -> None:
    """5,000 jobs in 40 new groups arriving between two claims of a session (a pause of a slow claimer on a busy
    queue): the next claim registers all 40 from the new ids. Up to 2,048 new ids were read so, and past that the
    claim swept 16 groups instead; in the fair soak under a held snapshot each such sweep was slow enough to let
    2,048 more jobs arrive before the next claim, which swept again (sql/fairness.sql, c_fresh_ids)."""
    call(conn, "configure_queue", queue="q", fair=True)
    call(conn, "enqueue_many", jobs=[{"kind": "k", "queue": "q", "group_key": "a"} for _ in range(10)])
    assert len(call(conn, "claim", worker="w", queues=["q"], max_jobs=1)) == 1
    jobs = [{"kind": "k", "queue": "q", "group_key": f"n{i % 40:02}"} for i in range(5000)]
    call(conn, "enqueue_many", jobs=jobs)
    got = call(conn, "claim", worker="w", queues=["q"], max_jobs=1)
    assert [r["group_key"] for r in got] == ["n00"]  # never served and the oldest head
    registered = conn.execute("SELECT count(*) FROM pgjobs.fair_groups WHERE queue = 'q'").fetchone()[0]
    assert registered == 41


def test_ungrouped_work_arriving_gets_its_turn(conn: Conn) -> None:
    """Ungrouped jobs arriving on an all-grouped queue (the last look found none) take their turn within
    a round, as before: the new ids tell the claim that ungrouped work came."""
    call(conn, "configure_queue", queue="q", fair=True)
    call(
        conn,
        "enqueue_many",
        jobs=[{"kind": "k", "queue": "q", "group_key": f"g{i}"} for i in range(4) for _ in range(5)],
    )
    for _ in range(6):
        _work(conn, 1)
    call(conn, "enqueue", kind="k", queue="q")
    got = call(conn, "claim", worker="w", queues=["q"], max_jobs=5)
    assert None in [r["group_key"] for r in got]


def test_forgetting_a_group_drops_its_fair_groups_row_and_it_comes_back(conn: Conn) -> None:
    call(conn, "configure_queue", queue="q", fair=True)
    call(conn, "enqueue", kind="k", queue="q", group_key="A")
    call(conn, "enqueue", kind="k", queue="q", group_key="B")
    _work(conn, 1)  # both served
    assert _work(conn, 3) == 0  # nothing left: the walk meets both cursors and drops them
    known = "SELECT group_key FROM pgjobs.fair_groups WHERE queue = 'q' ORDER BY 1"
    cursors = "SELECT group_key FROM pgjobs.group_cursors WHERE queue = 'q' ORDER BY 1"
    assert conn.execute(known).fetchall() == conn.execute(cursors).fetchall() == []
    call(conn, "enqueue", kind="k", queue="q", group_key="A")
    got = call(conn, "claim", worker="w", queues=["q"], max_jobs=1)
    assert [r["group_key"] for r in got] == ["A"]
    assert conn.execute(known).fetchall() == conn.execute(cursors).fetchall() == [("A",)]


@pytest.mark.parametrize("caps", [{}, {"max_active": 1}], ids=["uncapped", "max_active=1"])
def test_an_expired_lease_found_by_the_count_is_reclaimed_and_not_counted(conn: Conn, caps: dict[str, Any]) -> None:
    """The fair path finds expired leases in its count of the active jobs (no probe of its own): the
    expired job goes back to pending before the pick, so it is claimed again as a new attempt, and under
    max_active = 1 it does not count against the cap (nor is the cap overshot: one active job after)."""
    call(conn, "configure_queue", queue="q", fair=True, **caps)
    call(conn, "enqueue", kind="k", queue="q", group_key="A")
    first = call(conn, "claim", worker="w1", queues=["q"], max_jobs=1)
    assert len(first) == 1
    expire(conn, first[0]["id"])
    again = call(conn, "claim", worker="w2", queues=["q"], max_jobs=1)
    assert [(r["id"], r["attempt"]) for r in again] == [(first[0]["id"], 2)]
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE state = 'active'), min(last_error) FROM pgjobs.jobs WHERE queue = 'q'"
    ).fetchone()
    assert row == (1, "lease expired")


def test_the_fair_queues_row_is_written_only_when_a_shared_setting_moves(conn: Conn, connect: ConnectFactory) -> None:
    """A claim that neither sweeps nor moves the ungrouped jobs' state leaves the fair_queues row as it was
    (its own seen_max_id and quiet count go to the session's hint), so under a held snapshot the
    row's version chain grows by one version per sweep (every 8th claim), not per claim, and reading it
    stays flat."""
    _setup(conn)
    version = "SELECT xmin::text FROM pgjobs.fair_queues WHERE queue = 'q'"
    xmins = []
    for _ in range(16):
        _work(conn, 1)
        xmins.append(conn.execute(version).fetchone())
    assert len(set(xmins)) <= 3, xmins  # at most two sweeps in 16 claims (and the state before them)
    hint = conn.execute("SELECT current_setting('pgjobs.fair_hint', true)::jsonb -> 'q'").fetchone()
    assert hint is not None and hint[0] is not None and len(hint[0]) == 3  # [seen_max_id, quiet claims, claimed at]

    with held_snapshot(connect):
        _probe(conn)
        _, r0 = _probe(conn)
        assert _work(conn, CLAIMS_UNDER_SNAPSHOT) == CLAIMS_UNDER_SNAPSHOT * PER_CLAIM
        _, r1 = _probe(conn)
    # main: one version per claim, 300 claims later the lookups read ~10 more blocks; here at most 300 / 8
    # versions, and the row is found in a block or two more
    assert r1.get("fair_queues", 0) <= r0.get("fair_queues", 0) + 3, (r0, r1)


def test_sessions_taking_turns_serve_every_group_once_a_round(connect: ConnectFactory) -> None:
    """Race: two sessions claiming one job at a time, alternately, each with its own hint of the queue's
    state: the ring goes round exactly, no group served twice before every group was
    served once, in each of three rounds (a hint that skipped a cursor would leave a group out)."""
    a, b = connect(), connect()
    call(a, "configure_queue", queue="q", fair=True)
    n = 30
    call(
        a,
        "enqueue_many",
        jobs=[{"kind": "k", "queue": "q", "group_key": f"g{i:02}"} for i in range(n) for _ in range(4)],
    )
    served: list[str] = []
    for i in range(3 * n):
        c = a if i % 2 == 0 else b
        rows = call(c, "claim", worker=f"w{i % 2}", queues=["q"], max_jobs=1)
        assert len(rows) == 1
        served.append(rows[0]["group_key"])
        call(c, "complete_many", ids=[rows[0]["id"]], lease_tokens=[rows[0]["lease_token"]])
    for r in range(3):
        assert sorted(served[r * n : (r + 1) * n]) == [f"g{i:02}" for i in range(n)], (r, served)


def test_claimers_registering_the_same_new_groups_side_by_side(connect: ConnectFactory) -> None:
    """Race: four sessions claim while new groups keep arriving, each registering the groups of the new
    jobs it reads (no discovery lock): no deadlock, no error, every group ends with exactly one cursor and
    one fair_groups row, and every job is claimed once."""
    setup = connect()
    call(setup, "configure_queue", queue="q", fair=True)
    rounds, per_round = 30, 8

    def claimer(i: int) -> list[int]:
        c = connect()
        got: list[int] = []
        for r in range(rounds):
            if i == 0:  # one producer among them: new groups every round, in reverse key order
                jobs = [{"kind": "k", "queue": "q", "group_key": f"n{r:02}-{k}"} for k in reversed(range(per_round))]
                call(c, "enqueue_many", jobs=jobs)
            rows = call(c, "claim", worker=f"w{i}", queues=["q"], max_jobs=3)
            got.extend(r_["id"] for r_ in rows)
        return got

    claimed = [j for ids in run_threads(4, claimer) for j in ids]
    while rows := call(setup, "claim", worker="w", queues=["q"], max_jobs=100):
        claimed.extend(r["id"] for r in rows)
    assert len(claimed) == len(set(claimed)) == rounds * per_round
    counts = setup.execute(
        "SELECT (SELECT count(*) FROM pgjobs.group_cursors WHERE queue = 'q'),"
        " (SELECT count(DISTINCT group_key) FROM pgjobs.group_cursors WHERE queue = 'q'),"
        " (SELECT count(*) FROM pgjobs.fair_groups WHERE queue = 'q'),"
        " (SELECT count(*) FROM pgjobs.fair_groups AS g LEFT JOIN pgjobs.group_cursors AS c"
        "   USING (queue, group_key) WHERE g.queue = 'q' AND c.queue IS NULL)"
    ).fetchone()
    assert counts is not None and counts[0] == counts[1] == counts[2] and counts[3] == 0, counts


def test_a_forged_hint_stays_in_its_session(connect: ConnectFactory) -> None:
    """pgjobs.fair_hint is a session setting anyone can SET: a ring_from far ahead in it (the hint's third
    element once; no longer read) moves nothing; the fair_queues row keeps a ring_from read from the cursors,
    and another session still serves every group once a round."""
    a, b = connect(), connect()
    call(a, "configure_queue", queue="q", fair=True)
    n = 12
    call(
        a,
        "enqueue_many",
        jobs=[{"kind": "k", "queue": "q", "group_key": f"g{i:02}"} for i in range(n) for _ in range(6)],
    )
    _work(a, 2)  # the ring is served
    b.execute("""SELECT set_config('pgjobs.fair_hint', '{"q": [0, 6, 9000000000]}', false)""")
    for _ in range(12):  # among them the sweeps that write the row
        rows = call(b, "claim", worker="b", queues=["q"], max_jobs=1)
        call(b, "complete_many", ids=[r["id"] for r in rows], lease_tokens=[r["lease_token"] for r in rows])
    row = a.execute(
        "SELECT f.ring_from <= (SELECT min(c.served_seq) FROM pgjobs.group_cursors AS c"
        "                        WHERE c.queue = 'q' AND c.served_seq > 0)"
        "  FROM pgjobs.fair_queues AS f WHERE f.queue = 'q'"
    ).fetchone()
    assert row == (True,)
    served = []
    for _ in range(n):
        rows = call(a, "claim", worker="a", queues=["q"], max_jobs=1)
        served.append(rows[0]["group_key"])
        call(a, "complete_many", ids=[rows[0]["id"]], lease_tokens=[rows[0]["lease_token"]])
    assert sorted(served) == [f"g{i:02}" for i in range(n)], served


def test_a_claim_after_a_burst_reads_the_new_ids_on_the_primary_key(conn: Conn) -> None:
    """1,500 jobs of 150 new groups inserted since the previous claim: the claim registers all 150 groups
    at once from the new ids, a range of jobs_pkey (a skip scan registers 16 a claim), without walking
    the queue's pending index; the new groups go first (never served: the best head)."""
    _setup(conn)
    jobs = [{"kind": "k", "queue": "q", "group_key": f"new{i % 150:03}"} for i in range(1500)]
    call(conn, "enqueue_many", jobs=jobs)
    rel = """SELECT c.relname, pg_stat_get_xact_tuples_returned(c.oid) FROM pg_class AS c
              WHERE c.relname IN ('jobs_pending_idx', 'jobs_pkey')
                AND c.relnamespace = 'pgjobs'::regnamespace"""
    with conn.transaction():
        before = dict(conn.execute(rel).fetchall())
        got = call(conn, "claim", worker="w", queues=["q"], max_jobs=1)
        after = dict(conn.execute(rel).fetchall())
        known = conn.execute("SELECT count(*) FROM pgjobs.fair_groups WHERE group_key LIKE 'new%'").fetchone()
    read = {k: v - before[k] for k, v in after.items()}
    assert [r["group_key"] for r in got] == ["new000"]
    assert known == (150,)
    assert read["jobs_pending_idx"] == 0, read
    assert read["jobs_pkey"] >= 1500, read  # the burst, read on the primary key


def test_a_claim_of_a_drained_queue_reads_only_the_ids_since_the_last_under_a_held_snapshot(
    conn: Conn, connect: ConnectFactory
) -> None:
    """Whether jobs came since the previous claim (the highest live id) was max(id) over every partition of jobs:
    on a queue drained under a held snapshot it read jobs_live's primary key from its end past every job claimed
    and done since (1.29 M entries and 265 ms 200 s into the fair soak's hold, the worker's and the probe's
    claims alike). Now from the highest id the session's previous claim saw, or fair_queues' for a new session
    (entries of jobs_live's primary key one claim was handed)."""
    _setup(conn)
    with held_snapshot(connect):
        _work(conn, 600)  # the queue drained: every job done under the snapshot
        fresh = connect()
        (seen,), got = claim_entries(conn, "jobs_pkey")
        (seen_fresh,), _ = claim_entries(fresh, "jobs_pkey")
    assert got == []
    # before: 9,600 each (every job's pending and active versions)
    assert seen <= 20, seen
    assert seen_fresh <= 200, seen_fresh
