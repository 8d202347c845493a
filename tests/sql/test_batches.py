"""Batches: counters, started/settled, batch continuations, cancel_batch, add_to_batch (with and without
before_continuations, racing siblings), retry reopening, delete and purge."""

from __future__ import annotations

import asyncio
import threading
from typing import Any
from uuid import UUID

import psycopg
import pytest
from conftest import ConnectFactory
from psycopg.types.json import Jsonb

import pgjobs
from pgjobs import BatchState, InvalidState, JobNotFound, on_failure
from tests.helpers.graph import (
    Conn,
    batch,
    cancel,
    counters,
    enqueue_rows,
    fail,
    listening,
    one,
    recount,
    rows,
    run_threads,
    state,
    succeed,
    take,
)


def make_batch(conn: Conn, kinds: list[str], **extra: Any) -> tuple[int, dict[str, int]]:
    out = enqueue_rows(conn, [{"kind": k, "ref": k, **extra} for k in kinds], as_batch=True)
    assert len({r["batch_id"] for r in out}) == 1
    return out[0]["batch_id"], {r["ref"]: r["id"] for r in out}


def add_to_batch(conn: Conn, job_id: int, token: UUID, spec: dict[str, Any], before: bool = False) -> Any:
    return one(
        conn,
        "SELECT pgjobs.add_to_batch(id => %s, lease_token => %s, job => %s, before_continuations => %s)",
        (job_id, token, Jsonb(spec), before),
    )


@pytest.mark.smoke
def test_counters_start_and_settle(conn: Conn) -> None:
    batch_id, ids = make_batch(conn, ["a", "b", "c"])
    status = batch(conn, batch_id)
    assert counters(status) == {"total": 3, "pending": 3, "succeeded": 0, "failed": 0, "cancelled": 0}
    assert status["state"] == "executing" and status["started_at"] is None and status["fraction_settled"] == 0
    assert list(status) == [
        "id", "state", "total", "pending", "succeeded", "failed", "cancelled",
        "fraction_settled", "created_at", "started_at", "completed_at",
    ]  # fmt: skip
    succeed(conn, ids["a"])
    status = batch(conn, batch_id)
    assert status["started_at"] is not None and status["completed_at"] is None
    assert status["succeeded"] == 1 and status["pending"] == 2
    assert status["fraction_settled"] == pytest.approx(1 / 3)
    succeed(conn, ids["b"])
    succeed(conn, ids["c"])
    status = batch(conn, batch_id)
    assert status["state"] == "succeeded" and status["completed_at"] is not None
    assert counters(status) == {"total": 3, "pending": 0, "succeeded": 3, "failed": 0, "cancelled": 0}
    assert status["fraction_settled"] == 1


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        (["ok", "ok"], "succeeded"),
        (["ok", "cancel"], "cancelled"),
        (["fail", "cancel"], "failed"),
        (["cancel", "fail"], "failed"),
    ],
)
def test_settled_state_rule(conn: Conn, outcomes: list[str], expected: str) -> None:
    batch_id, ids = make_batch(conn, ["m0", "m1"])
    for i, outcome in enumerate(outcomes):
        {"ok": succeed, "fail": fail, "cancel": cancel}[outcome](conn, ids[f"m{i}"])
    assert batch(conn, batch_id)["state"] == expected


def test_unknown_batches(conn: Conn) -> None:
    assert rows(conn, "SELECT * FROM pgjobs.batch_status(batch_id => 424242)") == []
    assert one(conn, "SELECT pgjobs.batch_graph(batch_id => 424242)") is None
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT pgjobs.cancel_batch(batch_id => 424242)")
    assert err.value.sqlstate == "PJ003"


def test_batch_members_can_depend_on_each_other_and_the_graph_shows_it(conn: Conn) -> None:
    out = enqueue_rows(
        conn,
        [{"kind": "r1", "ref": "r1"}, {"kind": "r2", "ref": "r2"},
         {"kind": "zip", "ref": "zip", "depends_on": [{"ref": "r1"}, {"ref": "r2", "on": "complete"}]}],
        as_batch=True,
    )  # fmt: skip
    ids = {r["ref"]: r["id"] for r in out}
    batch_id = out[0]["batch_id"]
    graph = one(conn, "SELECT pgjobs.batch_graph(batch_id => %s)", (batch_id,))
    assert graph["batch"]["id"] == batch_id and graph["batch"]["total"] == 3
    assert [n["id"] for n in graph["nodes"]] == sorted(ids.values())
    assert all(n["member"] for n in graph["nodes"])
    assert {(e["from"], e["to"], e["on"]) for e in graph["edges"]} == {
        (ids["r1"], ids["zip"], "success"),
        (ids["r2"], ids["zip"], "complete"),
    }


def test_members_created_with_their_children_are_flagged_as_parents_and_release_them(conn: Conn) -> None:
    """has_dependents is set at insert on a member that other specs of the call depend on (and only on
    it): _propagate settles edges for flagged jobs only, so an unflagged parent would strand its child."""
    out = enqueue_rows(
        conn,
        [{"kind": "a", "ref": "a"}, {"kind": "b", "ref": "b"}, {"kind": "c", "ref": "c", "depends_on": [{"ref": "a"}]}],
        as_batch=True,
    )
    ids = {r["ref"]: r["id"] for r in out}
    flags = dict(conn.execute("SELECT id, has_dependents FROM pgjobs.jobs").fetchall())
    assert flags == {ids["a"]: True, ids["b"]: False, ids["c"]: False}
    assert state(conn, ids["c"]) == "waiting"
    succeed(conn, ids["a"])
    assert state(conn, ids["c"]) == "pending"  # released through the flagged parent's edge


@pytest.mark.parametrize(
    ("member_outcome", "expected"),
    [
        ("ok", {"success": "pending", "failure": "cancelled", "complete": "pending"}),
        ("fail", {"success": "cancelled", "failure": "pending", "complete": "pending"}),
        ("cancel", {"success": "cancelled", "failure": "cancelled", "complete": "pending"}),
    ],
)
def test_batch_continuations_wait_for_the_whole_batch(
    conn: Conn, member_outcome: str, expected: dict[str, str]
) -> None:
    batch_id, ids = make_batch(conn, ["m0", "m1"])
    conts = enqueue_rows(
        conn, [{"kind": f"on_{t}", "ref": t, "depends_on": [{"batch": batch_id, "on": t}]} for t in expected]
    )
    cont_ids = {r["ref"]: r["id"] for r in conts}
    assert all(state(conn, i) == "waiting" for i in cont_ids.values())
    assert one(conn, "SELECT has_dependents FROM pgjobs.batches WHERE id = %s", (batch_id,)) is True
    succeed(conn, ids["m0"])
    assert all(state(conn, i) == "waiting" for i in cont_ids.values())
    {"ok": succeed, "fail": fail, "cancel": cancel}[member_outcome](conn, ids["m1"])
    assert {t: state(conn, i) for t, i in cont_ids.items()} == expected
    graph = one(conn, "SELECT pgjobs.batch_graph(batch_id => %s)", (batch_id,))
    assert {e["to"] for e in graph["edges"] if e.get("from_batch") == batch_id} == set(cont_ids.values())
    # a continuation added after the batch settled resolves at once
    late = enqueue_rows(conn, [{"kind": "late", "ref": "late", "depends_on": [{"batch": batch_id, "on": "complete"}]}])
    assert state(conn, late[0]["id"]) == "pending"


def test_parent_results_of_a_batch_continuation_are_the_members_results(conn: Conn) -> None:
    batch_id, ids = make_batch(conn, ["m0", "m1"])
    cont = enqueue_rows(conn, [{"kind": "zip", "ref": "z", "depends_on": [{"batch": batch_id}]}])[0]["id"]
    succeed(conn, ids["m0"], result="a.png")
    succeed(conn, ids["m1"], result="b.png")
    assert one(conn, "SELECT pgjobs.parent_results(id => %s)", (cont,)) == {
        str(ids["m0"]): "a.png",
        str(ids["m1"]): "b.png",
    }


def test_cancel_batch_cancels_idle_members_and_requests_running_ones(conn: Conn, dsn: str) -> None:
    batch_id, ids = make_batch(conn, ["a", "b", "c", "d"])
    cont = enqueue_rows(conn, [{"kind": "after", "ref": "x", "depends_on": [{"batch": batch_id, "on": "complete"}]}])[
        0
    ]["id"]
    succeed(conn, ids["a"])
    token = take(conn, ids["b"])
    with listening(dsn) as listener:
        assert one(conn, "SELECT pgjobs.cancel_batch(batch_id => %s)", (batch_id,)) == 3
        got = listener.drain()
    assert ("pgjobs_cancel", str(ids["b"])) in got
    assert {e["id"] for ch, e in got if ch == "pgjobs_status"} == {ids["c"], ids["d"]}
    assert [state(conn, ids[k]) for k in "abcd"] == ["succeeded", "active", "cancelled", "cancelled"]
    status = batch(conn, batch_id)
    assert status["state"] == "executing" and status["pending"] == 1 and status["cancelled"] == 2
    assert state(conn, cont) == "waiting"
    assert one(conn, "SELECT pgjobs.ack_cancel(id => %s, lease_token => %s)", (ids["b"], token))
    status = batch(conn, batch_id)
    assert status["state"] == "cancelled" and counters(status) == recount(conn, batch_id)
    assert state(conn, cont) == "pending"
    assert one(conn, "SELECT pgjobs.cancel_batch(batch_id => %s)", (batch_id,)) == 0


def test_add_to_batch_grows_the_batch_and_keeps_it_open(conn: Conn) -> None:
    batch_id, ids = make_batch(conn, ["a", "b"])
    cont = enqueue_rows(conn, [{"kind": "done", "ref": "d", "depends_on": [{"batch": batch_id}]}])[0]["id"]
    succeed(conn, ids["b"])
    token = take(conn, ids["a"])
    sib = add_to_batch(conn, ids["a"], token, {"kind": "extra", "payload": {"page": 2}})
    assert one(conn, "SELECT batch_id FROM pgjobs.jobs WHERE id = %s", (sib,)) == batch_id
    assert state(conn, sib) == "pending"
    assert counters(batch(conn, batch_id)) == {"total": 3, "pending": 2, "succeeded": 1, "failed": 0, "cancelled": 0}
    assert one(conn, "SELECT pgjobs.complete(id => %s, lease_token => %s)", (ids["a"], token))
    assert batch(conn, batch_id)["state"] == "executing"
    assert state(conn, cont) == "waiting"
    succeed(conn, sib)
    assert batch(conn, batch_id)["state"] == "succeeded"
    assert state(conn, cont) == "pending"


def test_add_to_batch_stale_token_and_non_members(conn: Conn) -> None:
    batch_id, ids = make_batch(conn, ["a"])
    token = take(conn, ids["a"])
    assert add_to_batch(conn, ids["a"], UUID(int=1), {"kind": "x"}) is None
    lone = enqueue_rows(conn, [{"kind": "lone", "ref": "l"}])[0]["id"]
    lone_token = take(conn, lone)
    with pytest.raises(psycopg.Error) as err:
        add_to_batch(conn, lone, lone_token, {"kind": "x"})
    assert err.value.sqlstate == "PJ004"
    with pytest.raises(psycopg.Error) as err:
        add_to_batch(conn, ids["a"], token, {"kind": ""})
    assert err.value.sqlstate == "PJ002"
    assert batch(conn, batch_id)["total"] == 1


def test_before_continuations_makes_the_callers_continuations_wait(conn: Conn) -> None:
    out = enqueue_rows(
        conn,
        [{"kind": "a", "ref": "a"}, {"kind": "b", "ref": "b"},
         {"kind": "after_a", "ref": "after_a", "depends_on": [{"ref": "a"}]}],
        as_batch=True,
    )  # fmt: skip
    ids = {r["ref"]: r["id"] for r in out}
    token = take(conn, ids["a"])
    plain = add_to_batch(conn, ids["a"], token, {"kind": "plain"})
    held = add_to_batch(conn, ids["a"], token, {"kind": "held"}, before=True)
    assert one(
        conn,
        "SELECT pgjobs.complete(id => %s, lease_token => %s, continuations => %s)",
        (ids["a"], token, Jsonb([{"kind": "cont"}])),
    )
    cont = one(conn, "SELECT id FROM pgjobs.jobs WHERE kind = 'cont'")
    # the caller succeeded, but its continuations (existing and new) also wait for the held sibling
    assert state(conn, ids["after_a"]) == "waiting" and state(conn, cont) == "waiting"
    deps = rows(conn, "SELECT * FROM pgjobs.job_status(id => %s)", (ids["after_a"],))[0]["depends_on"]
    assert {"job": held, "on": "complete"} in deps
    succeed(conn, plain)
    assert state(conn, ids["after_a"]) == "waiting"
    fail(conn, held)  # `complete`: the sibling's outcome is the batch's business
    assert state(conn, ids["after_a"]) == "pending" and state(conn, cont) == "pending"
    assert batch(conn, out[0]["batch_id"])["failed"] == 1


@pytest.mark.timeout(180)
def test_add_to_batch_while_siblings_finish_concurrently(connect: ConnectFactory) -> None:
    setup = connect()
    batch_id, _ids = make_batch(setup, [f"s{i}" for i in range(60)], queue="grow")
    done = enqueue_rows(setup, [{"kind": "done", "ref": "d", "queue": "fin", "depends_on": [{"batch": batch_id}]}])[0][
        "id"
    ]
    claimed = rows(setup, "SELECT id, lease_token FROM pgjobs.claim(worker => 'w', queues => '{grow}', max_jobs => 60)")
    assert len(claimed) == 60
    added: list[int] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        c = connect()
        for row in claimed[i::6]:
            if row["id"] % 3 == 0:  # these grow the batch before finishing
                for _ in range(2):
                    sib = add_to_batch(c, row["id"], row["lease_token"], {"kind": "sib", "queue": "grow"})
                    with lock:
                        added.append(sib)
            c.execute("SELECT pgjobs.complete(id => %s, lease_token => %s)", (row["id"], row["lease_token"]))

    run_threads(6, work)
    status = batch(setup, batch_id)
    assert counters(status) == recount(setup, batch_id)
    assert status["total"] == 60 + len(added) and status["pending"] == len(added) > 0
    assert status["state"] == "executing" and state(setup, done) == "waiting"
    # the added siblings are claimable members; finishing them settles the batch
    sibs = rows(setup, "SELECT id, lease_token FROM pgjobs.claim(worker => 'w', queues => '{grow}', max_jobs => 1000)")
    assert sorted(r["id"] for r in sibs) == sorted(added)

    def finish(i: int) -> None:
        c = connect()
        chunk = sibs[i::4]
        if chunk:
            c.execute(
                "SELECT pgjobs.complete_many(ids => %s::bigint[], lease_tokens => %s::uuid[])",
                ([r["id"] for r in chunk], [r["lease_token"] for r in chunk]),
            )

    run_threads(4, finish)
    status = batch(setup, batch_id)
    assert status["state"] == "succeeded" and counters(status) == recount(setup, batch_id)
    assert state(setup, done) == "pending"


def test_failed_members_retried_reopen_the_batch(conn: Conn, dsn: str) -> None:
    batch_id, ids = make_batch(conn, ["a", "b", "c"])
    conts = enqueue_rows(
        conn,
        [{"kind": "zip", "ref": "zip", "depends_on": [{"batch": batch_id}]},
         {"kind": "alert", "ref": "alert", "depends_on": [{"batch": batch_id, "on": "failure"}]}],
    )  # fmt: skip
    cont = {r["ref"]: r["id"] for r in conts}
    succeed(conn, ids["a"])
    fail(conn, ids["b"])
    fail(conn, ids["c"])
    status = batch(conn, batch_id)
    assert status["state"] == "failed" and status["failed"] == 2 and status["completed_at"] is not None
    assert state(conn, cont["zip"]) == "cancelled" and state(conn, cont["alert"]) == "pending"
    with listening(dsn) as listener:
        assert one(conn, "SELECT pgjobs.retry(id => %s)", (ids["b"],))
        events = listener.status_events()
    status = batch(conn, batch_id)
    assert status["state"] == "executing" and status["completed_at"] is None
    assert counters(status) == {"total": 3, "pending": 1, "succeeded": 1, "failed": 1, "cancelled": 0}
    # the success continuation the failure had cancelled waits again (the failure handler already ran)
    assert state(conn, cont["zip"]) == "waiting" and state(conn, cont["alert"]) == "pending"
    assert (cont["zip"], "waiting") in {(e["id"], e["state"]) for e in events}
    one(conn, "SELECT pgjobs.retry(id => %s)", (ids["c"],))
    assert counters(batch(conn, batch_id)) == {"total": 3, "pending": 2, "succeeded": 1, "failed": 0, "cancelled": 0}
    succeed(conn, ids["b"])
    succeed(conn, ids["c"])
    status = batch(conn, batch_id)
    assert status["state"] == "succeeded" and counters(status) == recount(conn, batch_id)
    assert state(conn, cont["zip"]) == "pending"


def test_purge_takes_settled_batches_whole(conn: Conn) -> None:
    old_id, old = make_batch(conn, ["o1", "o2"])
    open_id, opened = make_batch(conn, ["p1", "p2"])
    cont = enqueue_rows(conn, [{"kind": "after", "ref": "x", "depends_on": [{"batch": old_id, "on": "complete"}]}])[0][
        "id"
    ]
    succeed(conn, old["o1"])
    fail(conn, old["o2"])
    succeed(conn, opened["p1"])
    conn.execute("UPDATE pgjobs.jobs SET completed_at = now() - interval '2 days' WHERE batch_id IS NOT NULL")
    # failed members are kept by a NULL failed_before: the batch stays whole
    assert one(conn, "SELECT pgjobs.purge(succeeded_before => interval '1 day')") == 0
    removed = one(conn, "SELECT pgjobs.purge(succeeded_before => interval '1 day', failed_before => interval '1 day')")
    assert removed == 2
    assert rows(conn, "SELECT * FROM pgjobs.batch_status(batch_id => %s)", (old_id,)) == []
    assert one(conn, "SELECT count(*) FROM pgjobs.jobs WHERE batch_id = %s", (open_id,)) == 2
    assert one(conn, "SELECT count(*) FROM pgjobs.edges WHERE parent_batch_id = %s", (old_id,)) == 0
    assert state(conn, cont) == "pending"


def test_delete_batch(conn: Conn) -> None:
    batch_id, ids = make_batch(conn, ["a", "b"])
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT pgjobs.delete_batch(batch_id => %s)", (batch_id,))
    assert err.value.sqlstate == "PJ004"
    succeed(conn, ids["a"])
    succeed(conn, ids["b"])
    assert one(conn, "SELECT pgjobs.delete_batch(batch_id => %s)", (batch_id,)) == 2
    assert one(conn, "SELECT count(*) FROM pgjobs.jobs") == 0


def test_an_as_batch_call_of_only_existing_jobs_makes_no_batch(conn: Conn) -> None:
    first = enqueue_rows(conn, [{"kind": "k", "ref": "k", "unique_key": "u"}])
    again = enqueue_rows(conn, [{"kind": "k", "ref": "k", "unique_key": "u"}], as_batch=True)
    assert again[0]["id"] == first[0]["id"] and again[0]["created"] is False and again[0]["batch_id"] is None
    assert one(conn, "SELECT count(*) FROM pgjobs.batches") == 0


def test_python_batch_builder_and_wrappers(dsn: str) -> None:
    with pgjobs.Client(dsn) as client:
        with client.batch() as b:
            parts = [b.enqueue("resize", {"image": f"{i}.png"}) for i in range(3)]
            zipped = b.enqueue("zip", after=parts)
            alert = b.enqueue("alert", after=[on_failure(zipped)])
            notify = b.then("notify", on="complete")
        assert b.batch_id is not None and all(p.batch_id == b.batch_id for p in parts)
        assert notify.id is not None and notify.batch_id is None
        status = client.batch_status(b.batch_id)
        assert status is not None and status.state is BatchState.EXECUTING and status.total == 5
        graph = client.batch_graph(b.batch_id)
        assert graph is not None and len(graph["nodes"]) == 6
        assert client.batch_status(10**9) is None and client.batch_graph(10**9) is None
        with pytest.raises(JobNotFound):
            client.cancel_batch(10**9)
        with pytest.raises(InvalidState):
            client.delete_batch(b.batch_id)
        claimed = client.claim("w", max_jobs=10)
        assert {c.kind for c in claimed} == {"resize"}
        first = claimed[0]
        sib = client.add_to_batch(first.id, first.lease_token, {"kind": "resize", "payload": {"image": "extra.png"}})
        assert sib is not None
        assert client.cancel_batch(b.batch_id) == 6  # 3 running (requested), zip, alert, the new sibling
        job = client.job_status(alert.id or 0)
        assert job is not None and job.state == "cancelled"
        assert (status := client.batch_status(b.batch_id)) is not None and status.pending == 3


def test_async_builder(dsn: str) -> None:
    async def main() -> tuple[int | None, int | None]:
        async with pgjobs.AsyncClient(dsn) as client:
            async with client.batch() as b:
                a = b.enqueue("a")
                b.enqueue("b", after=[a])
            status = await client.batch_status(b.batch_id or 0)
            return (status.total if status else None), a.id

    total, a_id = asyncio.run(main())
    assert total == 2 and a_id is not None


def test_subscribe_to_a_batch_shows_it_settle(dsn: str, connect: ConnectFactory) -> None:
    setup = connect()
    batch_id, ids = make_batch(setup, ["s0", "s1", "s2"])
    zip_id = enqueue_rows(setup, [{"kind": "zipper", "ref": "z", "depends_on": [{"batch": batch_id}]}])[0]["id"]

    def work() -> None:
        c = connect()
        for i in ids.values():
            succeed(c, i)

    async def main() -> list[tuple[int, str]]:
        seen: list[tuple[int, str]] = []
        async with pgjobs.AsyncClient(dsn) as client:
            stream = client.subscribe(batch_id=batch_id, resync_interval=0.5)
            worker: asyncio.Task[None] | None = None
            async for event in stream:
                seen.append((event.id, str(event.state)))
                if worker is None:  # subscribed (the first event is the durable snapshot): start working
                    worker = asyncio.create_task(asyncio.to_thread(work))
                done = {i for i, s in seen if s == "succeeded"}
                if done == set(ids.values()):  # the log delivers every member's end, also after the batch settled
                    status = await client.batch_status(batch_id)
                    assert status is not None and status.state.settled
                    break
            assert worker is not None
            await worker
        return seen

    seen = asyncio.run(asyncio.wait_for(main(), 60))
    # the stream carries only the batch's members, and it saw every one of them finish
    assert {i for i, _ in seen} <= set(ids.values())
    assert any(s == "succeeded" for _, s in seen)
    status = batch(setup, batch_id)
    assert status["state"] == "succeeded" and status["completed_at"] is not None
    assert state(setup, zip_id) == "pending"


def test_add_to_batch_refuses_a_sibling_that_would_wait_for_its_own_batch(conn: Conn) -> None:
    batch_id, ids = make_batch(conn, ["a", "b"])
    outside = enqueue_rows(conn, [{"kind": "outside", "ref": "o", "depends_on": [{"batch": batch_id}]}])[0]["id"]
    token = take(conn, ids["a"])
    for spec in (
        {"kind": "direct", "depends_on": [{"batch": batch_id, "on": "complete"}]},
        {"kind": "through", "depends_on": [{"job": outside}]},
    ):
        with pytest.raises(psycopg.Error) as err:
            add_to_batch(conn, ids["a"], token, spec)
        assert err.value.sqlstate == "PJ005" and "cycle" in (err.value.diag.message_primary or "")
    # depending on a sibling is fine
    sib = add_to_batch(conn, ids["a"], token, {"kind": "after_b", "depends_on": [{"job": ids["b"]}]})
    assert state(conn, sib) == "waiting" and batch(conn, batch_id)["total"] == 3


@pytest.mark.timeout(180)
def test_cancel_batch_racing_completions_keeps_counters_exact(connect: ConnectFactory) -> None:
    """Members with waiting children inside the batch complete while the batch is cancelled: no deadlock,
    nothing lost, counters equal a recount, the batch settles once the running members end."""
    setup = connect()
    specs: list[dict[str, Any]] = []
    for i in range(40):
        specs.append({"kind": "head", "ref": f"h{i}", "queue": "race"})
        specs.append({"kind": "tail", "ref": f"t{i}", "queue": "tails", "depends_on": [{"ref": f"h{i}"}]})
    batch_id = enqueue_rows(setup, specs, as_batch=True)[0]["batch_id"]
    heads = rows(setup, "SELECT id, lease_token FROM pgjobs.claim(worker => 'w', queues => '{race}', max_jobs => 40)")
    cancelled: list[int] = []

    def work(i: int) -> None:
        c = connect()
        if i == 4:
            cancelled.append(one(c, "SELECT pgjobs.cancel_batch(batch_id => %s)", (batch_id,)))
            return
        for row in heads[i::4]:
            c.execute("SELECT pgjobs.complete(id => %s, lease_token => %s)", (row["id"], row["lease_token"]))

    run_threads(5, work)
    status = batch(setup, batch_id)
    assert counters(status) == recount(setup, batch_id)
    # every head ended one way or the other; running ones that were asked to cancel completed anyway here
    assert one(setup, "SELECT count(*) FROM pgjobs.jobs WHERE batch_id = %s AND kind = 'head' AND state = 'active'",
               (batch_id,)) == 0  # fmt: skip
    # tails: cancelled by cancel_batch, or released by their head before it (then claimable), never waiting
    assert one(setup, "SELECT count(*) FROM pgjobs.jobs WHERE batch_id = %s AND state = 'waiting'", (batch_id,)) == 0
    assert one(setup, "SELECT pgjobs.cancel_batch(batch_id => %s)", (batch_id,)) == one(
        setup, "SELECT count(*) FROM pgjobs.jobs WHERE batch_id = %s AND state = 'pending'", (batch_id,)
    )
    status = batch(setup, batch_id)
    assert status["state"] == "cancelled" and counters(status) == recount(setup, batch_id)


def test_deleting_a_finished_member_keeps_counters_equal_to_a_recount(conn: Conn) -> None:
    batch_id, ids = make_batch(conn, ["a", "b", "c"])
    succeed(conn, ids["a"])
    fail_token = take(conn, ids["b"])
    one(conn, "SELECT pgjobs.dead_letter(%s, %s, 'boom')", (ids["b"], fail_token))
    assert one(conn, "SELECT pgjobs.delete(%s)", (ids["a"],)) is True
    assert counters(batch(conn, batch_id)) == recount(conn, batch_id)
    assert one(conn, "SELECT pgjobs.delete(%s)", (ids["b"],)) is True
    assert counters(batch(conn, batch_id)) == recount(conn, batch_id) == {
        "total": 1, "pending": 1, "succeeded": 0, "failed": 0, "cancelled": 0,
    }  # fmt: skip
