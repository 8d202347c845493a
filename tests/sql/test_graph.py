"""Job graphs: depends_on with success/failure/complete triggers, resolution at insert, propagation,
cascade cancel, continuations, results, validation (PJ002/PJ005), and the fan-in race."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory
from psycopg.types.json import Jsonb

import pgjobs
from pgjobs import GraphError, InvalidArgument, on_complete, on_failure
from tests.helpers.graph import (
    Conn,
    batch,
    cancel,
    enqueue_many,
    fail,
    listening,
    one,
    rows,
    run_threads,
    state,
    states,
    succeed,
    take,
)


def dep(ref: str, on: str = "success") -> dict[str, str]:
    return {"ref": ref, "on": on}


@pytest.mark.smoke
def test_chain_runs_in_order_and_job_status_lists_dependencies(conn: Conn) -> None:
    ids = enqueue_many(
        conn,
        [
            {"kind": "a", "ref": "a"},
            {"kind": "b", "ref": "b", "depends_on": [dep("a")]},
            {"kind": "c", "ref": "c", "depends_on": [dep("b", "complete")]},
        ],
    )
    assert states(conn, ids) == {"a": "pending", "b": "waiting", "c": "waiting"}
    status = rows(conn, "SELECT * FROM pgjobs.job_status(id => %s)", (ids["c"],))[0]
    assert status["depends_on"] == [{"job": ids["b"], "on": "complete"}]
    assert status["remaining_deps"] == 1
    succeed(conn, ids["a"])
    assert states(conn, ids) == {"a": "succeeded", "b": "pending", "c": "waiting"}
    succeed(conn, ids["b"])
    assert states(conn, ids) == {"a": "succeeded", "b": "succeeded", "c": "pending"}


def test_diamond_releases_the_join_only_when_both_branches_succeeded(conn: Conn) -> None:
    ids = enqueue_many(
        conn,
        [
            {"kind": "top", "ref": "top"},
            {"kind": "left", "ref": "left", "depends_on": [dep("top")]},
            {"kind": "right", "ref": "right", "depends_on": [dep("top")]},
            {"kind": "join", "ref": "join", "depends_on": [dep("left"), dep("right")]},
        ],
    )
    succeed(conn, ids["top"])
    assert states(conn, ids)["join"] == "waiting"
    succeed(conn, ids["right"])
    assert one(conn, "SELECT remaining_deps FROM pgjobs.jobs WHERE id = %s", (ids["join"],)) == 1
    assert state(conn, ids["join"]) == "waiting"
    succeed(conn, ids["left"])
    assert state(conn, ids["join"]) == "pending"


def test_failure_trigger_runs_the_handler_only_when_the_parent_failed(conn: Conn) -> None:
    ids = enqueue_many(
        conn,
        [
            {"kind": "p1", "ref": "p1"},
            {"kind": "on_fail1", "ref": "h1", "depends_on": [dep("p1", "failure")]},
            {"kind": "on_ok1", "ref": "s1", "depends_on": [dep("p1")]},
            {"kind": "p2", "ref": "p2"},
            {"kind": "on_fail2", "ref": "h2", "depends_on": [dep("p2", "failure")]},
        ],
    )
    fail(conn, ids["p1"])
    succeed(conn, ids["p2"])
    got = states(conn, ids)
    assert got["h1"] == "pending" and got["s1"] == "cancelled"
    assert got["h2"] == "cancelled"


def test_fail_with_attempts_left_does_not_settle_children(conn: Conn) -> None:
    ids = enqueue_many(
        conn, [{"kind": "p", "ref": "p"}, {"kind": "c", "ref": "c", "depends_on": [dep("p", "complete")]}]
    )
    token = take(conn, ids["p"])
    assert one(conn, "SELECT pgjobs.fail(id => %s, lease_token => %s, error => 'x')", (ids["p"], token)) == "scheduled"
    assert state(conn, ids["c"]) == "waiting"


@pytest.mark.parametrize("outcome", ["succeeded", "failed", "cancelled"])
def test_complete_trigger_runs_after_any_outcome(conn: Conn, outcome: str) -> None:
    ids = enqueue_many(
        conn, [{"kind": "p", "ref": "p"}, {"kind": "c", "ref": "c", "depends_on": [dep("p", "complete")]}]
    )
    {"succeeded": succeed, "failed": fail, "cancelled": cancel}[outcome](conn, ids["p"])
    assert states(conn, ids) == {"p": outcome, "c": "pending"}


def test_a_cancelled_parent_is_neither_success_nor_failure(conn: Conn) -> None:
    ids = enqueue_many(
        conn,
        [
            {"kind": "p", "ref": "p"},
            {"kind": "s", "ref": "s", "depends_on": [dep("p", "success")]},
            {"kind": "f", "ref": "f", "depends_on": [dep("p", "failure")]},
            {"kind": "c", "ref": "c", "depends_on": [dep("p", "complete")]},
        ],
    )
    assert cancel(conn, ids["p"])
    assert states(conn, ids) == {"p": "cancelled", "s": "cancelled", "f": "cancelled", "c": "pending"}


def test_running_parent_cancelled_by_its_worker_settles_children(conn: Conn) -> None:
    ids = enqueue_many(conn, [{"kind": "p", "ref": "p"}, {"kind": "s", "ref": "s", "depends_on": [dep("p")]}])
    token = take(conn, ids["p"])
    assert cancel(conn, ids["p"])
    assert state(conn, ids["s"]) == "waiting"  # only requested so far
    assert one(conn, "SELECT pgjobs.ack_cancel(id => %s, lease_token => %s)", (ids["p"], token))
    assert state(conn, ids["s"]) == "cancelled"


def test_cascade_cancel_three_levels_deep_notifies_every_job(conn: Conn, dsn: str) -> None:
    ids = enqueue_many(
        conn,
        [
            {"kind": "l0", "ref": "l0"},
            {"kind": "l1", "ref": "l1", "depends_on": [dep("l0")]},
            {"kind": "l2", "ref": "l2", "depends_on": [dep("l1", "failure")]},
            {"kind": "l3", "ref": "l3", "depends_on": [dep("l2")]},
            # a complete child of a cancelled job runs, and its success child then waits for it
            {"kind": "side", "ref": "side", "depends_on": [dep("l2", "complete")]},
            {"kind": "after_side", "ref": "after_side", "depends_on": [dep("side")]},
        ],
    )
    with listening(dsn) as listener:
        assert cancel(conn, ids["l0"])
        events = listener.status_events()
    assert states(conn, ids) == {
        "l0": "cancelled",
        "l1": "cancelled",
        "l2": "cancelled",
        "l3": "cancelled",
        "side": "pending",
        "after_side": "waiting",
    }
    seen = {(e["id"], e["state"]) for e in events}
    for ref in ("l0", "l1", "l2", "l3"):
        assert (ids[ref], "cancelled") in seen
    assert (ids["side"], "pending") in seen
    # propagation coalesces its events: one NOTIFY for the whole cascade, not one per job
    assert len(events) == 5


def test_released_child_wakes_its_queue_and_keeps_a_future_run_at(conn: Conn, dsn: str) -> None:
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    ids = enqueue_many(
        conn,
        [
            {"kind": "p", "ref": "p"},
            {"kind": "now", "ref": "now", "queue": "q_now", "depends_on": [dep("p")]},
            {"kind": "later", "ref": "later", "run_at": later, "depends_on": [dep("p")]},
        ],
    )
    token = take(conn, ids["p"])
    with listening(dsn) as listener:
        assert one(conn, "SELECT pgjobs.complete(id => %s, lease_token => %s)", (ids["p"], token))
        got = listener.drain()
    assert states(conn, ids) == {"p": "succeeded", "now": "pending", "later": "scheduled"}
    assert ("pgjobs_wake", "q_now") in got


def test_dependencies_on_existing_jobs_and_resolution_at_insert(conn: Conn) -> None:
    done = enqueue_many(
        conn, [{"kind": "done", "ref": "done"}, {"kind": "bad", "ref": "bad"}, {"kind": "live", "ref": "live"}]
    )
    succeed(conn, done["done"])
    fail(conn, done["bad"])
    ids = enqueue_many(
        conn,
        [
            {"kind": "x1", "ref": "ok", "depends_on": [{"job": done["done"]}]},
            {"kind": "x2", "ref": "never", "depends_on": [{"job": done["bad"]}]},
            {"kind": "x3", "ref": "after_never", "depends_on": [dep("never", "complete")]},
            {"kind": "x4", "ref": "after_never_ok", "depends_on": [dep("never")]},
            {"kind": "x5", "ref": "handler", "depends_on": [{"job": done["bad"], "on": "failure"}]},
            {"kind": "x6", "ref": "waits", "depends_on": [{"job": done["live"]}, {"job": done["done"]}]},
        ],
    )
    assert states(conn, ids) == {
        "ok": "pending",
        "never": "cancelled",
        "after_never": "pending",
        "after_never_ok": "cancelled",
        "handler": "pending",
        "waits": "waiting",
    }
    assert one(conn, "SELECT remaining_deps FROM pgjobs.jobs WHERE id = %s", (ids["waits"],)) == 1
    assert one(conn, "SELECT has_dependents FROM pgjobs.jobs WHERE id = %s", (done["live"],)) is True
    succeed(conn, done["live"])
    assert state(conn, ids["waits"]) == "pending"


def test_dependency_on_a_job_found_by_unique_key(conn: Conn) -> None:
    first = enqueue_many(conn, [{"kind": "once", "ref": "o", "unique_key": "k"}])
    succeed(conn, first["o"])
    out = rows(
        conn,
        "SELECT * FROM pgjobs.enqueue_many(jobs => %s)",
        (
            Jsonb(
                [
                    {"kind": "once", "ref": "o", "unique_key": "k"},
                    {"kind": "next", "ref": "n", "depends_on": [dep("o")]},
                ]
            ),
        ),
    )
    by_ref = {r["ref"]: r for r in out}
    assert by_ref["o"]["id"] == first["o"] and by_ref["o"]["created"] is False
    assert state(conn, by_ref["n"]["id"]) == "pending"


@pytest.mark.parametrize("parent_first", [True, False])
def test_enqueue_racing_the_parents_completion_never_strands_the_child(
    connect: ConnectFactory, parent_first: bool
) -> None:
    """Open transactions in both orders: either the settler sees the edge, or the enqueuer sees the settled parent."""
    setup = connect()
    parent = enqueue_many(setup, [{"kind": "p", "ref": "p"}])["p"]
    token = take(setup, parent)
    completer = connect(autocommit=False)
    enqueuer = connect(autocommit=False)
    child: dict[str, int] = {}

    def complete() -> None:
        completer.execute("SELECT pgjobs.complete(id => %s, lease_token => %s)", (parent, token))

    def add_child() -> None:
        child.update(enqueue_many(enqueuer, [{"kind": "c", "ref": "c", "depends_on": [{"job": parent}]}]))

    first, second = (complete, add_child) if parent_first else (add_child, complete)
    first_conn, second_conn = (completer, enqueuer) if parent_first else (enqueuer, completer)
    first()
    blocked = threading.Thread(target=lambda: (second(), second_conn.commit()))
    blocked.start()
    time.sleep(0.3)  # let the second transaction queue on the parent's row lock
    first_conn.commit()
    blocked.join(30)
    assert not blocked.is_alive()
    assert state(setup, parent) == "succeeded"
    assert state(setup, child["c"]) == "pending"


def test_continuations_are_added_with_the_completion_and_read_the_result(conn: Conn) -> None:
    parent = enqueue_many(conn, [{"kind": "p", "ref": "p"}])["p"]
    succeed(
        conn,
        parent,
        result={"url": "s3://x"},
        continuations=[
            {"kind": "c1", "ref": "c1", "payload": {"n": 1}},
            {"kind": "c2", "ref": "c2", "depends_on": [dep("c1")]},
        ],
    )
    kids = rows(conn, "SELECT id, kind, state FROM pgjobs.jobs WHERE kind IN ('c1', 'c2') ORDER BY id")
    assert [(k["kind"], k["state"]) for k in kids] == [("c1", "pending"), ("c2", "waiting")]
    c1 = kids[0]["id"]
    status = rows(conn, "SELECT * FROM pgjobs.job_status(id => %s)", (c1,))[0]
    assert status["depends_on"] == [{"job": parent, "on": "success"}]
    assert one(conn, "SELECT pgjobs.parent_results(id => %s)", (c1,)) == {str(parent): {"url": "s3://x"}}
    succeed(conn, c1, result=[1, 2])
    assert state(conn, kids[1]["id"]) == "pending"
    # every continuation depends on the job that added it, plus its own dependencies
    assert one(conn, "SELECT pgjobs.parent_results(id => %s)", (kids[1]["id"],)) == {
        str(parent): {"url": "s3://x"},
        str(c1): [1, 2],
    }


def test_bad_continuations_roll_back_the_completion(conn: Conn) -> None:
    parent = enqueue_many(conn, [{"kind": "p", "ref": "p"}])["p"]
    token = take(conn, parent)
    with pytest.raises(psycopg.Error) as err:
        conn.execute(
            "SELECT pgjobs.complete(id => %s, lease_token => %s, continuations => %s)",
            (parent, token, Jsonb([{"kind": "c", "depends_on": [dep("nope")]}])),
        )
    assert err.value.sqlstate == "PJ005"
    assert state(conn, parent) == "active"


def test_parent_results_of_unknown_and_parentless_jobs(conn: Conn) -> None:
    lone = enqueue_many(conn, [{"kind": "lone", "ref": "l"}])["l"]
    assert one(conn, "SELECT pgjobs.parent_results(id => %s)", (lone,)) == {}
    assert one(conn, "SELECT pgjobs.parent_results(id => %s)", (10**12,)) is None


def test_parent_results_many_answers_for_the_jobs_that_have_parents(conn: Conn) -> None:
    ids = enqueue_many(conn, [{"kind": "p", "ref": "p"}, {"kind": "c", "ref": "c", "depends_on": [dep("p")]}])
    succeed(conn, ids["p"], result=7)
    got = rows(conn, "SELECT * FROM pgjobs.parent_results_many(ids => %s)", ([ids["p"], ids["c"], 10**12],))
    assert got == [{"id": ids["c"], "results": {str(ids["p"]): 7}}]


@pytest.mark.parametrize(
    ("specs", "sqlstate", "needle"),
    [
        (
            [{"kind": "a", "ref": "a", "depends_on": [dep("b")]}, {"kind": "b", "ref": "b", "depends_on": [dep("a")]}],
            "PJ005",
            "cycle",
        ),
        ([{"kind": "a", "ref": "a", "depends_on": [dep("a")]}], "PJ005", "cycle"),
        ([{"kind": "a", "ref": "a", "depends_on": [dep("ghost")]}], "PJ005", "ghost"),
        ([{"kind": "a", "depends_on": [{"job": 987654321}]}], "PJ005", "987654321"),
        ([{"kind": "a", "depends_on": [{"batch": 987654321}]}], "PJ005", "987654321"),
        (
            [{"kind": "a", "ref": "a"}, {"kind": "b", "depends_on": [dep("a"), dep("a", "failure")]}],
            "PJ005",
            "more than once",
        ),
        (
            [{"kind": "a", "ref": "x"}, {"kind": "b", "ref": "x"}, {"kind": "c", "depends_on": [dep("x")]}],
            "PJ005",
            "'x'",
        ),
        ([{"kind": "a", "ref": "a"}, {"kind": "b", "depends_on": [dep("a", "finished")]}], "PJ002", "finished"),
        ([{"kind": "a", "depends_on": {"ref": "a"}}], "PJ002", "array"),
        ([{"kind": "a", "depends_on": [{"ref": "a", "job": 1}]}], "PJ002", "exactly one"),
        ([{"kind": "a", "depends_on": [{"job": "12"}]}], "PJ002", "job id"),
    ],
)
def test_invalid_graphs_are_refused_whole(conn: Conn, specs: list[dict[str, Any]], sqlstate: str, needle: str) -> None:
    before = one(conn, "SELECT count(*) FROM pgjobs.jobs")
    with pytest.raises(psycopg.Error) as err:
        enqueue_many(conn, [{"kind": "innocent", "ref": "i"}, *specs])
    assert err.value.sqlstate == sqlstate
    assert needle in (err.value.diag.message_primary or "")
    assert one(conn, "SELECT count(*) FROM pgjobs.jobs") == before
    assert one(conn, "SELECT count(*) FROM pgjobs.batches") == 0


def test_a_long_cycle_is_spelled_out(conn: Conn) -> None:
    n = 50
    specs = [{"kind": f"k{i}", "ref": f"r{i}", "depends_on": [dep(f"r{(i + 1) % n}")]} for i in range(n)]
    specs.append({"kind": "tail", "ref": "tail", "depends_on": [dep("r0")]})
    with pytest.raises(psycopg.Error) as err:
        enqueue_many(conn, specs)
    message = err.value.diag.message_primary or ""
    assert err.value.sqlstate == "PJ005" and "cycle" in message
    assert message.count("->") == n


def test_refs_may_point_forward(conn: Conn) -> None:
    ids = enqueue_many(conn, [{"kind": "c", "ref": "c", "depends_on": [dep("p")]}, {"kind": "p", "ref": "p"}])
    assert states(conn, ids) == {"c": "waiting", "p": "pending"}


def test_retry_of_a_failed_parent_revives_the_children_it_cancelled(conn: Conn) -> None:
    ids = enqueue_many(
        conn,
        [
            {"kind": "p", "ref": "p"},
            {"kind": "c", "ref": "c", "depends_on": [dep("p")]},
            {"kind": "g", "ref": "g", "depends_on": [dep("c")]},
            {"kind": "h", "ref": "h", "depends_on": [dep("p", "failure")]},
        ],
    )
    fail(conn, ids["p"])
    assert states(conn, ids) == {"p": "failed", "c": "cancelled", "g": "cancelled", "h": "pending"}
    one(conn, "SELECT pgjobs.retry(id => %s)", (ids["p"],))
    # the handler already ran (was released); the cancelled branch waits again
    assert states(conn, ids) == {"p": "pending", "c": "waiting", "g": "waiting", "h": "pending"}
    succeed(conn, ids["p"])
    assert states(conn, ids)["c"] == "pending"
    succeed(conn, ids["c"])
    assert state(conn, ids["g"]) == "pending"


def test_a_child_cancelled_by_a_person_is_not_revived(conn: Conn) -> None:
    ids = enqueue_many(conn, [{"kind": "p", "ref": "p"}, {"kind": "c", "ref": "c", "depends_on": [dep("p")]}])
    assert cancel(conn, ids["c"])
    fail(conn, ids["p"])
    one(conn, "SELECT pgjobs.retry(id => %s)", (ids["p"],))
    assert state(conn, ids["c"]) == "cancelled"


@pytest.mark.smoke
@pytest.mark.timeout(180)
def test_two_hundred_parents_from_eight_connections_release_the_child_exactly_once(
    connect: ConnectFactory, dsn: str
) -> None:
    setup = connect()
    specs: list[dict[str, Any]] = [{"kind": "part", "ref": f"p{i}", "queue": "fan"} for i in range(200)]
    specs.append({"kind": "zip", "ref": "zip", "queue": "zipq", "depends_on": [dep(f"p{i}") for i in range(200)]})
    out = rows(setup, "SELECT * FROM pgjobs.enqueue_many(jobs => %s, as_batch => true)", (Jsonb(specs),))
    by_ref = {r["ref"]: r for r in out}
    batch_id, child = by_ref["zip"]["batch_id"], by_ref["zip"]["id"]
    claimed = rows(setup, "SELECT id, lease_token FROM pgjobs.claim(worker => 'w', queues => '{fan}', max_jobs => 200)")
    assert len(claimed) == 200

    def finish(i: int) -> int:
        c = connect()
        mine = claimed[i::8]
        done = 0
        # a mix of single completions (own transaction each) and small complete_many calls
        for j, row in enumerate(mine):
            if j % 3 == 0:
                done += int(
                    bool(
                        c.execute(
                            "SELECT pgjobs.complete(id => %s, lease_token => %s)", (row["id"], row["lease_token"])
                        ).fetchone()[0]
                    )
                )  # type: ignore[index]
        rest = [r for j, r in enumerate(mine) if j % 3 != 0]
        for k in range(0, len(rest), 4):
            chunk = rest[k : k + 4]
            got = c.execute(
                "SELECT pgjobs.complete_many(ids => %s::bigint[], lease_tokens => %s::uuid[])",
                ([r["id"] for r in chunk], [r["lease_token"] for r in chunk]),
            ).fetchone()
            done += int(got[0])  # type: ignore[index]
        return done

    with listening(dsn) as listener:
        assert sum(run_threads(8, finish)) == 200
        events = listener.status_events(timeout=1.0)
    assert state(setup, child) == "pending"
    assert one(setup, "SELECT remaining_deps FROM pgjobs.jobs WHERE id = %s", (child,)) == 0
    assert [e["state"] for e in events if e["id"] == child] == ["pending"]
    status = batch(setup, batch_id)
    assert (status["total"], status["pending"], status["succeeded"], status["state"]) == (201, 1, 200, "executing")
    assert one(setup, "SELECT count(*) FROM pgjobs.edges WHERE child_id = %s AND satisfied", (child,)) == 200


def test_fan_in_with_a_failure_among_concurrent_parents_cancels_once(connect: ConnectFactory) -> None:
    setup = connect()
    specs: list[dict[str, Any]] = [{"kind": "part", "ref": f"p{i}", "queue": "fan2"} for i in range(40)]
    specs.append({"kind": "zip", "ref": "zip", "queue": "z2", "depends_on": [dep(f"p{i}") for i in range(40)]})
    ids = enqueue_many(setup, specs)
    claimed = rows(setup, "SELECT id, lease_token FROM pgjobs.claim(worker => 'w', queues => '{fan2}', max_jobs => 40)")

    def finish(i: int) -> None:
        c = connect()
        for row in claimed[i::8]:
            if row["id"] == ids["p7"]:
                c.execute(
                    "SELECT pgjobs.dead_letter(id => %s, lease_token => %s, error => 'x')",
                    (row["id"], row["lease_token"]),
                )
            else:
                c.execute("SELECT pgjobs.complete(id => %s, lease_token => %s)", (row["id"], row["lease_token"]))

    run_threads(8, finish)
    assert state(setup, ids["zip"]) == "cancelled"
    assert one(setup, "SELECT failed_deps FROM pgjobs.jobs WHERE id = %s", (ids["zip"],)) == 1


def test_python_graph_builder(dsn: str) -> None:
    with pgjobs.Client(dsn) as client:
        existing = client.enqueue("seed").id
        with client.graph() as g:
            a = g.enqueue("a", {"n": 1})
            b = g.enqueue("b", after=[a, existing])
            handler = g.enqueue("on_b_failed", after=[on_failure(b)])
            g.enqueue("cleanup", after=[on_complete(b)])
        assert a.id is not None and b.id is not None and handler.id is not None
        assert g.batch_id is None
        status = client.job_status(b.id)
        assert status is not None and status.state == "waiting"
        assert sorted(d["job"] for d in status.depends_on) == sorted([a.id, existing])
        with pytest.raises(GraphError), client.graph() as bad:
            bad.enqueue("x", after=[987654321])
        with pytest.raises(InvalidArgument):
            client.enqueue_many([{"kind": "x", "depends_on": [{"job": existing, "on": "later"}]}])
        # a ref from a submitted builder is an existing job for the next one
        with client.graph() as g2:
            later = g2.enqueue("later", after=[a])
        status = client.job_status(later.id or 0)
        assert status is not None and status.depends_on == [{"job": a.id, "on": "success"}]
        assert client.parent_results(later.id or 0) == {a.id: None}


@pytest.mark.parametrize("broken", [False, True])
def test_readme_example_fan_out_fan_in_with_a_failure_handler(dsn: str, broken: bool) -> None:
    """The worked example of docs/workflows.md, run by a real Worker."""
    import anyio

    from pgjobs import App, AsyncClient, Worker

    app = App()
    client = AsyncClient(dsn)
    alerts: list[Any] = []

    @app.job("resize")
    async def resize(payload: dict[str, Any], ctx: Any) -> dict[str, str]:
        if payload["image"] == "broken.png":
            raise ValueError("not an image")
        return {"thumb": f"thumbs/{payload['image']}"}

    @app.job("zip")
    async def zip_album(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
        parents = await client.parent_results(ctx.id)  # {resize job id: its result}
        return {"zip": payload["name"], "files": sorted(r["thumb"] for r in (parents or {}).values())}

    @app.job("alert")
    async def alert(payload: dict[str, Any], ctx: Any) -> None:
        alerts.append(payload)

    images = ["a.png", "b.png", "broken.png" if broken else "c.png"]
    with pgjobs.Client(dsn) as sync_client, sync_client.batch() as b:
        resized = [b.enqueue("resize", {"image": name}, max_attempts=1) for name in images]
        zipped = b.enqueue("zip", {"name": "album.zip"}, after=resized)
        b.then("alert", {"batch": "album"}, on="failure")
    assert b.batch_id is not None and zipped.id is not None
    batch_id, zip_id = b.batch_id, zipped.id

    async def main() -> None:
        worker = Worker(app, dsn, scheduler=False, poll_interval=0.2, heartbeat_interval=1.0)
        async with client, anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(30):
                while True:
                    status = await client.batch_status(batch_id)
                    assert status is not None
                    if status.state.settled and (not broken or alerts):
                        break
                    await anyio.sleep(0.05)
            worker.stop()

    anyio.run(main)
    with pgjobs.Client(dsn) as sync_client:
        status = sync_client.batch_status(batch_id)
        zip_job = sync_client.job_status(zip_id)
        assert status is not None and zip_job is not None
        if broken:
            assert status.state == "failed" and zip_job.state == "cancelled" and alerts == [{"batch": "album"}]
        else:
            assert status.state == "succeeded" and alerts == []
            assert zip_job.result == {"zip": "album.zip", "files": ["thumbs/a.png", "thumbs/b.png", "thumbs/c.png"]}
