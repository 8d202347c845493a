"""Fair selection inside claim (sql/fair.sql): round-robin over groups, noisy demotion, the ring's cleanup,
the plain path left alone, kind_limits, reclaim and due jobs on fair queues, plans that stay on indexes, and
the `pgjobs queue` commands."""

from __future__ import annotations

import collections
import json
import re
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.foundation import call, claim, enqueue, expire, run_threads

Conn = psycopg.Connection[Any]


def fair(conn: Conn, queue: str = "q", **settings: Any) -> None:
    call(conn, "configure_queue", queue=queue, fair=True, **settings)


def put(conn: Conn, group: str | None, n: int, queue: str = "q", kind: str = "k", **spec: Any) -> list[int]:
    """n jobs of one group, one enqueue_many call; their ids in order."""
    jobs = [{"kind": kind, "queue": queue, "group_key": group, **spec} for _ in range(n)]
    return [r["id"] for r in call(conn, "enqueue_many", jobs=jobs)]


def groups(rows: list[dict[str, Any]]) -> list[str | None]:
    return [r["group_key"] for r in rows]


def complete(conn: Conn, rows: list[dict[str, Any]]) -> None:
    if rows:
        call(conn, "complete_many", ids=[r["id"] for r in rows], lease_tokens=[r["lease_token"] for r in rows])


def cursors(conn: Conn, queue: str = "q") -> dict[str, Any]:
    """The groups in the queue's ring (those with pending work at its last claim): their place in the serving
    order (0: never served)."""
    rows = conn.execute("SELECT group_key, served FROM pgjobs.fair_ring_groups(%s)", [queue])
    return {k: s for k, s in rows.fetchall() if k is not None}


@pytest.mark.smoke
def test_first_claims_interleave_all_five_groups(conn: Conn) -> None:
    fair(conn)
    put(conn, "A", 5000)  # A's jobs come first in claim order (older, lower ids)
    for g in "BCDE":
        put(conn, g, 50)

    one_by_one = [groups(claim(conn, queues=["q"]))[0] for _ in range(5)]
    assert sorted(one_by_one) == list("ABCDE")

    # a multi-job claim re-ranks the groups at each pick: two full rounds
    ten = groups(claim(conn, queues=["q"], max_jobs=10))
    assert collections.Counter(ten) == {g: 2 for g in "ABCDE"}
    assert sorted(ten[:5]) == list("ABCDE") and sorted(ten[5:]) == list("ABCDE")


def test_never_served_first_then_least_recently_served(conn: Conn) -> None:
    fair(conn)
    put(conn, "A", 20)
    put(conn, "B", 20)
    assert groups(claim(conn, queues=["q"], max_jobs=3)) == ["A", "B", "A"]
    put(conn, "C", 5)  # a new group has never been served: it goes first
    assert groups(claim(conn, queues=["q"])) == ["C"]
    # then B (served before A's second turn), A, C, B ...
    assert groups(claim(conn, queues=["q"], max_jobs=4)) == ["B", "A", "C", "B"]
    seq = cursors(conn)
    assert seq["A"] < seq["C"] < seq["B"]


def test_ties_between_never_served_groups_go_by_priority_run_at_id(conn: Conn) -> None:
    fair(conn)
    later = datetime.now(UTC) - timedelta(minutes=1)
    earlier = later - timedelta(minutes=5)
    put(conn, "late", 2, run_at=later.isoformat())
    put(conn, "early", 2, run_at=earlier.isoformat())
    put(conn, "urgent", 2, priority=-5, run_at=later.isoformat())
    put(conn, "plain", 2, run_at=later.isoformat())  # same run_at as "late", higher ids
    assert groups(claim(conn, queues=["q"], max_jobs=4)) == ["urgent", "early", "late", "plain"]


def test_within_a_group_jobs_go_by_priority_run_at_id(conn: Conn) -> None:
    fair(conn)
    a = put(conn, "A", 3)
    urgent = enqueue(conn, "k", queue="q", group_key="A", priority=-1)["id"]
    got = [r["id"] for r in claim(conn, queues=["q"], max_jobs=4)]
    assert got == [urgent, *a]


def test_ungrouped_jobs_take_turns_as_one_more_group(conn: Conn) -> None:
    fair(conn)
    put(conn, None, 30)
    put(conn, "A", 30)
    put(conn, "B", 30)
    got = groups(claim(conn, queues=["q"], max_jobs=9))
    assert collections.Counter(got) == {None: 3, "A": 3, "B": 3}
    for i in range(0, 9, 3):
        assert len(set(got[i : i + 3])) == 3, got


def test_a_simulated_run_serves_every_group_within_bounded_rounds(connect: ConnectFactory) -> None:
    setup = connect()
    fair(setup)
    put(setup, "A", 5000)
    for g in "BCDE":
        put(setup, g, 50)
    # each worker's first fair claim compiles the functions and plans its statements (tens of ms on a busy
    # machine): done on a warm-up queue first, so the picks' timestamps are not skewed by who compiled last
    fair(setup, queue="warm")
    for i in range(4):
        put(setup, f"w{i}", 1, queue="warm")
    served: list[tuple[float, str]] = []
    lock = threading.Lock()
    start = threading.Barrier(4)

    def worker(i: int) -> int:
        c = connect()
        complete(c, claim(c, f"w{i}", queues=["warm"]))
        start.wait(timeout=60)
        done = 0
        while True:
            rows = claim(c, f"w{i}", queues=["q"], max_jobs=2)
            if not rows:
                return done
            # ordered by the server's claim time (lease_expires_at: the claim's now() + the same lease for
            # all), not by when this thread got its answer: a thread descheduled after its claim returned
            # made the client's clock put a group served early among the late picks
            with lock:
                served.extend((r["lease_expires_at"].timestamp(), r["group_key"]) for r in rows)
            complete(c, rows)
            done += len(rows)
            if done >= 120:
                return done

    run_threads(4, worker, timeout=120)
    order = [g for _, g in sorted(served, key=lambda t: t[0])]
    assert len(order) >= 400
    # every group shows up within the first two rounds of picks ...
    assert set(order[:10]) == set("ABCDE")
    # ... and keeps being served: in every window of 20 consecutive picks while B-E still have work,
    # each of them appears (a FIFO would serve 5,000 jobs of A first)
    last = {g: max(i for i, x in enumerate(order) if x == g) for g in "BCDE"}
    last_small = max(last.values())
    for start in range(0, last_small - 20, 10):
        window = collections.Counter(order[start : start + 20])
        assert all(window[g] >= 1 for g in "BCDE" if last[g] >= start + 20), (start, window)
    # B-E (50 each) are drained after about 5 x 50 picks, not after A's 5,000
    assert last_small < 300, last_small
    assert collections.Counter(order[: last_small + 1])["A"] <= 80


def test_noisy_group_is_demoted(conn: Conn) -> None:
    fair(conn)  # noisy: >= 2 active jobs and more than 50 % of the queue's active jobs
    put(conn, "A", 10)
    put(conn, "B", 10)
    assert groups(claim(conn, queues=["q"], max_jobs=2)) == ["A", "B"]
    b1 = claim(conn, queues=["q"], max_jobs=2)  # A, B again: A holds 2 active jobs
    assert groups(b1) == ["A", "B"]
    complete(conn, [b1[1]])  # B back to 1 active
    # A was served before B (least recently served), but A is noisy: 2 of 3 active jobs
    assert groups(claim(conn, queues=["q"])) == ["B"]
    # without the demotion the ring would have given A
    call(conn, "configure_queue", queue="q", noisy_min_active=100)
    assert groups(claim(conn, queues=["q"])) == ["A"]


def test_among_noisy_groups_fewer_active_jobs_first(conn: Conn) -> None:
    fair(conn, noisy_share=0.2, noisy_min_active=2)
    put(conn, "A", 10)
    put(conn, "C", 10)
    got = claim(conn, queues=["q"], max_jobs=5)  # A C A C A: A holds 3, C 2 (both noisy)
    assert groups(got) == ["A", "C", "A", "C", "A"]
    # only noisy groups have work: C (2 active) before A (3 active), though A is served less recently
    assert groups(claim(conn, queues=["q"])) == ["C"]


def test_groups_leave_the_ring_without_pending_work_and_come_back_with_it(conn: Conn) -> None:
    """The ring holds the groups with pending work: a group whose jobs are all taken leaves it at the next
    claim that reads it, and a job that becomes pending later (a scheduled one coming due) brings it back."""
    fair(conn)
    put(conn, "done", 2)
    put(conn, "busy", 1)
    [later] = put(conn, "later", 1, run_at=(datetime.now(UTC) + timedelta(days=1)).isoformat())
    rows = claim(conn, queues=["q"], max_jobs=10)
    assert sorted(groups(rows)) == ["busy", "done", "done"]
    complete(conn, [r for r in rows if r["group_key"] != "busy"])
    assert claim(conn, queues=["q"]) == []
    assert set(cursors(conn)) == set()
    conn.execute("UPDATE pgjobs.jobs SET run_at = now() - interval '1 second' WHERE id = %s", [later])
    assert [r["id"] for r in claim(conn, queues=["q"])] == [later]


def test_ring_stays_the_size_of_the_live_groups(conn: Conn) -> None:
    fair(conn)
    for round_ in range(5):
        for g in range(40):
            put(conn, f"r{round_}-g{g}", 1)
        while rows := claim(conn, queues=["q"], max_jobs=16):
            complete(conn, rows)
    assert cursors(conn) == {}


def test_plain_path_unchanged(conn: Conn) -> None:
    # an unconfigured queue (and one configured without fairness or caps) claims in plain claim order,
    # groups or not, and never touches the fairness tables
    call(conn, "configure_queue", queue="p2", max_length=100)
    for q in ("p1", "p2"):
        a = put(conn, "A", 5, queue=q)
        b = put(conn, "B", 5, queue=q)
        got = [r["id"] for r in claim(conn, queues=[q], max_jobs=7)]
        assert got == a + b[:2]
    assert conn.execute("SELECT count(*) FROM pgjobs.fair_rings").fetchone() == (0,)


def test_plain_and_fair_queues_in_one_claim(conn: Conn) -> None:
    fair(conn, "f")
    put(conn, "A", 5, queue="f")
    put(conn, "B", 5, queue="f")
    plain = put(conn, None, 2, queue="p")
    got = claim(conn, queues=["p", "f"], max_jobs=6)
    assert [r["id"] for r in got[:2]] == plain
    assert groups(got[2:]) == ["A", "B", "A", "B"]


def test_kind_limits_on_a_fair_queue(conn: Conn) -> None:
    fair(conn)
    put(conn, "A", 5, kind="x")
    put(conn, "A", 5, kind="y")
    put(conn, "B", 5, kind="y")
    put(conn, "C", 5, kind="z")
    got = claim(conn, queues=["q"], max_jobs=10, kind_limits={"y": 3, "x": 1})
    kinds = collections.Counter(r["kind"] for r in got)
    assert kinds == {"y": 3, "x": 1}  # only listed kinds, at most n of each
    assert "C" not in groups(got)
    assert claim(conn, queues=["q"], kind_limits={}) == []
    assert claim(conn, queues=["q"], kind_limits={"x": 0}) == []
    # JSON 2.0 is 2
    assert len(claim(conn, queues=["q"], max_jobs=5, kind_limits={"z": 2.0})) == 2


def test_expired_lease_is_reclaimed_on_a_fair_queue(conn: Conn) -> None:
    fair(conn)
    [first] = put(conn, "A", 1)
    got = claim(conn, "w1", queues=["q"])
    assert [r["id"] for r in got] == [first]
    assert claim(conn, "w2", queues=["q"]) == []
    expire(conn, first)
    again = claim(conn, "w2", queues=["q"])
    assert [(r["id"], r["attempt"]) for r in again] == [(first, 2)]
    row = conn.execute("SELECT state, leased_by, last_error, errors FROM pgjobs.jobs WHERE id = %s", [first]).fetchone()
    assert row is not None and row[:3] == ("active", "w2", "lease expired")
    assert row[3][-1]["worker"] == "w1"
    # the first worker's token no longer holds the job
    assert call(conn, "complete", id=first, lease_token=got[0]["lease_token"])[0]["complete"] is False


@pytest.mark.parametrize("capped", [False, True])
def test_expired_leases_out_of_attempts_or_cancelled_are_settled_by_a_fair_claim(conn: Conn, capped: bool) -> None:
    """On a claim of one fair queue claim() leaves its probe for leases to settle to the fair claim's count of
    the active jobs (one pass over jobs_active_idx, which a held snapshot makes long): a job whose lease ran
    out on its last attempt ends failed, one whose cancellation was requested ends cancelled, and neither
    counts as active any more in that claim (a queue capped at 2 active jobs gives the third job at once)."""
    fair(conn, max_active=2 if capped else None)
    [last] = put(conn, "A", 1, max_attempts=1)
    [stop] = put(conn, "B", 1)
    [third] = put(conn, "C", 1)
    assert sorted(r["id"] for r in claim(conn, "w1", queues=["q"], max_jobs=2)) == sorted([last, stop])
    assert call(conn, "cancel", id=stop)[0]["cancel"] is True
    expire(conn, last)
    expire(conn, stop)
    assert [r["id"] for r in claim(conn, "w2", queues=["q"], max_jobs=5)] == [third]
    rows = conn.execute("SELECT id, state::text FROM pgjobs.jobs WHERE id = ANY (%s)", [[last, stop]]).fetchall()
    states = dict(rows)
    assert states == {last: "failed", stop: "cancelled"}


def test_due_scheduled_jobs_are_claimable_on_a_fair_queue(conn: Conn) -> None:
    fair(conn)
    soon = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    [s] = put(conn, "A", 1, run_at=soon)
    assert claim(conn, queues=["q"]) == []
    conn.execute("UPDATE pgjobs.jobs SET run_at = now() - interval '1 second' WHERE id = %s", [s])
    assert [r["id"] for r in claim(conn, queues=["q"])] == [s]


def test_concurrent_fair_claimers_never_share_a_job(connect: ConnectFactory) -> None:
    setup = connect()
    fair(setup)
    for g in range(20):
        put(setup, f"g{g}", 30)

    def worker(i: int) -> list[int]:
        c = connect()
        mine: list[int] = []
        while True:
            rows = claim(c, f"w{i}", queues=["q"], max_jobs=7)
            mine += [r["id"] for r in rows]
            # An empty claim may only mean the rest is locked by the other claimers at this instant (SKIP
            # LOCKED): stop once nothing is left to claim.
            if (
                not rows
                and not c.execute(
                    "SELECT EXISTS (SELECT 1 FROM pgjobs.jobs WHERE queue = 'q' AND state = 'pending')"
                ).fetchone()[0]
            ):  # type: ignore[index]
                return mine

    results = run_threads(6, worker, timeout=120)
    ids = [i for r in results for i in r]
    assert len(ids) == len(set(ids)) == 600


def test_fair_claim_plans_stay_on_indexes(conn: Conn) -> None:
    """10,000 groups, 200,000 queued jobs: every statement a fair claim runs reads indexes, never a whole
    table, and the claim reads a small, bounded number of buffers (not the groups' backlogs)."""
    try:
        conn.execute("LOAD 'auto_explain'")
    except psycopg.Error:
        pytest.skip("auto_explain is not available on this server")
    fair(conn)
    conn.execute(
        "INSERT INTO pgjobs.jobs (kind, queue, group_key) SELECT 'k', 'q', 'tenant-' || (i % 10000)"
        " FROM generate_series(1, 200000) AS i"
    )
    conn.execute(
        "INSERT INTO pgjobs.jobs (kind, queue, group_key) SELECT 'k', 'plain', NULL FROM generate_series(1, 50000)"
    )
    conn.execute("ANALYZE pgjobs.jobs")
    for _ in range(20):  # warm up: cursors registered, plans cached (generic plans included)
        complete(conn, claim(conn, queues=["q"], max_jobs=10))

    plans: list[dict[str, Any]] = []
    conn.add_notice_handler(lambda d: plans.append(_plan(d.message_primary or "")))
    for setting in (
        "auto_explain.log_min_duration = 0",
        "auto_explain.log_nested_statements = on",
        "auto_explain.log_analyze = on",
        "auto_explain.log_timing = off",
        "auto_explain.log_buffers = on",
        "auto_explain.log_format = json",
        "auto_explain.log_level = notice",
    ):
        conn.execute(f"SET {setting}")
    rows = claim(conn, queues=["q"], max_jobs=10)
    conn.execute("SET auto_explain.log_min_duration = -1")
    assert len(rows) == 10
    plans = [p for p in plans if p]
    assert len(plans) > 10

    seq_scans = [(_text(p), n) for p in plans for n in _nodes(p["Plan"]) if n["Node Type"] == "Seq Scan"]
    scanned = [s for s in seq_scans if s[1].get("Relation Name") in ("jobs", "fair_rings_0", "fair_rings_1")]
    assert not scanned, scanned
    outer = [p for p in plans if re.search(r'pgjobs\."?claim"?\(', _text(p))]
    assert outer, [_text(p) for p in plans]
    buffers = sum(n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0) for n in [outer[0]["Plan"]])
    # the claim's whole tree of statements: a few hundred pages, far below the 200,000 jobs' heap and indexes
    assert buffers < 3000, buffers


def _plan(message: str) -> dict[str, Any]:
    m = re.search(r"\{.*\}", message, re.S)
    return json.loads(m.group(0)) if m else {}


def _text(plan: dict[str, Any]) -> str:
    return str(plan.get("Query Text", ""))


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    out = [node]
    for child in node.get("Plans", []):
        out += _nodes(child)
    return out


# ---------------------------------------------------------------------------------------------------------
# pgjobs queue configure / show


def _cli(dsn: str, *argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from pgjobs.cli import main

    code = main(["--dsn", dsn, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_queue_configure_and_show(dsn: str, conn: Conn, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(
        dsn,
        "queue",
        "configure",
        "mail",
        "--fair",
        "--max-active-per-group",
        "5",
        "--max-active",
        "20",
        "--noisy-share",
        "0.25",
        "--noisy-min-active",
        "3",
        "--status-events",
        "terminal",
        capsys=capsys,
    )
    assert code == 0, err
    row = conn.execute(
        "SELECT fair, max_active_per_group, max_active, noisy_share, noisy_min_active, status_events, paused"
        " FROM pgjobs.queues WHERE queue = 'mail'"
    ).fetchone()
    assert row == (True, 5, 20, 0.25, 3, "terminal", False)
    assert "mail" in out

    code, out, err = _cli(dsn, "queue", "configure", "mail", "--no-fair", "--max-active", "0", "--pause", capsys=capsys)
    assert code == 0, err
    row = conn.execute("SELECT fair, max_active, max_active_per_group, paused FROM pgjobs.queues WHERE queue = 'mail'")
    assert row.fetchone() == (False, None, 5, True)

    code, out, err = _cli(dsn, "queue", "show", capsys=capsys)
    assert code == 0, err
    assert "mail" in out and "paused" in out

    code, out, err = _cli(dsn, "queue", "show", "mail", "--json", capsys=capsys)
    assert code == 0, err
    shown = json.loads(out)
    assert shown["queue"] == "mail" and shown["paused"] is True and shown["max_active_per_group"] == 5


def test_cli_queue_errors(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(dsn, "queue", "configure", "q", "--noisy-share", "1.5", capsys=capsys)
    assert code == 2 and "--noisy-share" in err
    code, _, err = _cli(dsn, "queue", "configure", "", "--fair", capsys=capsys)
    assert code == 1 and "queue must be a non-empty string" in err
    code, _, err = _cli(dsn, "queue", "show", "nowhere", capsys=capsys)
    assert code == 0  # an unconfigured queue has the defaults
    code, _, err = _cli(dsn, "queue", "configure", "q", "--fair", "--no-fair", capsys=capsys)
    assert code == 2 and "not allowed with" in err


def test_a_group_passed_over_in_a_call_keeps_its_place(conn: Conn) -> None:
    fair(conn)
    for g in "ABC":
        put(conn, g, 5)
    put(conn, None, 5)
    assert groups(claim(conn, queues=["q"], max_jobs=4)) == ["A", "B", "C", None]
    assert groups(claim(conn, queues=["q"])) == ["A"]
    # ring now: B, C, ungrouped, A. Three picks: B, C, then the ungrouped turn fills the call; A, read
    # in the same pass, was not served and stays first in line
    assert groups(claim(conn, queues=["q"], max_jobs=3)) == ["B", "C", None]
    assert groups(claim(conn, queues=["q"])) == ["A"]


def test_work_that_comes_without_a_new_job_is_found_by_the_next_claim(conn: Conn) -> None:
    """A group gets claimable work without any job being inserted (a scheduled job comes due, a job is
    retried): the change is a filing, so the next claim sees the group, and a drained queue finds it at once."""
    fair(conn)
    put(conn, "A", 100)
    [later] = put(conn, "B", 1, run_at=(datetime.now(UTC) + timedelta(days=1)).isoformat())
    [u] = put(conn, None, 1, run_at=(datetime.now(UTC) + timedelta(days=1)).isoformat())
    assert groups(claim(conn, queues=["q"])) == ["A"]
    conn.execute("UPDATE pgjobs.jobs SET run_at = now() - interval '1 second' WHERE id IN (%s, %s)", [later, u])
    assert groups(claim(conn, queues=["q"], max_jobs=3)) == ["B", None, "A"]  # never served first

    # and a drained queue finds such work at once
    while rows := claim(conn, queues=["q"], max_jobs=50):
        complete(conn, rows)
    [c] = put(conn, "C", 1, run_at=(datetime.now(UTC) + timedelta(days=1)).isoformat())
    assert claim(conn, queues=["q"]) == []
    conn.execute("UPDATE pgjobs.jobs SET run_at = now() - interval '1 second' WHERE id = %s", [c])
    assert [r["id"] for r in claim(conn, queues=["q"])] == [c]


def test_a_backlog_of_many_groups_is_served_round_robin(conn: Conn) -> None:
    """100 groups (more than one discovery sweep takes per claim) loaded at once, then worked off with no
    new job: every group is served once before any is served twice."""
    fair(conn)
    jobs = [{"kind": "k", "queue": "q", "group_key": f"g{g:03}"} for _ in range(3) for g in range(100)]
    call(conn, "enqueue_many", jobs=jobs)
    picks: list[str | None] = []
    for _ in range(40):
        picks += groups(claim(conn, queues=["q"], max_jobs=5))
    assert len(picks) == 200
    assert sorted(picks[:100]) == [f"g{g:03}" for g in range(100)]
    assert sorted(picks[100:]) == [f"g{g:03}" for g in range(100)]
