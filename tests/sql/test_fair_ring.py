"""The fair claim on its ring (sql/fair.sql): what a claim reads under a held snapshot does not grow with the
jobs done (uncapped, per-group capped, capped in all), no number of groups at their cap hides a claimable job,
weights share the claims, and a group back from idle neither starves nor floods.

Deterministic: index entries and buffers from the backend's statistics of the claiming transaction, counts of
claims; no timings."""

from __future__ import annotations

import collections
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.foundation import call, claim, held_snapshot, scalar

Conn = psycopg.Connection[Any]


def fair(conn: Conn, queue: str = "q", **settings: Any) -> None:
    call(conn, "configure_queue", queue=queue, fair=True, **settings)


def put(conn: Conn, groups: list[str | None], queue: str = "q") -> list[int]:
    jobs = [{"kind": "k", "queue": queue, "group_key": g} for g in groups]
    return [r["id"] for r in call(conn, "enqueue_many", jobs=jobs)]


def finish(conn: Conn, rows: list[dict[str, Any]]) -> None:
    if rows:
        scalar(conn, "complete_many", ids=[r["id"] for r in rows], lease_tokens=[r["lease_token"] for r in rows])


_READS = """
SELECT c.relname, pg_stat_get_xact_tuples_returned(c.oid), pg_stat_get_xact_blocks_fetched(c.oid)
  FROM pg_class AS c
 WHERE c.relnamespace = 'pgjobs'::regnamespace AND c.relkind IN ('r', 'i')
"""


def reads(conn: Conn) -> collections.Counter[str]:
    """Per pgjobs relation, the index entries its scans returned (live or dead; key 'entries:<index>') and the
    buffers fetched (key 'blocks:<relation>'), by this backend in this transaction."""
    out: collections.Counter[str] = collections.Counter()
    for name, entries, blocks in conn.execute(_READS).fetchall():
        out[f"entries:{name}"] += int(entries)
        out[f"blocks:{name}"] += int(blocks)
    return out


def probes(conn: Conn, n: int = 64) -> tuple[int, int, int, collections.Counter[str]]:
    """(jobs taken, index entries, buffers, per relation) of n claims of one job in a row, each completed after
    its claim, entries and buffers as counted() sums them. A claim and its completion add a ledger row each,
    and every 64 rows a claim writes a checkpoint (caps.sql): 64 probes hold two whole cycles of the count's
    reads, whatever the phase they start in."""
    taken = 0
    total: collections.Counter[str] = collections.Counter()
    for _ in range(n):
        with conn.transaction():
            before = reads(conn)
            rows = claim(conn, "probe", queues=["q"], max_jobs=1)
            total.update(reads(conn) - before)
        taken += len(rows)
        finish(conn, rows)
    entries, blocks = counted(total)
    return taken, entries, blocks, total


def counted(total: collections.Counter[str]) -> tuple[int, int]:
    """(index entries, buffers) of a reads() difference. The buffers of jobs_filed_idx and cap_ledger_moves are
    left out: each is probed once per transaction in progress anywhere in the cluster, a cost of what runs
    beside the claim, not of the jobs done (their entries count)."""
    entries = sum(v for k, v in total.items() if k.startswith("entries:"))
    blocks = sum(
        v
        for k, v in total.items()
        if k.startswith("blocks:") and k not in ("blocks:jobs_filed_idx", "blocks:cap_ledger_moves")
    )
    return entries, blocks


@pytest.mark.parametrize(
    "caps",
    [{}, {"max_active_per_group": 2}, {"max_active": 20}],
    ids=["uncapped", "per-group-cap", "max-active"],
)
def test_a_fair_claim_reads_the_same_after_1000_and_20000_jobs_done_under_a_held_snapshot(
    conn: Conn, connect: ConnectFactory, caps: dict[str, Any]
) -> None:
    """100 groups, a backlog of 21,500 jobs; under a held snapshot 1,000 jobs are claimed (10 a claim) and
    completed, 64 probe claims of one job are measured, 19,000 more are done, and the probes again: they
    return the same index entries and fetch the same buffers within 10 % (a read from the front of any claim
    index, or a count over jobs_active_idx, would pass 19,000 dead entries more)."""
    producer = connect()
    fair(producer, **caps)
    for _ in range(43):
        put(producer, [f"g{i % 100:02}" for i in range(500)])
    producer.execute("ANALYZE pgjobs.jobs")
    measured = {}
    with held_snapshot(connect):
        done = 0
        for target in (1000, 20000):
            while done < target:
                rows = claim(producer, "w", queues=["q"], max_jobs=10)
                finish(producer, rows)
                done += len(rows)
            finish(conn, claim(conn, "probe", queues=["q"], max_jobs=1))  # this session's plans made
            # (from the start of a window of the ring log: no rotation falls among the probes)
            conn.execute("SELECT setval('pgjobs.fair_rings_seq', (currval('pgjobs.fair_rings_seq') / 1024 + 1) * 1024)")
            measured[target] = probes(conn)
    (t1, e1, b1, r1), (t2, e2, b2, r2) = measured[1000], measured[20000]
    grew = sorted((r2 - r1).items(), key=lambda kv: -kv[1])[:6]
    assert t1 == t2 == 64
    assert e2 <= e1 * 1.1, (e1, e2, grew)
    assert b2 <= b1 * 1.1, (b1, b2, grew)


def test_a_shallow_fair_queue_reads_the_same_after_1000_and_8000_jobs_done_under_a_held_snapshot(
    conn: Conn, connect: ConnectFactory
) -> None:
    """A fair queue kept near empty, as a worker keeps it at a rate it can hold: 40 jobs over 100 groups
    enqueued, claimed (50 a claim) and completed in turn, with no statistics gathered (as on a new database).
    Under a held snapshot, 16 such claims after 1,000 and after 8,000 jobs done read the same index entries
    and buffers within 10 %. (The lease of the picks once filtered jobs_pending_idx by id: a pass over every
    pending entry, the dead ones a held snapshot keeps included, that grew with every job done.)"""
    producer = connect()
    fair(producer)
    turn = [0]

    def cycle(c: Conn, marks: list[collections.Counter[str]] | None = None) -> int:
        """40 jobs enqueued, claimed and completed; with ``marks``, the claim's reads before and after it."""
        put(producer, [f"g{(turn[0] + i) % 100:02}" for i in range(40)])
        turn[0] += 40
        with c.transaction():
            if marks is not None:
                marks.append(reads(c))
            rows = claim(c, "w", queues=["q"], max_jobs=50)
            if marks is not None:
                marks.append(reads(c))
        finish(c, rows)
        return len(rows)

    measured: dict[int, tuple[int, int]] = {}
    with held_snapshot(connect):
        done = 0
        for target in (1000, 8000):
            while done < target:
                done += cycle(producer)
            marks: list[collections.Counter[str]] = []
            taken = sum(cycle(conn, marks) for _ in range(16))
            done += taken
            total: collections.Counter[str] = collections.Counter()
            for before, after in zip(marks[::2], marks[1::2], strict=True):
                total.update(after - before)
            assert taken == 16 * 40
            measured[target] = counted(total)
    (e1, b1), (e2, b2) = measured[1000], measured[8000]
    assert e2 <= e1 * 1.1, measured
    assert b2 <= b1 * 1.1, measured


@pytest.mark.parametrize("cap", [1, 2])
def test_no_number_of_groups_at_their_cap_hides_a_claimable_job(conn: Conn, cap: int) -> None:
    """5,000 groups each at its cap (active jobs, lease 1 h) with one more job pending each; group Z served
    once, then given one job: every claim of one job takes Z's job while it is pending."""
    fair(conn, max_active_per_group=cap)
    n = 5000
    put(conn, [f"g{i:04}" for i in range(n) for _ in range(cap + 1)])
    taken = 0
    while rows := claim(conn, "w", queues=["q"], max_jobs=1000, lease="1 hour"):
        taken += len(rows)
    assert taken == n * cap
    [z1] = put(conn, ["Z"])
    [got] = claim(conn, "w", queues=["q"], max_jobs=1)
    assert got["id"] == z1
    finish(conn, [got])
    for _ in range(3):
        [z] = put(conn, ["Z"])
        rows = claim(conn, "w", queues=["q"], max_jobs=1)
        assert [r["id"] for r in rows] == [z]
        finish(conn, rows)


def test_weights_share_the_claims_and_an_idle_group_neither_starves_nor_floods(conn: Conn) -> None:
    """Weights 1:2:4 on three backlogged groups: over 3,000 claims each group's share is within 5 % of 1/7,
    2/7, 4/7. Then the heaviest goes idle for 700 claims (its share goes to the others) and comes back: in the
    next 700 claims it takes its 4/7 again, not the claims it missed."""
    fair(conn)
    for g, w in (("a", 1), ("b", 2), ("c", 4)):
        call(conn, "configure_group", queue="q", group_key=g, weight=w)
    put(conn, ["a", "b", "c"] * 2000)
    served: collections.Counter[str] = collections.Counter()
    for _ in range(300):
        rows = claim(conn, "w", queues=["q"], max_jobs=10)
        served.update(r["group_key"] for r in rows)
        finish(conn, rows)
    assert sum(served.values()) == 3000
    for g, w in (("a", 1), ("b", 2), ("c", 4)):
        assert abs(served[g] / 3000 - w / 7) <= 0.05, served

    conn.execute(
        "UPDATE pgjobs.jobs SET state = 'cancelled', completed_at = now() WHERE group_key = 'c' AND state = 'pending'"
    )
    idle: collections.Counter[str] = collections.Counter()
    for _ in range(70):
        rows = claim(conn, "w", queues=["q"], max_jobs=10)
        idle.update(r["group_key"] for r in rows)
        finish(conn, rows)
    assert idle["c"] == 0 and abs(idle["a"] / 700 - 1 / 3) <= 0.05, idle  # work-conserving: a and b share 1:2
    put(conn, ["c"] * 2000)
    back: collections.Counter[str] = collections.Counter()
    for _ in range(70):
        rows = claim(conn, "w", queues=["q"], max_jobs=10)
        back.update(r["group_key"] for r in rows)
        finish(conn, rows)
    assert abs(back["c"] / 700 - 4 / 7) <= 0.05, back


def test_weights_are_checked_and_listed(conn: Conn) -> None:
    fair(conn)
    for bad in (0, -1, 1001):
        with pytest.raises(psycopg.Error) as info:
            call(conn, "configure_group", queue="q", group_key="g", weight=bad)
        assert info.value.sqlstate == "PJ002" and str(bad) in str(info.value)
    call(conn, "configure_group", queue="q", group_key="g", weight=3)
    put(conn, ["g", "h"])
    claim(conn, "w", queues=["q"], max_jobs=1)
    listed = {r[0]: r[1] for r in conn.execute("SELECT group_key, weight FROM pgjobs.fair_ring_groups('q')")}
    assert listed == {"g": 3, "h": 1}
    call(conn, "configure_group", queue="q", group_key="g", weight=1)  # back to the default: no row kept
    assert conn.execute("SELECT count(*) FROM pgjobs.fair_weights").fetchone() == (0,)


def test_the_ring_log_s_slots_take_turns_and_keep_the_newest_row_of_every_queue(conn: Conn) -> None:
    """Ring rows go to slot (seq / 1024) % 2; a claim in the second half of a window (every 64th) empties the
    other slot by TRUNCATE after it copied the newest row of each queue with no newer one in the current slot.
    The rings still hold: each group's next jobs come in turn, every job once."""
    for q in ("a", "b"):
        fair(conn, queue=q)
    ids = {q: put(conn, ["x", "y"] * 3, queue=q) for q in ("a", "b")}
    seq = "SELECT setval('pgjobs.fair_rings_seq', %s)"
    rows = "SELECT slot, queue FROM pgjobs.fair_rings ORDER BY seq, queue"

    def take(q: str, n: int = 1) -> list[int]:
        got = claim(conn, "w", queues=[q], max_jobs=n)
        finish(conn, got)
        return [r["id"] for r in got]

    assert take("a") == ids["a"][:1]  # seq 1: slot 0
    conn.execute(seq, [1023])
    assert take("b") == ids["b"][:1]  # seq 1024: slot 1
    assert take("a") == ids["a"][1:2]  # seq 1025: slot 1, newer than a's row in slot 0
    conn.execute(seq, [2559])
    assert take("b") == ids["b"][1:2]  # seq 2560: slot 0, second half of its window, a 64th: rotates
    # a's newest row copied over (it keeps its seq); b's has a newer row in slot 0, written before the turn
    assert conn.execute(rows).fetchall() == [(0, "a"), (0, "a"), (0, "b")]
    assert conn.execute("SELECT count(*) FROM pgjobs.fair_rings_1").fetchone() == (0,)
    for q in ("a", "b"):
        assert take(q, n=10) == ids[q][2:]
