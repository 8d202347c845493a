"""Rate limits (sql/rate_limits.sql): at most max_starts starts in any window of length per (+ burst), across
every connection, per key (a job's rate_key) and per queue. Starts are counted from the claims' own times (a
claim's now(), read back as lease_expires_at - lease), never timed by the test.
"""

from __future__ import annotations

import itertools
import threading
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.foundation import (
    call,
    claim,
    claim_index_visits,
    count,
    enqueue,
    enqueue_n,
    expire,
    held_snapshot,
    raises_pj,
    run_threads,
    scalar,
    vacuum_clean,
)

Conn = psycopg.Connection[Any]
LEASE = timedelta(seconds=600)


def limit(conn: Conn, key: str, max_starts: int, per: str, burst: int = 0) -> None:
    conn.execute("SELECT pgjobs.configure_rate_limit(%s, %s, %s::interval, %s)", (key, max_starts, per, burst))


def starts(rows: list[dict[str, Any]]) -> list[datetime]:
    return [r["lease_expires_at"] - LEASE for r in rows]


def most_in_a_window(times: list[datetime], per: timedelta) -> int:
    """The largest number of starts in any half-open window [t, t + per)."""
    times = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - per:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def race(connect: ConnectFactory, threads: int, until: int, **claim_args: Any) -> list[dict[str, Any]]:
    """`threads` connections claim in turn until `until` jobs started in all; every row they got."""
    got: list[dict[str, Any]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def one(i: int) -> None:
        c = connect()
        while not stop.is_set():
            rows = claim(c, f"w{i}", lease=LEASE, **claim_args)
            with lock:
                got.extend(rows)
                if len(got) >= until:
                    stop.set()
            stop.wait(0.005)

    run_threads(threads, one, timeout=120)
    return got


def test_racing_connections_never_start_more_than_the_limit_plus_burst_in_any_window(
    conn: Conn, connect: ConnectFactory
) -> None:
    limit(conn, "api", 10, "500 milliseconds", burst=2)
    enqueue_n(conn, 300, "call", queue="q", rate_key="api")
    got = race(connect, 4, 45, queues=["q"], max_jobs=5)
    ids = [r["id"] for r in got]
    assert len(ids) == len(set(ids)), "no job was started twice"
    assert count(conn, "state = 'active'") == len(got)
    assert most_in_a_window(starts(got), timedelta(milliseconds=500)) <= 12
    # the tokens the claims took are the starts, as the log records them: one row a token
    assert conn.execute("SELECT count(*) FROM pgjobs.rate_starts WHERE key = 'api'").fetchone() == (len(got),)


def test_six_connections_racing_for_a_key_never_start_more_than_its_window_holds(
    conn: Conn, connect: ConnectFactory
) -> None:
    """Six connections claim jobs of a key limited to 20 starts a second (and a second key, 20 + burst 5) for
    a few seconds of their own clocks: from the starts the attempts record (lease_expires_at - lease), no
    window of one second ever holds more than max_starts + burst, and the log holds every start in order."""
    limit(conn, "k", 20, "1 second")
    limit(conn, "b", 20, "1 second", burst=5)
    enqueue_n(conn, 200, "call", queue="q", rate_key="k")
    enqueue_n(conn, 200, "call", queue="q", rate_key="b")
    got = race(connect, 6, 160, queues=["q"], max_jobs=3)
    keys = dict(conn.execute("SELECT id, rate_key FROM pgjobs.jobs").fetchall())
    ids = [r["id"] for r in got]
    assert len(ids) == len(set(ids)), "no job was started twice"
    for key, allowed in (("k", 20), ("b", 25)):
        mine = starts([r for r in got if keys[r["id"]] == key])
        assert len(mine) > allowed, "the race ran past the first window"
        assert most_in_a_window(mine, timedelta(seconds=1)) <= allowed, key
        # one row a start, seq 1.. in order, the logged times never decreasing and none before its start
        log = conn.execute(
            "SELECT seq, started_at FROM pgjobs.rate_starts WHERE key = %s ORDER BY seq", [key]
        ).fetchall()
        assert [r[0] for r in log] == list(range(1, len(mine) + 1))
        assert all(a[1] <= b[1] for a, b in itertools.pairwise(log))
        assert all(s <= t for s, t in zip(sorted(mine), [r[1] for r in log], strict=True))


def test_the_window_counts_the_same_by_its_range_and_by_bisection(conn: Conn) -> None:
    """A claim's ask reads its range of the log; a display's (list_rate_limits asks for all n) finds the first
    token taken by bisection. 150 starts in a window of 200 an hour, the first 60 moved two hours back: the
    200 - 150 tokens the log never held and the 60 freed are free, the 90 others taken."""
    limit(conn, "k", 200, "1 hour")
    enqueue_n(conn, 150, "call", rate_key="k")
    assert len(claim(conn, max_jobs=150)) == 150
    conn.execute("UPDATE pgjobs.rate_starts SET started_at = started_at - interval '2 hours' WHERE seq <= 60")
    first_taken = conn.execute("SELECT started_at FROM pgjobs.rate_starts WHERE seq = 61").fetchone()[0]
    for want in (10, 64, 65, 110, 111, 200):
        tokens, next_at, now = conn.execute(
            "SELECT tokens, next_at, now() FROM pgjobs._rate_window('key', 'k', now(), %s)", [want]
        ).fetchone()
        assert tokens == min(want, 110), want
        assert next_at == (now if want <= 110 else first_taken + timedelta(hours=1)), want
    assert [(r["tokens"], r["next_token_at"] is not None) for r in call(conn, "list_rate_limits")] == [(110, True)]


def test_a_queue_limit_and_a_key_limit_together_hold_both(conn: Conn, connect: ConnectFactory) -> None:
    conn.execute("SELECT pgjobs.configure_queue('q', max_starts => 8, per => '400 milliseconds')")
    limit(conn, "a", 3, "400 milliseconds")
    enqueue_n(conn, 100, "call", queue="q", rate_key="a")
    enqueue_n(conn, 100, "call", queue="q")
    got = race(connect, 3, 40, queues=["q"], max_jobs=4)
    keyed = {r[0] for r in conn.execute("SELECT id FROM pgjobs.jobs WHERE rate_key = 'a'").fetchall()}
    assert most_in_a_window(starts(got), timedelta(milliseconds=400)) <= 8
    assert most_in_a_window(starts([r for r in got if r["id"] in keyed]), timedelta(milliseconds=400)) <= 3
    assert any(r["id"] in keyed for r in got) and any(r["id"] not in keyed for r in got)


def test_a_retry_is_a_start(conn: Conn) -> None:
    limit(conn, "k", 1, "1 hour", burst=1)  # two starts now, then one an hour
    job = enqueue(conn, rate_key="k")["id"]
    assert [r["attempt"] for r in claim(conn)] == [1]
    expire(conn, job)
    assert [r["attempt"] for r in claim(conn)] == [2], "the reclaim took the second token"
    expire(conn, job)
    assert claim(conn) == [], "no token left for a third start"
    assert conn.execute("SELECT attempt FROM pgjobs.jobs WHERE id = %s", [job]).fetchone() == (2,)


def test_a_key_without_tokens_holds_back_its_jobs_and_the_claim_takes_the_others(conn: Conn) -> None:
    limit(conn, "k", 1, "1 hour")
    keyed = enqueue_n(conn, 20, "call", rate_key="k")  # first in claim order
    plain = enqueue_n(conn, 5, "call")
    other = enqueue_n(conn, 2, "call", rate_key="unlimited")  # a key without a limit is unlimited
    got = [r["id"] for r in claim(conn, max_jobs=10)]
    assert sorted(got) == sorted([keyed[0], *plain, *other])
    assert count(conn, "state = 'scheduled' AND rate_held_until = run_at") == 19
    assert claim(conn, max_jobs=10) == []
    later = enqueue(conn, "call")["id"]
    assert [r["id"] for r in claim(conn, max_jobs=10)] == [later]


def test_held_back_jobs_are_not_read_again_by_later_claims(conn: Conn) -> None:
    """A backlog of 2,000 jobs of an exhausted key: once held back, a claim reads about as many index
    entries as with no backlog at all. (Held back, a job leaves a dead entry in the pending index, as a
    claimed one does; VACUUM takes those, as it takes the claimed jobs'.)"""
    limit(conn, "k", 1, "1 hour")
    enqueue_n(conn, 2000, "call", rate_key="k")
    claim(conn, max_jobs=10)  # takes one, holds back 1,000 (a claim holds back at most that many a key)
    claim(conn, max_jobs=10)  # holds back the rest
    assert count(conn, "state = 'pending'") == 0
    vacuum_clean(conn, "jobs_live")
    enqueue(conn, "call")
    before = claim_index_visits(conn)
    assert len(claim(conn, max_jobs=10)) == 1
    visits = claim_index_visits(conn) - before
    assert visits < 50, visits


def test_a_queue_limit_clamps_the_claim_and_0_removes_it(conn: Conn) -> None:
    conn.execute("SELECT pgjobs.configure_queue('q', max_starts => 3, per => '1 hour')")
    enqueue_n(conn, 10, "call", queue="q")
    enqueue_n(conn, 4, "call", queue="free")
    # a window of 3 starts an hour: 3 now, the next ones an hour after them
    assert len(claim(conn, queues=["q"], max_jobs=10)) == 3
    assert claim(conn, queues=["q"], max_jobs=10) == []
    both = claim(conn, queues=["q", "free"], max_jobs=10)
    assert [r["queue"] for r in both] == ["free"] * 4, "the other queue is still claimed"
    # a claim of a limited queue and others takes the limited queue's tokens, then the others' jobs
    conn.execute("SELECT pgjobs.configure_queue('q2', max_starts => 1, per => '1 hour')")
    enqueue_n(conn, 5, "call", queue="q2")
    enqueue_n(conn, 5, "call", queue="free")
    assert sorted(r["queue"] for r in claim(conn, queues=["free", "q2"], max_jobs=3)) == ["free", "free", "q2"]
    conn.execute("SELECT pgjobs.configure_queue('q', max_starts => 0)")
    assert len(claim(conn, queues=["q"], max_jobs=10)) == 7
    assert [r["key"] for r in call(conn, "list_rate_limits")] == ["q2"]


def test_removing_a_key_limit_releases_its_held_jobs(conn: Conn) -> None:
    limit(conn, "k", 1, "1 hour")
    enqueue_n(conn, 5, "call", rate_key="k")
    assert len(claim(conn, max_jobs=5)) == 1
    limit(conn, "k", 0, "1 hour")
    assert [r["key"] for r in call(conn, "list_rate_limits")] == []
    assert len(claim(conn, max_jobs=5)) == 4


def test_explain_names_the_limit_and_its_next_token(conn: Conn) -> None:
    limit(conn, "k", 1, "1 hour")
    _a, b = enqueue_n(conn, 2, "call", rate_key="k")
    claim(conn, max_jobs=5)
    why = scalar(conn, "explain", id=b)
    assert why["reason"] == "rate_limited" and why["rate_key"] == "k", why
    # the token frees an hour after the start that took it
    first = conn.execute("SELECT started_at FROM pgjobs.rate_starts WHERE key = 'k' AND seq = 1").fetchone()[0]
    assert datetime.fromisoformat(why["next_token_at"]) == first + timedelta(hours=1)
    conn.execute("SELECT pgjobs.configure_queue('q', max_starts => 1, per => '1 hour')")
    enqueue_n(conn, 2, "call", queue="q")
    _first, second = (r[0] for r in conn.execute("SELECT id FROM pgjobs.jobs WHERE queue = 'q' ORDER BY id"))
    claim(conn, queues=["q"])
    why = scalar(conn, "explain", id=second)
    assert why["reason"] == "rate_limited" and why["scope"] == "queue" and why["queue"] == "q", why
    assert datetime.fromisoformat(why["next_token_at"]) > datetime.fromisoformat(
        conn.execute("SELECT now()::text").fetchone()[0]
    )


def test_the_poller_s_next_due_time_is_the_next_token(conn: Conn) -> None:
    limit(conn, "k", 10, "1 second")
    enqueue_n(conn, 15, "call", rate_key="k")
    assert len(claim(conn, max_jobs=15)) == 10
    due = scalar(conn, "next_due_within", queues=["default"], within="1 minute")
    held = conn.execute("SELECT min(run_at) FROM pgjobs.jobs WHERE state = 'scheduled'").fetchone()[0]
    assert due == held
    # the jobs held back come due when the tokens free: a second after the starts that took them
    started = conn.execute("SELECT max(started_at) FROM pgjobs.rate_starts WHERE key = 'k'").fetchone()[0]
    assert held == started + timedelta(seconds=1)
    conn.execute("SELECT pgjobs.configure_queue('q', max_starts => 1, per => '10 seconds')")
    enqueue_n(conn, 2, "call", queue="q")
    claim(conn, queues=["q"])
    started = conn.execute("SELECT started_at FROM pgjobs.rate_starts WHERE scope = 'queue'").fetchone()[0]
    assert scalar(conn, "next_due_within", queues=["q"], within="1 minute") == started + timedelta(seconds=10)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("k", -1, "1 second", 0), "max_starts must be >= 0 (0 removes the limit), got -1"),
        (("k", 5, "0 seconds", 0), "per must be a positive interval of at most 100 years, got 00:00:00"),
        (("k", 5, "-1 second", 0), "got -00:00:01"),
        (("k", 5, "1 second", -2), "burst must be >= 0, got -2"),
        (("", 5, "1 second", 0), "key"),
        (("k", 5, None, 0), "per must not be NULL"),
    ],
)
def test_bad_limits_are_refused_naming_the_value_and_change_nothing(
    conn: Conn, args: tuple[Any, ...], fragment: str
) -> None:
    limit(conn, "k", 3, "1 minute")
    with raises_pj("PJ002", fragment):
        conn.execute("SELECT pgjobs.configure_rate_limit(%s, %s, %s::interval, %s)", args)
    assert [(r["key"], r["max_starts"]) for r in call(conn, "list_rate_limits")] == [("k", 3)]


def test_configure_queue_refuses_a_bad_limit_and_changes_nothing(conn: Conn) -> None:
    with raises_pj("PJ002", "max_starts must be >= 0", "-3"):
        conn.execute("SELECT pgjobs.configure_queue('q', paused => true, max_starts => -3, per => '1 second')")
    with raises_pj("PJ002", "a new one needs max_starts and per"):
        conn.execute("SELECT pgjobs.configure_queue('q', paused => true, max_starts => 3)")
    assert conn.execute("SELECT count(*) FROM pgjobs.queues WHERE queue = 'q'").fetchone() == (0,)
    # the old signature's callers: every earlier parameter by name and in its place
    conn.execute("SELECT pgjobs.configure_queue('q', 10, false, false, 0.5, 2, NULL, NULL, 'all', NULL)")


def test_a_bad_rate_key_is_refused(conn: Conn) -> None:
    with raises_pj("PJ002", "rate_key"):
        enqueue(conn, rate_key="")
    with raises_pj("PJ002", "rate_key", "5"):
        call(conn, "enqueue_many", jobs=[{"kind": "k", "rate_key": 5}])
    with raises_pj("PJ002", "rate_key"):
        call(conn, "enqueue_many", jobs=[{"kind": "k", "rate_key": 5, "depends_on": []}])
    assert count(conn) == 0
    call(conn, "enqueue_many", jobs=[{"kind": "k", "rate_key": "a"}, {"kind": "k", "rate_key": "b", "unique_key": "u"}])
    assert [r[0] for r in conn.execute("SELECT rate_key FROM pgjobs.jobs ORDER BY id")] == ["a", "b"]


def test_maintenance_keeps_the_log_rows_a_claim_still_reads(conn: Conn) -> None:
    limit(conn, "k", 3, "1 hour", burst=2)  # a window of 5 starts an hour
    enqueue_n(conn, 10, "call", rate_key="k")
    assert len(claim(conn, max_jobs=10)) == 5
    limit(conn, "gone", 5, "1 second")
    enqueue(conn, queue="g", rate_key="gone")
    assert len(claim(conn, queues=["g"])) == 1
    limit(conn, "gone", 0, "1 second")
    assert conn.execute("SELECT count(*) FROM pgjobs.rate_starts").fetchone() == (6,)
    limit(conn, "k", 1, "1 hour")  # a window of 1: a claim reads the newest row only
    conn.execute("SELECT * FROM pgjobs.maintain_history()")
    assert conn.execute("SELECT key, seq FROM pgjobs.rate_starts").fetchall() == [("k", 5)]
    assert claim(conn, max_jobs=10) == [], "the row kept is the start that holds the window"


def limiter_reads(conn: Conn) -> tuple[int, int]:
    """(index entries, buffers) this transaction's reads of the limiter's log asked for so far: entries
    returned by rate_starts_pkey, buffers of the table and the index (hits and reads, inserts included)."""
    row = conn.execute(
        "SELECT pg_stat_get_xact_tuples_returned('pgjobs.rate_starts_pkey'::regclass),"
        " pg_stat_get_xact_blocks_fetched('pgjobs.rate_starts_pkey'::regclass)"
        " + pg_stat_get_xact_blocks_fetched('pgjobs.rate_starts'::regclass)"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_under_a_held_snapshot_the_limiter_reads_the_same_after_1000_and_after_5000_starts(
    conn: Conn, connect: ConnectFactory
) -> None:
    """A claim that wants k tokens reads the newest row of the log (one backward descent) and the k rows n
    places below it (one range), and appends k rows. Maintenance deletes the rows below those, and a held
    snapshot keeps them as dead entries, all of them below every range a claim reads: eight probe claims of
    10 jobs read the same entries and buffers within 10 % after 1,000 and after 5,000 starts."""
    limit(conn, "k", 1, "1 microsecond", burst=99)  # a window of 100: rows s-99 .. on, long free
    enqueue_n(conn, 5400, "call", rate_key="k")
    measured = {}
    with held_snapshot(connect):
        started = 0
        for target in (1000, 5000):
            while started < target:
                started += len(claim(conn, max_jobs=100))
            conn.execute("SELECT * FROM pgjobs.maintain_history()")  # the rows below deleted: dead to the snapshot
            assert conn.execute("SELECT count(*) FROM pgjobs.rate_starts").fetchone() == (100,)
            conn.execute("BEGIN")
            before = limiter_reads(conn)
            for _ in range(8):
                assert len(claim(conn, max_jobs=10)) == 10
            after = limiter_reads(conn)
            conn.execute("COMMIT")
            started += 80
            measured[target] = (after[0] - before[0], after[1] - before[1])
    (e1, b1), (e2, b2) = measured[1000], measured[5000]
    assert e2 <= e1 * 1.1 and b2 <= b1 * 1.1, measured
    # per claim: two descents to the newest row (one to count, one to take) and the range of 10 rows
    assert e1 <= 8 * (2 + 10), measured


def test_a_key_limit_holds_on_a_fair_queue_too(conn: Conn) -> None:
    conn.execute("SELECT pgjobs.configure_queue('f', fair => true)")
    limit(conn, "k", 1, "1 hour")
    keyed = [enqueue(conn, "call", queue="f", group_key="g1", rate_key="k")["id"] for _ in range(5)]
    other = [enqueue(conn, "call", queue="f", group_key="g2")["id"] for _ in range(3)]
    got = {r["id"] for r in claim(conn, queues=["f"], max_jobs=10)}
    assert got == {keyed[0], *other}
    assert claim(conn, queues=["f"], max_jobs=10) == []
    limit(conn, "k", 0, "1 hour")  # the held jobs are due at once
    assert {r["id"] for r in claim(conn, queues=["f"], max_jobs=10)} == set(keyed[1:])


def test_a_queue_whose_jobs_never_name_a_key_is_claimed_without_the_rated_path(conn: Conn) -> None:
    """With a key limit configured, only the queues that ever had a job with a rate_key pay for the check
    (rate_queues); the others are claimed as with no limit at all."""
    limit(conn, "k", 10, "1 second")
    enqueue_n(conn, 3, "call", queue="plain")
    enqueue_n(conn, 3, "call", queue="keyed", rate_key="k")
    call(conn, "enqueue_many", jobs=[{"kind": "call", "queue": "bulk", "rate_key": "k"}, {"kind": "call"}])
    assert [r[0] for r in conn.execute("SELECT queue FROM pgjobs.rate_queues ORDER BY 1")] == ["bulk", "keyed"]
    conn.execute("SET track_functions = 'pl'")

    def rated_calls(queue: str) -> int:
        conn.execute("BEGIN")
        claim(conn, queues=[queue], max_jobs=3)
        row = conn.execute("SELECT pg_stat_get_xact_function_calls('pgjobs._claim_rated'::regproc)").fetchone()
        conn.execute("COMMIT")
        assert row is not None
        return int(row[0] or 0)

    assert rated_calls("plain") == 0
    assert rated_calls("keyed") == 1
