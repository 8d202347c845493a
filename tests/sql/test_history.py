"""Live jobs apart from finished ones (sql/history.sql): where rows live, unique keys in job_keys (races across
live and finished jobs), purge and retention by whole slices, maintenance, and the row-movement races (a
call that waits on a row which the holder moves to history must answer, not fail with 40001)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

Conn = psycopg.Connection[Any]


def _where(conn: Conn, job_id: int) -> str:
    row = conn.execute("SELECT tableoid::regclass::text FROM pgjobs.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def _claim(conn: Conn, queue: str = "default", n: int = 1) -> list[tuple[int, Any]]:
    return [(r[0], r[1]) for r in conn.execute("SELECT id, lease_token FROM pgjobs.claim('w', %s, %s)", ([queue], n))]


def _enqueue(conn: Conn, kind: str = "k", **kw: Any) -> int:
    args = ", ".join(f"{k} => %({k})s" for k in kw)
    row = conn.execute(
        f"SELECT id FROM pgjobs.enqueue(kind => %(kind)s{', ' + args if args else ''})", {"kind": kind, **kw}
    ).fetchone()
    assert row is not None
    return int(row[0])


def _blocked(conn: Conn, pid: int, timeout: float = 10.0) -> None:
    """Waits until backend `pid` waits on a lock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        if row is not None and row[0] == "Lock":
            return
        time.sleep(0.01)
    raise AssertionError(f"backend {pid} never waited on a lock")


def _race(connect: ConnectFactory, holder_sql: str, holder_args: tuple[Any, ...], call: Callable[[Conn], Any]) -> Any:
    """`holder_sql` runs in an open transaction (its row locks held, the row moved but not committed); `call`
    runs on another connection, waits on the lock, and gets its answer once the holder commits."""
    holder, waiter, watch = connect(), connect(), connect()
    holder.autocommit = False
    holder.execute(holder_sql, holder_args)
    out: dict[str, Any] = {}
    pid = waiter.info.backend_pid

    def run() -> None:
        try:
            out["value"] = call(waiter)
        except Exception as exc:  # the test asserts there was none
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    _blocked(watch, pid)
    holder.commit()
    t.join(30)
    assert "error" not in out, f"the waiting call failed: {out.get('error')!r}"
    return out["value"]


# -- where rows live --------------------------------------------------------------------------------------


def test_live_jobs_stay_in_jobs_live_and_finished_ones_move_to_their_slice(conn: Conn) -> None:
    job = _enqueue(conn)
    assert _where(conn, job) == "pgjobs.jobs_live"
    ((jid, tok),) = _claim(conn)
    assert conn.execute("SELECT pgjobs.complete(%s, %s)", (jid, tok)).fetchone() == (True,)
    today = conn.execute(
        "SELECT name FROM pgjobs.history_partitions WHERE tree = 'succeeded' AND lower <= now() AND upper > now()"
    ).fetchone()
    assert today is not None and _where(conn, job) == f"pgjobs.{today[0]}"
    failed = _enqueue(conn, max_attempts=1)
    ((fid, ftok),) = _claim(conn)
    assert conn.execute("SELECT pgjobs.fail(%s, %s, 'x')", (fid, ftok)).fetchone() == ("failed",)
    assert _where(conn, failed).startswith("pgjobs.jobs_failed_2")
    # the table outside readers know still shows every job, and stays updatable
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone() == (2,)
    conn.execute("UPDATE pgjobs.jobs SET completed_at = now() - interval '30 days' WHERE id = %s", (job,))
    assert _where(conn, job) == "pgjobs.jobs_succeeded_upto"
    # retry moves a finished job back to jobs_live
    assert conn.execute("SELECT pgjobs.retry(%s)", (failed,)).fetchone() == (True,)
    assert _where(conn, failed) == "pgjobs.jobs_live"


# -- unique keys ------------------------------------------------------------------------------------------


def test_concurrent_enqueues_of_one_key_make_one_job(connect: ConnectFactory) -> None:
    conns = [connect() for _ in range(8)]
    for c in conns:
        c.autocommit = False
    results: list[tuple[int, bool]] = []
    barrier = threading.Barrier(len(conns))

    def go(c: Conn) -> None:
        barrier.wait()
        row = c.execute("SELECT id, created FROM pgjobs.enqueue('k', unique_key => 'one')").fetchone()
        assert row is not None
        time.sleep(0.05)  # hold the key uncommitted while the others arrive
        c.commit()
        results.append((row[0], row[1]))

    threads = [threading.Thread(target=go, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 8 and len({r[0] for r in results}) == 1
    assert sorted(r[1] for r in results) == [False] * 7 + [True]


def test_a_key_blocks_across_finished_jobs_and_a_live_only_key_is_given_back(
    conn: Conn, connect: ConnectFactory
) -> None:
    held = _enqueue(conn, unique_key="forever")
    single = _enqueue(conn, unique_key="flight", unique_live_only=True)
    for jid, tok in _claim(conn, n=2):
        conn.execute("SELECT pgjobs.complete(%s, %s)", (jid, tok))
    assert _where(conn, held).startswith("pgjobs.jobs_succeeded_")
    assert conn.execute("SELECT id, created FROM pgjobs.enqueue('k', unique_key => 'forever')").fetchone() == (
        held,
        False,
    )
    # the live-only key left job_keys when its job ended: racing enqueuers make exactly one new job
    assert conn.execute("SELECT count(*) FROM pgjobs.job_keys WHERE unique_key = 'flight'").fetchone() == (0,)
    made: list[tuple[int, bool]] = []

    def go() -> None:
        with connect() as c:
            row = c.execute(
                "SELECT id, created FROM pgjobs.enqueue('k', unique_key => 'flight', unique_live_only => true)"
            ).fetchone()
            assert row is not None
            made.append((row[0], row[1]))

    threads = [threading.Thread(target=go) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len({m[0] for m in made}) == 1 and sum(m[1] for m in made) == 1 and made[0][0] != single
    # the old job cannot be retried while the new one holds the key; once that one is cancelled, it can
    conn.execute("UPDATE pgjobs.jobs SET state = 'failed' WHERE id = %s", (single,))
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT pgjobs.retry(%s)", (single,))
    assert err.value.sqlstate == "PJ004" and "unique key" in str(err.value)
    assert conn.execute("SELECT pgjobs.cancel(%s)", (made[0][0],)).fetchone() == (True,)
    assert conn.execute("SELECT pgjobs.retry(%s)", (single,)).fetchone() == (True,)
    assert conn.execute("SELECT job_id FROM pgjobs.job_keys WHERE unique_key = 'flight'").fetchone() == (single,)


def test_enqueue_many_keys_decide_within_a_call_and_against_history(conn: Conn) -> None:
    first = _enqueue(conn, unique_key="a")
    ((jid, tok),) = _claim(conn)
    conn.execute("SELECT pgjobs.complete(%s, %s)", (jid, tok))
    rows = conn.execute(
        "SELECT ref, id, created FROM pgjobs.enqueue_many(%s)",
        (
            '[{"kind": "k", "unique_key": "a", "ref": "old"}, {"kind": "k", "unique_key": "b", "ref": "b1"},'
            ' {"kind": "k", "unique_key": "b", "ref": "b2"}, {"kind": "k", "ref": "plain"}]',
        ),
    ).fetchall()
    by_ref = {r[0]: (r[1], r[2]) for r in rows}
    assert by_ref["old"] == (first, False)
    assert by_ref["b1"][1] is True and by_ref["b2"] == (by_ref["b1"][0], False)
    assert by_ref["plain"][1] is True
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone() == (3,)


# -- purge and retention by slice -------------------------------------------------------------------------


def _old(conn: Conn, n: int, queue: str = "default", age: str = "3 days", state: str = "succeeded") -> list[int]:
    return [
        r[0]
        for r in conn.execute(
            "INSERT INTO pgjobs.jobs (kind, queue, state, completed_at, unique_key)"
            " SELECT 'old', %s, %s::pgjobs.job_state, now() - %s::interval, 'old-' || %s || '-' || g"
            "   FROM generate_series(1, %s) AS g RETURNING id",
            (queue, state, age, queue, n),
        ).fetchall()
    ]


def _partitions(conn: Conn) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM pgjobs.history_partitions").fetchall()}


def test_purge_drops_whole_slices_and_deletes_rows_only_at_the_boundary(conn: Conn) -> None:
    old = _old(conn, 50)
    conn.execute(
        "INSERT INTO pgjobs.job_keys (kind, unique_key, job_id) SELECT kind, unique_key, id FROM pgjobs.jobs"
        " WHERE id = ANY (%s)",
        (old,),
    )
    recent = (
        _old(conn, 5, age="2 minutes")
        if conn.execute("SELECT now() - interval '2 minutes' >= date_bin('1 day', now(), '2000-01-01')").fetchone()
        == (True,)
        else []
    )
    fresh = _enqueue(conn)
    ((jid, tok),) = _claim(conn)
    conn.execute("SELECT pgjobs.complete(%s, %s)", (jid, tok))
    before = conn.execute("SELECT pg_stat_get_tuples_deleted('pgjobs.jobs_succeeded_upto'::regclass)").fetchone()
    assert before == (0,)
    removed = conn.execute("SELECT pgjobs.purge(succeeded_before => interval '1 minute')").fetchone()
    assert removed == (50 + len(recent),)
    # the slice that held the old jobs is gone whole (DROP TABLE, not 50 deletes); its keys went with it
    assert "jobs_succeeded_upto" not in _partitions(conn)
    assert conn.execute("SELECT to_regclass('pgjobs.jobs_succeeded_upto')").fetchone() == (None,)
    assert conn.execute("SELECT count(*) FROM pgjobs.job_keys WHERE job_id = ANY (%s)", (old,)).fetchone() == (0,)
    assert conn.execute("SELECT array_agg(id) FROM pgjobs.jobs").fetchone() == ([fresh],)
    assert conn.execute("SELECT pgjobs.purge(succeeded_before => interval '0')").fetchone() == (1,)


def test_a_slice_with_a_batch_member_that_must_stay_is_emptied_around_it(conn: Conn) -> None:
    old = _old(conn, 10)
    batch = conn.execute("INSERT INTO pgjobs.batches (total, pending) VALUES (2, 1) RETURNING id").fetchone()
    assert batch is not None
    conn.execute("UPDATE pgjobs.jobs SET batch_id = %s WHERE id = %s", (batch[0], old[0]))
    conn.execute("INSERT INTO pgjobs.jobs (kind, batch_id) VALUES ('member', %s)", (batch[0],))
    assert conn.execute("SELECT pgjobs.purge(succeeded_before => interval '1 minute')").fetchone() == (9,)
    assert "jobs_succeeded_upto" in _partitions(conn)
    assert conn.execute("SELECT id FROM pgjobs.jobs_succeeded_upto").fetchall() == [(old[0],)]


def test_queue_retention_drops_a_slice_once_every_queue_in_it_is_past_its_retention(conn: Conn) -> None:
    short = _old(conn, 20, queue="short")
    keep = _old(conn, 5, queue="keep")
    # (retention counts from the end of the slice: today's start, so seconds here)
    conn.execute("SELECT pgjobs.configure_queue('short', retention => interval '1 second')")
    actions = conn.execute("SELECT action, target, rows FROM pgjobs.maintain_history()").fetchall()
    assert ("retention", "jobs_succeeded_upto (short)", 20) in actions
    left = {r[0] for r in conn.execute("SELECT id FROM pgjobs.jobs").fetchall()}
    assert left == set(keep) and not left & set(short)
    # a second pass does not read the slice again: nothing changed
    assert [
        a for a in conn.execute("SELECT action FROM pgjobs.maintain_history()").fetchall() if a[0] != "create"
    ] == []
    conn.execute("SELECT pgjobs.configure_queue('keep', retention => interval '2 seconds')")
    actions = conn.execute("SELECT action, target, rows FROM pgjobs.maintain_history()").fetchall()
    assert ("drop", "jobs_succeeded_upto", 5) in actions
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone() == (0,)
    # 0 removes the setting (keep until purge)
    row = conn.execute("SELECT retention FROM pgjobs.configure_queue('keep', retention => interval '0')").fetchone()
    assert row == (None,)
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT pgjobs.configure_queue('keep', retention => interval '-1 hour')")
    assert err.value.sqlstate == "PJ002" and "-01:00:00" in str(err.value)


def test_maintenance_makes_the_slices_ahead(conn: Conn) -> None:
    before = _partitions(conn)
    conn.execute("UPDATE pgjobs.history_settings SET premake = 5")
    actions = conn.execute("SELECT action, target FROM pgjobs.maintain()").fetchall()
    made = {t for a, t in actions if a == "create"}
    assert len(made) == 4 and made == _partitions(conn) - before  # two more days in each tree
    assert all(conn.execute("SELECT to_regclass(%s)", (f"pgjobs.{m}",)).fetchone() != (None,) for m in made)
    # the new slices are children of their tree, with its indexes and the key trigger
    n = conn.execute(
        "SELECT count(*) FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid"
        " WHERE c.relname = ANY (%s)"
        " AND i.inhparent IN ('pgjobs.jobs_succeeded'::regclass, 'pgjobs.jobs_failed'::regclass)",
        (list(made),),
    ).fetchone()
    assert n == (4,)
    assert [a for a, _ in conn.execute("SELECT action, target FROM pgjobs.maintain_history()").fetchall()] == []


# -- row movement races -----------------------------------------------------------------------------------


def test_renew_leases_does_not_wait_on_a_job_being_completed(conn: Conn, connect: ConnectFactory) -> None:
    _enqueue(conn)
    _enqueue(conn)
    (a, ta), (b, tb) = _claim(conn, n=2)
    holder = connect()
    holder.autocommit = False
    holder.execute("SELECT pgjobs.complete(%s, %s)", (a, ta))
    # a's row is locked and moved (uncommitted): renewal skips it and reports it held, renews b
    renewed = conn.execute(
        "SELECT id FROM pgjobs.renew_leases(%s::bigint[], %s::uuid[])", ([a, b], [ta, tb])
    ).fetchall()
    assert sorted(r[0] for r in renewed) == sorted([a, b])
    assert conn.execute("SELECT pgjobs.renew_lease(%s, %s)", (a, ta)).fetchone() == (True,)
    holder.commit()
    renewed = conn.execute(
        "SELECT id FROM pgjobs.renew_leases(%s::bigint[], %s::uuid[])", ([a, b], [ta, tb])
    ).fetchall()
    assert renewed == [(b,)]
    assert conn.execute("SELECT pgjobs.renew_lease(%s, %s)", (a, ta)).fetchone() == (False,)


def test_cancel_waiting_on_a_completion_answers_false(conn: Conn, connect: ConnectFactory) -> None:
    job = _enqueue(conn)
    ((jid, tok),) = _claim(conn)
    got = _race(connect, "SELECT pgjobs.complete(%s, %s)", (jid, tok),
                lambda c: c.execute("SELECT pgjobs.cancel(%s)", (job,)).fetchone())  # fmt: skip
    assert got == (False,)
    assert conn.execute("SELECT state::text FROM pgjobs.jobs WHERE id = %s", (job,)).fetchone() == ("succeeded",)


def test_release_at_stop_waiting_on_a_completion_answers_false(conn: Conn, connect: ConnectFactory) -> None:
    _enqueue(conn)
    ((jid, tok),) = _claim(conn)
    got = _race(connect, "SELECT pgjobs.complete(%s, %s)", (jid, tok),
                lambda c: c.execute("SELECT pgjobs.release(%s, %s)", (jid, tok)).fetchone())  # fmt: skip
    assert got == (False,)
    for call in ("fail(%s, %s, 'e')", "complete(%s, %s)", "progress(%s, %s, '{}')", "checkpoint(%s, %s, '{}')"):
        assert conn.execute(f"SELECT pgjobs.{call}", (jid, tok)).fetchone() in ((False,), (None,))


def test_complete_many_waiting_on_a_job_that_ends_completes_the_others(conn: Conn, connect: ConnectFactory) -> None:
    for _ in range(3):
        _enqueue(conn)
    claimed = _claim(conn, n=3)
    (a, ta) = claimed[0]
    got = _race(connect, "SELECT pgjobs.fail(%s, %s, 'e', now())", (a, ta),
                lambda c: c.execute("SELECT pgjobs.complete_many(%s::bigint[], %s::uuid[])",
                                    ([j for j, _ in claimed], [t for _, t in claimed])).fetchone())  # fmt: skip
    # a went back to pending (a move back into jobs_live is still a move): the other two completed
    assert got == (2,)


def test_cancel_batch_waiting_on_a_completing_member(conn: Conn, connect: ConnectFactory) -> None:
    rows = conn.execute(
        'SELECT id, batch_id FROM pgjobs.enqueue_many(\'[{"kind": "a"}, {"kind": "b"}]\', as_batch => true)'
    ).fetchall()
    batch = rows[0][1]
    ((jid, tok),) = _claim(conn)
    got = _race(connect, "SELECT pgjobs.complete(%s, %s)", (jid, tok),
                lambda c: c.execute("SELECT pgjobs.cancel_batch(%s)", (batch,)).fetchone())  # fmt: skip
    assert got == (1,)  # the idle member; the completed one stays succeeded
    states = dict(conn.execute("SELECT kind, state::text FROM pgjobs.jobs").fetchall())
    assert sorted(states.values()) == ["cancelled", "succeeded"]


def test_a_completion_cascading_onto_a_child_being_cancelled(conn: Conn, connect: ConnectFactory) -> None:
    rows = conn.execute(
        "SELECT ref, id FROM pgjobs.enqueue_many(%s)",
        ('[{"kind": "p", "ref": "p"}, {"kind": "c", "ref": "c", "depends_on": [{"ref": "p"}]}]',),
    ).fetchall()
    ids = dict(rows)
    ((pid, ptok),) = _claim(conn)
    assert pid == ids["p"]
    got = _race(connect, "SELECT pgjobs.cancel(%s)", (ids["c"],),
                lambda c: c.execute("SELECT pgjobs.complete(%s, %s)", (pid, ptok)).fetchone())  # fmt: skip
    assert got == (True,)
    assert conn.execute("SELECT state::text FROM pgjobs.jobs WHERE id = %s", (ids["c"],)).fetchone() == ("cancelled",)


def test_delete_waiting_on_a_retry_sees_the_job_live_again(conn: Conn, connect: ConnectFactory) -> None:
    job = _enqueue(conn, max_attempts=1)
    ((jid, tok),) = _claim(conn)
    conn.execute("SELECT pgjobs.fail(%s, %s, 'e')", (jid, tok))

    def delete(c: Conn) -> str:
        try:
            c.execute("SELECT pgjobs.delete(%s)", (job,))
        except psycopg.Error as exc:
            return str(exc.sqlstate)
        return "deleted"

    assert _race(connect, "SELECT pgjobs.retry(%s)", (job,), delete) == "PJ004"
    assert conn.execute("SELECT state::text FROM pgjobs.jobs WHERE id = %s", (job,)).fetchone() == ("pending",)


def test_claim_racing_completions_of_expired_leases(connect: ConnectFactory, conn: Conn) -> None:
    """Claimers take expired leases while their old holders complete them: never a 40001, never a job twice
    in the succeeded count."""
    conn.execute("INSERT INTO pgjobs.jobs (kind) SELECT 'k' FROM generate_series(1, 400)")
    held = _claim(conn, n=400)
    conn.execute("UPDATE pgjobs.jobs SET lease_expires_at = now() - interval '1 second' WHERE state = 'active'")
    errors: list[BaseException] = []
    taken: list[tuple[int, Any]] = []

    def completer() -> None:
        with connect() as c:
            for i in range(0, 400, 10):
                chunk = held[i : i + 10]
                try:
                    c.execute("SELECT pgjobs.complete_many(%s::bigint[], %s::uuid[])",
                              ([j for j, _ in chunk], [t for _, t in chunk]))  # fmt: skip
                except psycopg.Error as exc:
                    errors.append(exc)

    def claimer() -> None:
        with connect() as c:
            for _ in range(40):
                try:
                    taken.extend(_claim(c, n=10))
                except psycopg.Error as exc:
                    errors.append(exc)

    threads = [threading.Thread(target=completer)] + [threading.Thread(target=claimer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    for jid, tok in taken:
        conn.execute("SELECT pgjobs.complete(%s, %s)", (jid, tok))
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs WHERE state = 'succeeded'").fetchone() == (400,)


def test_a_fan_in_onto_parents_that_keep_completing_is_enqueued(connect: ConnectFactory, conn: Conn) -> None:
    """A child that depends on 200 running parents is enqueued while 4 workers complete those parents: each
    wait on a parent that then moves to history is a lost race, and retrying the whole lock in a new snapshot
    could lose it on every try (the workers keep completing). The call must get through, its edges settled
    for the parents that had ended."""
    conn.execute("INSERT INTO pgjobs.jobs (kind) SELECT 'p' FROM generate_series(1, 200)")
    held = _claim(conn, n=200)
    errors: list[BaseException] = []
    child: list[int] = []

    def completer(part: int) -> None:
        with connect() as c:
            for jid, tok in held[part::4]:
                c.execute("SELECT pgjobs.complete(%s, %s)", (jid, tok))

    def enqueuer() -> None:
        spec = [{"kind": "child", "depends_on": [{"job": j} for j, _ in held]}]
        with connect() as c:
            try:
                row = c.execute("SELECT id FROM pgjobs.enqueue_many(%s::jsonb)", (json.dumps(spec),)).fetchone()
                assert row is not None
                child.append(int(row[0]))
            except psycopg.Error as exc:
                errors.append(exc)

    threads = [threading.Thread(target=completer, args=(i,)) for i in range(4)] + [threading.Thread(target=enqueuer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    # every parent succeeded, so the child is released, whichever parents had ended before its edges were added
    state = conn.execute("SELECT state::text, remaining_deps FROM pgjobs.jobs WHERE id = %s", (child[0],)).fetchone()
    assert state == ("pending", 0)


def test_cli_queue_configure_sets_and_removes_retention(
    dsn: str, conn: Conn, capsys: pytest.CaptureFixture[str]
) -> None:
    from datetime import timedelta

    from pgjobs.cli import main

    assert main(["--dsn", dsn, "queue", "configure", "q", "--retention", "7d", "--json"]) == 0, capsys.readouterr().err
    assert conn.execute("SELECT retention FROM pgjobs.queues WHERE queue = 'q'").fetchone() == (timedelta(days=7),)
    assert main(["--dsn", dsn, "queue", "configure", "q", "--retention", "0"]) == 0, capsys.readouterr().err
    assert conn.execute("SELECT retention FROM pgjobs.queues WHERE queue = 'q'").fetchone() == (None,)


def test_lost_race_policy_retries_only_in_read_committed_and_only_19_times(conn: Conn, connect: ConnectFactory) -> None:
    """_lost_race (the one retry policy of every statement that handles a row moved to history): it lets a
    READ COMMITTED statement run again up to its 19th try, and raises 40001 with the caught message on the
    20th, or at once under REPEATABLE READ (a new statement there keeps the old snapshot)."""
    assert conn.execute("SELECT 1 FROM (SELECT pgjobs._lost_race(19, 'moved')) AS x").fetchone() == (1,)
    with pytest.raises(psycopg.errors.SerializationFailure, match="moved"):
        conn.execute("SELECT pgjobs._lost_race(20, 'moved')")
    rr = connect(autocommit=False)
    rr.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    with pytest.raises(psycopg.errors.SerializationFailure, match="moved"):
        rr.execute("SELECT pgjobs._lost_race(1, 'moved')")
