"""The workflow contract of DESIGN.md (graphs, batches), checked as an outsider would.

Only what DESIGN.md and its clarifications say: every call goes through a contract function by name with
named arguments, and every assertion quotes a rule (return shapes and column names, SQLSTATEs, trigger and
cancelled-parent rules, resolution at enqueue, cascade cancellation, the batch settled-state rule,
`cancel_batch`'s count, `purge`, reads of unknown ids, notifications). The few direct reads of
`pgjobs.jobs` / `pgjobs.edges` / `pgjobs.batches` only count rows to prove that bad input changed nothing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from tests.helpers.graph import log_head, logged_since

Conn = psycopg.Connection[Any]
TERMINAL = {"succeeded", "failed", "cancelled"}
BATCH_STATUS_COLUMNS = [
    "id",
    "state",
    "total",
    "pending",
    "succeeded",
    "failed",
    "cancelled",
    "fraction_settled",
    "created_at",
    "started_at",
    "completed_at",
]


# --- helpers: contract calls only ---------------------------------------------------------------------


def q(conn: Conn, query: str, params: Any = None) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchall() if cur.description else []


def scalar(conn: Conn, query: str, params: Any = None) -> Any:
    with conn.cursor() as cur:
        cur.execute(query, params)
        row = cur.fetchone()
        assert row is not None
        return row[0]


def many(conn: Conn, jobs: list[dict[str, Any]], as_batch: bool = False) -> list[dict[str, Any]]:
    return q(conn, "SELECT * FROM pgjobs.enqueue_many(jobs => %s, as_batch => %s)", (Jsonb(jobs), as_batch))


def refs(conn: Conn, jobs: list[dict[str, Any]], as_batch: bool = False) -> dict[str, int]:
    return {r["ref"]: r["id"] for r in many(conn, jobs, as_batch)}


def one_job(conn: Conn, kind: str, **kw: Any) -> int:
    args = ", ".join(f"{k} => %({k})s" for k in kw)
    params = {k: Jsonb(v) if isinstance(v, dict) else v for k, v in kw.items()}
    params["kind"] = kind
    sql = f"SELECT id FROM pgjobs.enqueue(kind => %(kind)s{', ' + args if args else ''})"
    return int(scalar(conn, sql, params))


def status(conn: Conn, job_id: int) -> dict[str, Any]:
    found = q(conn, "SELECT * FROM pgjobs.job_status(id => %s)", (job_id,))
    assert len(found) == 1, found
    return found[0]


def st(conn: Conn, job_id: int) -> str:
    return str(status(conn, job_id)["state"])


def bstatus(conn: Conn, batch_id: int) -> dict[str, Any]:
    found = q(conn, "SELECT * FROM pgjobs.batch_status(batch_id => %s)", (batch_id,))
    assert len(found) == 1, found
    return found[0]


def claim(conn: Conn, job_id: int) -> UUID:
    """Claims exactly `job_id` (each test job has a kind of its own; kind_limits takes only that kind)."""
    job = status(conn, job_id)
    got = q(
        conn,
        "SELECT * FROM pgjobs.claim(worker => 'contract', queues => %s::text[], max_jobs => 1, kind_limits => %s)",
        ([job["queue"]], Jsonb({job["kind"]: 1})),
    )
    assert [g["id"] for g in got] == [job_id], (job_id, got, job["state"])
    return UUID(str(got[0]["lease_token"]))


def succeed(conn: Conn, job_id: int, result: Any = None, continuations: Any = None) -> None:
    token = claim(conn, job_id)
    assert scalar(
        conn,
        "SELECT pgjobs.complete(id => %s, lease_token => %s, result => %s, continuations => %s)",
        (job_id, token, Jsonb(result), None if continuations is None else Jsonb(continuations)),
    )


def fail(conn: Conn, job_id: int) -> None:
    token = claim(conn, job_id)
    assert scalar(conn, "SELECT pgjobs.dead_letter(id => %s, lease_token => %s, error => 'boom')", (job_id, token))


def cancel(conn: Conn, job_id: int) -> bool:
    return bool(scalar(conn, "SELECT pgjobs.cancel(id => %s)", (job_id,)))


def finish(conn: Conn, job_id: int, outcome: str) -> None:
    {"succeeded": succeed, "failed": fail, "cancelled": cancel}[outcome](conn, job_id)
    assert st(conn, job_id) == outcome


def footprint(conn: Conn) -> tuple[int, int, int]:
    """Rows of jobs, edges, batches: what a refused call must leave as it was."""
    row = q(
        conn,
        "SELECT (SELECT count(*) FROM pgjobs.jobs) AS j, (SELECT count(*) FROM pgjobs.edges) AS e,"
        " (SELECT count(*) FROM pgjobs.batches) AS b",
    )[0]
    return (row["j"], row["e"], row["b"])


def raises(conn: Conn, sqlstate: str, query: str, params: Any = None) -> psycopg.Error:
    before = footprint(conn)
    with pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)
    assert info.value.sqlstate == sqlstate, (info.value.sqlstate, str(info.value))
    assert footprint(conn) == before, "a refused call changed something"
    return info.value


class Listener:
    """pgjobs_wake / pgjobs_cancel notifications, then the status events logged since creation (read_events)."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        for channel in ("pgjobs_wake", "pgjobs_cancel"):
            self.conn.execute(f"LISTEN {channel}")
        self.cursor = log_head(self.conn)

    def drain(self) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        for n in self.conn.notifies(timeout=0.3, stop_after=None):
            out.append((n.channel, n.payload))
        self.cursor, events = logged_since(self.conn, self.cursor)
        return out + [("pgjobs_status", e) for e in events]


@contextmanager
def listening(dsn: str) -> Iterator[Listener]:
    listener = Listener(dsn)
    try:
        yield listener
    finally:
        listener.conn.close()


def events_by_id(events: list[tuple[str, Any]]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for channel, e in events:
        if channel == "pgjobs_status":
            assert set(e) == {"id", "state", "queue", "kind", "attempt", "batch_id"}, e
            out.setdefault(e["id"], []).append(e["state"])
    return out


# --- enqueue_many: shape ---------------------------------------------------------------------------------


def _enqueue_many_returns_ref_id_created_batch_id(conn: Conn) -> None:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT * FROM pgjobs.enqueue_many(jobs => %s, as_batch => true)",
            (Jsonb([{"kind": "wa", "ref": "a"}, {"kind": "wb", "ref": "b", "depends_on": [{"ref": "a"}]}]),),
        )
        assert cur.description is not None
        assert [c.name for c in cur.description] == ["ref", "id", "created", "batch_id"]
        got = cur.fetchall()
    assert [r[0] for r in got] == ["a", "b"]
    assert all(r[2] is True for r in got)
    assert got[0][3] is not None and got[0][3] == got[1][3]
    assert st(conn, got[0][1]) == "pending" and st(conn, got[1][1]) == "waiting"
    plain = many(conn, [{"kind": "wc"}])
    assert plain[0]["ref"] is None and plain[0]["batch_id"] is None and plain[0]["created"] is True


def _depends_on_in_job_status_names_jobs_and_batches_with_their_trigger(conn: Conn) -> None:
    b = many(conn, [{"kind": "m1"}], as_batch=True)[0]["batch_id"]
    ids = refs(
        conn,
        [
            {"kind": "p", "ref": "p"},
            {"kind": "c", "ref": "c", "depends_on": [{"ref": "p", "on": "failure"}, {"batch": b, "on": "complete"}]},
            {"kind": "d", "ref": "d", "depends_on": [{"ref": "p"}]},
        ],
    )
    assert sorted(status(conn, ids["c"])["depends_on"], key=json.dumps) == sorted(
        [{"job": ids["p"], "on": "failure"}, {"batch": b, "on": "complete"}], key=json.dumps
    )
    assert status(conn, ids["d"])["depends_on"] == [{"job": ids["p"], "on": "success"}]  # "on" defaults
    assert status(conn, ids["p"])["depends_on"] in ([], None)


def _all_or_nothing_a_bad_spec_anywhere_creates_nothing(conn: Conn) -> None:
    one_job(conn, "seed")
    raises(
        conn,
        "PJ002",
        "SELECT * FROM pgjobs.enqueue_many(jobs => %s, as_batch => true)",
        (Jsonb([{"kind": "ok", "ref": "a"}, {"kind": "ok2", "depends_on": [{"ref": "a"}]}, {"kind": ""}]),),
    )


# --- errors ----------------------------------------------------------------------------------------------


def _unknown_trigger_is_pj002(conn: Conn) -> None:
    for trigger in ("sometimes", "SUCCESS", 1, "", ["success"]):
        specs = [{"kind": "a", "ref": "a"}, {"kind": "b", "depends_on": [{"ref": "a", "on": trigger}]}]
        for as_batch in (False, True):
            err = raises(
                conn, "PJ002", "SELECT * FROM pgjobs.enqueue_many(jobs => %s, as_batch => %s)", (Jsonb(specs), as_batch)
            )
            assert json.dumps(trigger).strip('"') in str(err), (trigger, str(err))


def _unknown_trigger_in_continuations_and_add_to_batch_is_pj002(conn: Conn) -> None:
    p = one_job(conn, "cont-parent")
    token = claim(conn, p)
    raises(
        conn,
        "PJ002",
        "SELECT pgjobs.complete(id => %s, lease_token => %s, continuations => %s)",
        (p, token, Jsonb([{"kind": "x", "depends_on": [{"job": p, "on": "never"}]}])),
    )
    assert st(conn, p) == "active"  # the completion rolled back with the refusal
    m = many(conn, [{"kind": "member"}], as_batch=True)[0]["id"]
    mt = claim(conn, m)
    raises(
        conn,
        "PJ002",
        "SELECT pgjobs.add_to_batch(id => %s, lease_token => %s, job => %s, before_continuations => false)",
        (m, mt, Jsonb({"kind": "sib", "depends_on": [{"job": p, "on": "whenever"}]})),
    )


INVALID_GRAPHS = {
    name: (specs, needle)
    for name, (specs, needle) in zip(
        ["two-cycle", "self", "three-cycle", "unknown-ref", "missing-job", "missing-batch", "duplicate-edge"],
        [
            (
                [
                    {"kind": "a", "ref": "a", "depends_on": [{"ref": "b"}]},
                    {"kind": "b", "ref": "b", "depends_on": [{"ref": "a"}]},
                ],
                "cycle",
            ),
            ([{"kind": "a", "ref": "a", "depends_on": [{"ref": "a"}]}], "cycle"),
            (
                [
                    {"kind": "a", "ref": "a", "depends_on": [{"ref": "c"}]},
                    {"kind": "b", "ref": "b", "depends_on": [{"ref": "a"}]},
                    {"kind": "c", "ref": "c", "depends_on": [{"ref": "b"}]},
                ],
                "cycle",
            ),
            ([{"kind": "a", "depends_on": [{"ref": "ghost"}]}], "ghost"),
            ([{"kind": "a", "depends_on": [{"job": 987654321}]}], "987654321"),
            ([{"kind": "a", "depends_on": [{"batch": 987654321}]}], "987654321"),
            (
                [{"kind": "a", "ref": "a"}, {"kind": "b", "depends_on": [{"ref": "a"}, {"ref": "a", "on": "failure"}]}],
                "a",
            ),
        ],
        strict=True,
    )
}


def _invalid_graphs_are_pj005_naming_the_offender(conn: Conn) -> None:
    one_job(conn, "seed")
    for name, (specs, needle) in INVALID_GRAPHS.items():
        for as_batch in (False, True):
            err = raises(
                conn, "PJ005", "SELECT * FROM pgjobs.enqueue_many(jobs => %s, as_batch => %s)", (Jsonb(specs), as_batch)
            )
            assert needle in str(err), (name, str(err))


def _missing_parent_in_continuations_is_pj005_and_the_completion_rolls_back(conn: Conn) -> None:
    p = one_job(conn, "cp")
    token = claim(conn, p)
    raises(
        conn,
        "PJ005",
        "SELECT pgjobs.complete(id => %s, lease_token => %s, continuations => %s)",
        (p, token, Jsonb([{"kind": "x", "depends_on": [{"job": 987654321}]}])),
    )
    assert st(conn, p) == "active"


def _reads_of_unknown_ids_return_no_row_or_null(conn: Conn) -> None:
    assert q(conn, "SELECT * FROM pgjobs.job_status(id => 987654321)") == []
    assert q(conn, "SELECT * FROM pgjobs.batch_status(batch_id => 987654321)") == []
    assert scalar(conn, "SELECT pgjobs.batch_graph(batch_id => 987654321)") is None
    assert q(conn, "SELECT * FROM pgjobs.job_status(id => NULL)") == []
    assert q(conn, "SELECT * FROM pgjobs.batch_status(batch_id => NULL)") == []
    assert scalar(conn, "SELECT pgjobs.batch_graph(batch_id => NULL)") is None


def _mutations_of_unknown_ids_are_pj003(conn: Conn) -> None:
    one_job(conn, "seed")
    for query in (
        "SELECT pgjobs.cancel(id => 987654321)",
        "SELECT pgjobs.retry(id => 987654321)",
        "SELECT pgjobs.delete(id => 987654321)",
        "SELECT pgjobs.cancel_batch(batch_id => 987654321)",
    ):
        raises(conn, "PJ003", query)


def _add_to_batch_from_a_job_outside_a_batch_is_pj004(conn: Conn) -> None:
    j = one_job(conn, "loner")
    token = claim(conn, j)
    raises(
        conn,
        "PJ004",
        "SELECT pgjobs.add_to_batch(id => %s, lease_token => %s, job => %s, before_continuations => false)",
        (j, token, Jsonb({"kind": "sib"})),
    )
    assert st(conn, j) == "active"
    # the clarification's other PJ004s
    raises(conn, "PJ004", "SELECT pgjobs.retry(id => %s)", (j,))  # active: not failed or cancelled
    raises(conn, "PJ004", "SELECT pgjobs.delete(id => %s)", (j,))  # live
    waiting = many(conn, [{"kind": "pj4-w", "depends_on": [{"job": j}]}])[0]["id"]
    raises(conn, "PJ004", "SELECT pgjobs.retry(id => %s)", (waiting,))
    raises(conn, "PJ004", "SELECT pgjobs.delete(id => %s)", (waiting,))
    assert scalar(conn, "SELECT pgjobs.complete(id => %s, lease_token => %s)", (j, token))
    assert st(conn, waiting) == "pending"
    assert cancel(conn, j) is False  # terminal


# --- triggers --------------------------------------------------------------------------------------------

OUTCOMES = ["succeeded", "failed", "cancelled"]
# (parent outcome, trigger) -> does the child run? A cancelled parent is neither success nor failure.
RUNS = {
    ("succeeded", "success"): True,
    ("succeeded", "failure"): False,
    ("succeeded", "complete"): True,
    ("failed", "success"): False,
    ("failed", "failure"): True,
    ("failed", "complete"): True,
    ("cancelled", "success"): False,
    ("cancelled", "failure"): False,
    ("cancelled", "complete"): True,
}


def _trigger_rules_when_the_parent_settles_later(conn: Conn) -> None:
    for outcome in OUTCOMES:
        ids = refs(
            conn,
            [{"kind": f"parent-{outcome}", "ref": "p"}]
            + [
                {"kind": f"on-{t}-{outcome}", "ref": t, "depends_on": [{"ref": "p", "on": t}]}
                for t in ("success", "failure", "complete")
            ],
        )
        assert {st(conn, ids[t]) for t in ("success", "failure", "complete")} == {"waiting"}
        finish(conn, ids["p"], outcome)
        for t in ("success", "failure", "complete"):
            assert st(conn, ids[t]) == ("pending" if RUNS[(outcome, t)] else "cancelled"), (outcome, t)


def _a_dependency_on_a_finished_parent_is_resolved_at_enqueue(conn: Conn) -> None:
    for outcome in OUTCOMES:
        p = one_job(conn, f"done-parent-{outcome}")
        finish(conn, p, outcome)
        for t in ("success", "failure", "complete"):
            child = many(conn, [{"kind": f"late-{t}", "depends_on": [{"job": p, "on": t}]}])[0]["id"]
            assert st(conn, child) == ("pending" if RUNS[(outcome, t)] else "cancelled"), (outcome, t)
            assert status(conn, child)["depends_on"] == [{"job": p, "on": t}]


def _a_dependency_on_a_settled_batch_is_resolved_at_enqueue(conn: Conn) -> None:
    for outcome in OUTCOMES:
        m = many(conn, [{"kind": f"only-member-{outcome}"}], as_batch=True)[0]
        finish(conn, m["id"], outcome)
        assert bstatus(conn, m["batch_id"])["state"] == outcome
        for t in ("success", "failure", "complete"):
            child = many(conn, [{"kind": f"after-batch-{t}", "depends_on": [{"batch": m["batch_id"], "on": t}]}])
            assert st(conn, child[0]["id"]) == ("pending" if RUNS[(outcome, t)] else "cancelled"), (outcome, t)
            assert status(conn, child[0]["id"])["depends_on"] == [{"batch": m["batch_id"], "on": t}]


def _batch_continuations_follow_the_batch_state(conn: Conn) -> None:
    for outcome in OUTCOMES:
        members = many(conn, [{"kind": f"bm1-{outcome}"}, {"kind": f"bm2-{outcome}"}], as_batch=True)
        b = members[0]["batch_id"]
        kids = {
            t: many(conn, [{"kind": f"bk-{t}", "depends_on": [{"batch": b, "on": t}]}])[0]["id"]
            for t in ("success", "failure", "complete")
        }
        finish(conn, members[0]["id"], "succeeded")
        assert {st(conn, k) for k in kids.values()} == {"waiting"}  # the batch has not settled yet
        finish(conn, members[1]["id"], outcome)
        assert bstatus(conn, b)["state"] == outcome
        for t, k in kids.items():
            assert st(conn, k) == ("pending" if RUNS[(outcome, t)] else "cancelled"), (outcome, t)


def _edges_are_anded_and_an_unmeetable_one_cancels_at_once(conn: Conn) -> None:
    ids = refs(
        conn,
        [
            {"kind": "a", "ref": "a"},
            {"kind": "b", "ref": "b"},
            {"kind": "c", "ref": "c", "depends_on": [{"ref": "a"}, {"ref": "b"}]},
        ],
    )
    succeed(conn, ids["a"])
    assert st(conn, ids["c"]) == "waiting"
    fail_ids = refs(
        conn,
        [
            {"kind": "x", "ref": "x"},
            {"kind": "y", "ref": "y"},
            {"kind": "z", "ref": "z", "depends_on": [{"ref": "x"}, {"ref": "y"}]},
        ],
    )
    fail(conn, fail_ids["x"])
    assert st(conn, fail_ids["z"]) == "cancelled"  # y is still pending: known already
    assert st(conn, fail_ids["y"]) == "pending"
    succeed(conn, ids["b"])
    assert st(conn, ids["c"]) == "pending"


def _cascade_cancellation_through_the_graph_with_notifications(conn: Conn, dsn: str) -> None:
    ids = refs(
        conn,
        [
            {"kind": "r", "ref": "r"},
            {"kind": "l1", "ref": "l1", "depends_on": [{"ref": "r"}]},
            {"kind": "l2", "ref": "l2", "depends_on": [{"ref": "l1", "on": "failure"}]},
            {"kind": "l3", "ref": "l3", "depends_on": [{"ref": "l2"}]},
            {"kind": "fin", "ref": "fin", "depends_on": [{"ref": "l1", "on": "complete"}]},
            {"kind": "after-fin", "ref": "af", "depends_on": [{"ref": "fin"}]},
        ],
    )
    with listening(dsn) as listener:
        assert cancel(conn, ids["r"]) is True
        events = listener.drain()
    assert st(conn, ids["l1"]) == "cancelled"
    assert st(conn, ids["l2"]) == "cancelled"
    assert st(conn, ids["l3"]) == "cancelled"
    assert st(conn, ids["fin"]) == "pending"  # a cancelled parent still runs its `complete` children
    assert st(conn, ids["af"]) == "waiting"
    seen = events_by_id(events)
    for ref in ("r", "l1", "l2", "l3"):
        assert seen.get(ids[ref], [])[-1:] == ["cancelled"], (ref, seen)
    assert seen.get(ids["fin"], [])[-1:] == ["pending"]
    assert ("pgjobs_wake", "default") in events
    assert ids["af"] not in seen  # unchanged: no event


def _completing_a_parent_notifies_the_released_child_and_wakes_its_queue(conn: Conn, dsn: str) -> None:
    ids = refs(
        conn,
        [
            {"kind": "np", "ref": "p", "queue": "q-parent"},
            {"kind": "nc", "ref": "c", "queue": "q-child", "depends_on": [{"ref": "p"}]},
            {"kind": "nf", "ref": "f", "queue": "q-fail", "depends_on": [{"ref": "p", "on": "failure"}]},
        ],
    )
    with listening(dsn) as listener:
        succeed(conn, ids["p"])
        events = listener.drain()
    seen = events_by_id(events)
    assert seen[ids["p"]][-1] == "succeeded"
    assert seen[ids["c"]] == ["pending"]
    assert seen[ids["f"]] == ["cancelled"]
    wakes = [p for ch, p in events if ch == "pgjobs_wake"]
    assert "q-child" in wakes and "q-fail" not in wakes


def _a_released_child_with_a_future_run_at_is_scheduled_not_woken(conn: Conn, dsn: str) -> None:
    ids = refs(
        conn,
        [
            {"kind": "fp", "ref": "p", "queue": "qp"},
            {
                "kind": "fc",
                "ref": "c",
                "queue": "q-later",
                "run_at": "2999-01-01T00:00:00Z",
                "depends_on": [{"ref": "p"}],
            },
        ],
    )
    with listening(dsn) as listener:
        succeed(conn, ids["p"])
        events = listener.drain()
    assert st(conn, ids["c"]) == "scheduled"
    assert ("pgjobs_wake", "q-later") not in events


def test_two_parents_settling_concurrently_release_the_child_once(connect: Any) -> None:
    conn = connect()
    ids = refs(
        conn,
        [{"kind": f"race-{i}", "ref": f"p{i}"} for i in range(6)]
        + [{"kind": "race-join", "ref": "join", "depends_on": [{"ref": f"p{i}"} for i in range(6)]}],
    )
    tokens = {i: claim(conn, ids[f"p{i}"]) for i in range(6)}
    barrier = threading.Barrier(6, timeout=30)
    errors: list[BaseException] = []
    conns = [connect() for _ in range(6)]

    def body(i: int) -> None:
        try:
            barrier.wait()
            conns[i].execute("SELECT pgjobs.complete(id => %s, lease_token => %s)", (ids[f"p{i}"], tokens[i]))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert st(conn, ids["join"]) == "pending"
    assert status(conn, ids["join"])["remaining_deps"] == 0


# --- batches ---------------------------------------------------------------------------------------------


def _batch_status_columns_counters_and_times(conn: Conn) -> None:
    got = many(conn, [{"kind": f"bs{i}", "ref": str(i)} for i in range(4)], as_batch=True)
    b = got[0]["batch_id"]
    with conn.cursor() as cur:
        cur.execute("SELECT * FROM pgjobs.batch_status(batch_id => %s)", (b,))
        assert cur.description is not None
        assert [c.name for c in cur.description] == BATCH_STATUS_COLUMNS
    s = bstatus(conn, b)
    assert (s["id"], s["state"], s["total"], s["pending"], s["succeeded"], s["failed"], s["cancelled"]) == (
        b,
        "executing",
        4,
        4,
        0,
        0,
        0,
    )
    assert s["fraction_settled"] == 0 and s["created_at"] is not None
    assert s["started_at"] is None and s["completed_at"] is None
    succeed(conn, got[0]["id"])
    s = bstatus(conn, b)
    assert s["started_at"] is not None and s["pending"] == 3 and s["succeeded"] == 1
    assert s["fraction_settled"] == pytest.approx(0.25)
    token = claim(conn, got[1]["id"])  # active is "not yet terminal": still pending
    assert bstatus(conn, b)["pending"] == 3
    conn.execute(
        "SELECT pgjobs.fail(id => %s, lease_token => %s, error => 'x', retry_at => now())", (got[1]["id"], token)
    )
    assert bstatus(conn, b)["pending"] == 3  # back to scheduled/pending for a retry: not terminal
    fail(conn, got[2]["id"])
    cancel(conn, got[3]["id"])
    s = bstatus(conn, b)
    assert (s["pending"], s["failed"], s["cancelled"], s["state"]) == (1, 1, 1, "executing")
    assert s["completed_at"] is None
    succeed(conn, got[1]["id"])
    s = bstatus(conn, b)
    assert (s["state"], s["pending"], s["succeeded"], s["fraction_settled"]) == ("failed", 0, 2, 1)
    assert s["completed_at"] is not None


def _settled_batch_state_rule(conn: Conn) -> None:
    cases = [
        (["succeeded", "succeeded"], "succeeded"),
        (["succeeded", "failed"], "failed"),
        (["succeeded", "cancelled"], "cancelled"),
        (["cancelled", "failed"], "failed"),
        (["failed", "cancelled", "succeeded"], "failed"),
        (["cancelled", "cancelled"], "cancelled"),
    ]
    for n, (outcomes, expected) in enumerate(cases):
        got = many(conn, [{"kind": f"sr{n}-{i}"} for i in range(len(outcomes))], as_batch=True)
        for r, outcome in zip(got, outcomes, strict=True):
            assert bstatus(conn, r["batch_id"])["state"] == "executing"
            finish(conn, r["id"], outcome)
        assert bstatus(conn, got[0]["batch_id"])["state"] == expected, outcomes


def _cancel_batch_returns_how_many_members_it_cancelled(conn: Conn, dsn: str) -> None:
    got = many(
        conn,
        [
            {"kind": "cb-done", "ref": "done"},
            {"kind": "cb-p1", "ref": "p1"},
            {"kind": "cb-p2", "ref": "p2", "run_at": "2999-01-01T00:00:00Z"},
            {"kind": "cb-w", "ref": "w", "depends_on": [{"ref": "p1"}]},
        ],
        as_batch=True,
    )
    ids = {r["ref"]: r["id"] for r in got}
    b = got[0]["batch_id"]
    after = many(conn, [{"kind": "cb-after", "depends_on": [{"batch": b, "on": "success"}]}])[0]["id"]
    after_c = many(conn, [{"kind": "cb-after-c", "depends_on": [{"batch": b, "on": "complete"}]}])[0]["id"]
    succeed(conn, ids["done"])
    with listening(dsn) as listener:
        assert scalar(conn, "SELECT pgjobs.cancel_batch(batch_id => %s)", (b,)) == 3
        events = listener.drain()
    assert {k: st(conn, v) for k, v in ids.items()} == {
        "done": "succeeded",
        "p1": "cancelled",
        "p2": "cancelled",
        "w": "cancelled",
    }
    s = bstatus(conn, b)
    assert (s["state"], s["pending"], s["succeeded"], s["cancelled"]) == ("cancelled", 0, 1, 3)
    assert st(conn, after) == "cancelled" and st(conn, after_c) == "pending"
    seen = events_by_id(events)
    for ref in ("p1", "p2", "w"):
        assert seen[ids[ref]][-1] == "cancelled"
    assert seen[after][-1] == "cancelled" and seen[after_c][-1] == "pending"
    assert scalar(conn, "SELECT pgjobs.cancel_batch(batch_id => %s)", (b,)) == 0  # nothing left to cancel


def _cancel_batch_with_a_running_member_settles_when_it_ends(conn: Conn) -> None:
    got = many(conn, [{"kind": "cr-run"}, {"kind": "cr-idle"}], as_batch=True)
    b = got[0]["batch_id"]
    token = claim(conn, got[0]["id"])
    assert scalar(conn, "SELECT pgjobs.cancel_batch(batch_id => %s)", (b,)) == 2
    assert status(conn, got[0]["id"])["cancel_requested"] is True
    assert bstatus(conn, b)["state"] == "executing"
    # The worker obeys (a fail of a job whose cancellation was requested ends it cancelled).
    conn.execute("SELECT pgjobs.fail(id => %s, lease_token => %s, error => 'stopped')", (got[0]["id"], token))
    assert st(conn, got[0]["id"]) == "cancelled"
    assert bstatus(conn, b)["state"] == "cancelled"


def _add_to_batch_joins_the_batch_and_holds_it_open(conn: Conn) -> None:
    got = many(conn, [{"kind": "ab-m"}], as_batch=True)
    m, b = got[0]["id"], got[0]["batch_id"]
    token = claim(conn, m)
    sib = scalar(
        conn,
        "SELECT pgjobs.add_to_batch(id => %s, lease_token => %s, job => %s, before_continuations => false)",
        (m, token, Jsonb({"kind": "ab-sib", "payload": {"n": 1}})),
    )
    assert isinstance(sib, int)
    s = status(conn, sib)
    assert (s["batch_id"], s["state"], s["payload"]) == (b, "pending", {"n": 1})
    assert (bstatus(conn, b)["total"], bstatus(conn, b)["pending"]) == (2, 2)
    assert scalar(conn, "SELECT pgjobs.complete(id => %s, lease_token => %s)", (m, token))
    assert bstatus(conn, b)["state"] == "executing"  # settled only when every member, added ones too, is
    succeed(conn, sib)
    assert bstatus(conn, b)["state"] == "succeeded" and bstatus(conn, b)["total"] == 2


def _add_to_batch_with_a_stale_token_changes_nothing(conn: Conn) -> None:
    got = many(conn, [{"kind": "st-m"}], as_batch=True)
    m = got[0]["id"]
    claim(conn, m)
    before = footprint(conn)
    assert (
        scalar(
            conn,
            "SELECT pgjobs.add_to_batch(id => %s, lease_token => %s, job => %s, before_continuations => false)",
            (m, UUID(int=1), Jsonb({"kind": "never"})),
        )
        is None
    )
    assert footprint(conn) == before


def _before_continuations_makes_the_callers_continuations_wait_for_the_sibling(conn: Conn) -> None:
    got = many(
        conn,
        [{"kind": "bc-m", "ref": "m"}, {"kind": "bc-next", "ref": "next", "depends_on": [{"ref": "m"}]}],
        as_batch=True,
    )
    ids = {r["ref"]: r["id"] for r in got}
    plain = many(conn, [{"kind": "bc-plain", "depends_on": [{"job": ids["m"], "on": "success"}]}])[0]["id"]
    token = claim(conn, ids["m"])
    sib = scalar(
        conn,
        "SELECT pgjobs.add_to_batch(id => %s, lease_token => %s, job => %s, before_continuations => true)",
        (ids["m"], token, Jsonb({"kind": "bc-sib"})),
    )
    assert scalar(
        conn,
        "SELECT pgjobs.complete(id => %s, lease_token => %s, continuations => %s)",
        (ids["m"], token, Jsonb([{"kind": "bc-cont"}])),
    )
    cont = q(conn, "SELECT id FROM pgjobs.jobs WHERE kind = 'bc-cont'")[0]["id"]
    for k in (ids["next"], plain, cont):
        assert st(conn, k) == "waiting", k
    succeed(conn, sib)
    for k in (ids["next"], plain, cont):
        assert st(conn, k) == "pending", k
    # without before_continuations the continuations do not wait
    got2 = many(
        conn,
        [{"kind": "bc2-m", "ref": "m"}, {"kind": "bc2-n", "ref": "n", "depends_on": [{"ref": "m"}]}],
        as_batch=True,
    )
    m2 = got2[0]["id"]
    t2 = claim(conn, m2)
    scalar(
        conn,
        "SELECT pgjobs.add_to_batch(id => %s, lease_token => %s, job => %s, before_continuations => false)",
        (m2, t2, Jsonb({"kind": "bc2-sib"})),
    )
    scalar(conn, "SELECT pgjobs.complete(id => %s, lease_token => %s)", (m2, t2))
    assert st(conn, got2[1]["id"]) == "pending"


def _add_to_batch_named_with_defaults(conn: Conn) -> None:
    got = many(conn, [{"kind": "df-m"}], as_batch=True)
    token = claim(conn, got[0]["id"])
    sib = scalar(
        conn,
        "SELECT pgjobs.add_to_batch(id => %s, lease_token => %s, job => %s)",
        (got[0]["id"], token, Jsonb({"kind": "df-s"})),
    )
    assert status(conn, sib)["batch_id"] == got[0]["batch_id"]


def _complete_with_continuations_adds_follow_ups_depending_on_the_parent(conn: Conn) -> None:
    p = one_job(conn, "cw-parent")
    succeed(conn, p, result={"v": 1}, continuations=[{"kind": "cw-next", "ref": "n", "payload": {"x": 1}}])
    follow = q(conn, "SELECT id FROM pgjobs.jobs WHERE kind = 'cw-next'")
    assert len(follow) == 1
    s = status(conn, follow[0]["id"])
    assert s["state"] == "pending" and s["payload"] == {"x": 1}
    assert s["depends_on"] == [{"job": p, "on": "success"}]


def _retry_of_a_failed_member_reopens_its_batch(conn: Conn) -> None:
    got = many(conn, [{"kind": "rt-a"}, {"kind": "rt-b"}], as_batch=True)
    b = got[0]["batch_id"]
    succeed(conn, got[0]["id"])
    fail(conn, got[1]["id"])
    assert bstatus(conn, b)["state"] == "failed"
    assert scalar(conn, "SELECT pgjobs.retry(id => %s)", (got[1]["id"],))
    s = bstatus(conn, b)
    assert (s["state"], s["pending"], s["failed"], s["completed_at"]) == ("executing", 1, 0, None)
    succeed(conn, got[1]["id"])
    assert bstatus(conn, b)["state"] == "succeeded"


# --- purge -----------------------------------------------------------------------------------------------


def age(conn: Conn, ids: list[int], days: int = 3) -> None:
    conn.execute(
        "UPDATE pgjobs.jobs SET completed_at = completed_at - make_interval(days => %s) WHERE id = ANY(%s)", (days, ids)
    )


def _purge_ages_failed_before_covers_cancelled_and_returns_jobs_removed(conn: Conn) -> None:
    s_old, s_new, f_old, c_old, live = (one_job(conn, k) for k in ("pu-s", "pu-s2", "pu-f", "pu-c", "pu-live"))
    succeed(conn, s_old)
    succeed(conn, s_new)
    fail(conn, f_old)
    cancel(conn, c_old)
    age(conn, [s_old, f_old, c_old])
    assert scalar(conn, "SELECT pgjobs.purge(succeeded_before => NULL, failed_before => NULL)") == 0
    assert scalar(conn, "SELECT pgjobs.purge(succeeded_before => interval '1 day', failed_before => NULL)") == 1
    assert q(conn, "SELECT * FROM pgjobs.job_status(id => %s)", (s_old,)) == []
    assert scalar(conn, "SELECT pgjobs.purge(succeeded_before => NULL, failed_before => interval '1 day')") == 2
    assert q(conn, "SELECT * FROM pgjobs.job_status(id => %s)", (f_old,)) == []
    assert q(conn, "SELECT * FROM pgjobs.job_status(id => %s)", (c_old,)) == []
    assert st(conn, s_new) == "succeeded" and st(conn, live) == "pending"
    assert (
        scalar(conn, "SELECT pgjobs.purge(succeeded_before => interval '1 day', failed_before => interval '1 day')")
        == 0
    )


def _purge_takes_batch_members_with_their_batch(conn: Conn) -> None:
    got = many(conn, [{"kind": "pb-a"}, {"kind": "pb-b"}, {"kind": "pb-c"}], as_batch=True)
    b = got[0]["batch_id"]
    ids = [r["id"] for r in got]
    succeed(conn, ids[0])
    fail(conn, ids[1])
    age(conn, ids[:2])
    # the batch is still executing: its finished members stay with it
    assert (
        scalar(conn, "SELECT pgjobs.purge(succeeded_before => interval '1 day', failed_before => interval '1 day')")
        == 0
    )
    assert st(conn, ids[0]) == "succeeded"
    cancel(conn, ids[2])
    age(conn, ids[2:])
    assert bstatus(conn, b)["state"] == "failed"
    assert (
        scalar(conn, "SELECT pgjobs.purge(succeeded_before => interval '1 day', failed_before => interval '1 day')")
        == 3
    )
    assert q(conn, "SELECT * FROM pgjobs.batch_status(batch_id => %s)", (b,)) == []
    assert scalar(conn, "SELECT pgjobs.batch_graph(batch_id => %s)", (b,)) is None
    assert q(conn, "SELECT * FROM pgjobs.job_status(id => %s)", (ids[0],)) == []


def _purge_refuses_negative_ages_and_changes_nothing(conn: Conn) -> None:
    j = one_job(conn, "neg")
    succeed(conn, j)
    age(conn, [j])
    raises(conn, "PJ002", "SELECT pgjobs.purge(succeeded_before => interval '-1 day', failed_before => NULL)")


# --- batch_graph -----------------------------------------------------------------------------------------


def _batch_graph_has_nodes_and_edges(conn: Conn) -> None:
    got = many(
        conn, [{"kind": "g-a", "ref": "a"}, {"kind": "g-b", "ref": "b", "depends_on": [{"ref": "a"}]}], as_batch=True
    )
    graph = scalar(conn, "SELECT pgjobs.batch_graph(batch_id => %s)", (got[0]["batch_id"],))
    assert {n["id"] for n in graph["nodes"]} == {got[0]["id"], got[1]["id"]}
    assert len(graph["edges"]) == 1


# --- hygiene ---------------------------------------------------------------------------------------------


def _every_pgjobs_function_pins_search_path(conn: Conn) -> None:
    unpinned = q(
        conn,
        """SELECT p.proname FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace
            WHERE n.nspname = 'pgjobs'
              AND NOT EXISTS (SELECT 1 FROM unnest(coalesce(p.proconfig, '{}')) AS c
                               WHERE c = 'search_path=pg_catalog, pgjobs, pg_temp')""",
    )
    assert unpinned == []


# --- batch-level continuations wait for the batch to settle ---------------------------------------------


def _a_batch_success_child_waits_for_the_settle_even_after_a_member_failed(conn: Conn, dsn: str) -> None:
    # While a batch executes, a failed member may still be retried (retry reopens the batch), so
    # whether the batch ends `succeeded` is only known when it settles: batch-level continuations
    # wait for that ("batch-level continuations wait for that anyway").
    got = many(conn, [{"kind": "sk-a"}, {"kind": "sk-b"}, {"kind": "sk-c"}], as_batch=True)
    b = got[0]["batch_id"]
    ids = refs(
        conn,
        [
            {"kind": "sk-on-success", "ref": "s", "depends_on": [{"batch": b, "on": "success"}]},
            {"kind": "sk-on-failure", "ref": "f", "depends_on": [{"batch": b, "on": "failure"}]},
            {"kind": "sk-on-complete", "ref": "c", "depends_on": [{"batch": b, "on": "complete"}]},
            {"kind": "sk-grandchild", "ref": "g", "depends_on": [{"ref": "s"}]},
        ],
    )
    fail(conn, got[0]["id"])
    assert bstatus(conn, b)["state"] == "executing"
    assert {k: st(conn, ids[k]) for k in "sfcg"} == dict.fromkeys("sfcg", "waiting")
    late = many(conn, [{"kind": "sk-late", "depends_on": [{"batch": b, "on": "success"}]}])[0]["id"]
    assert st(conn, late) == "waiting"  # the batch is not settled: nothing to resolve at enqueue yet
    succeed(conn, got[1]["id"])
    with listening(dsn) as listener:
        cancel(conn, got[2]["id"])
        events = listener.drain()
    assert bstatus(conn, b)["state"] == "failed"
    assert (st(conn, ids["s"]), st(conn, ids["g"]), st(conn, late)) == ("cancelled", "cancelled", "cancelled")
    assert (st(conn, ids["f"]), st(conn, ids["c"])) == ("pending", "pending")
    seen = events_by_id(events)
    assert seen[ids["s"]] == ["cancelled"] and seen[ids["g"]] == ["cancelled"]  # the cascade is streamed


def _a_batch_success_child_waits_for_the_settle_after_a_member_is_cancelled(conn: Conn) -> None:
    got = many(conn, [{"kind": "sc-a"}, {"kind": "sc-b"}], as_batch=True)
    b = got[0]["batch_id"]
    s = many(conn, [{"kind": "sc-s", "depends_on": [{"batch": b, "on": "success"}]}])[0]["id"]
    cancel(conn, got[0]["id"])
    assert st(conn, s) == "waiting" and bstatus(conn, b)["state"] == "executing"
    succeed(conn, got[1]["id"])
    assert bstatus(conn, b)["state"] == "cancelled" and st(conn, s) == "cancelled"


def _retrying_the_failed_member_before_the_settle_lets_the_success_child_run(conn: Conn) -> None:
    got = many(conn, [{"kind": "rv-a"}, {"kind": "rv-b"}], as_batch=True)
    b = got[0]["batch_id"]
    s = many(conn, [{"kind": "rv-s", "depends_on": [{"batch": b, "on": "success"}]}])[0]["id"]
    fail(conn, got[0]["id"])
    assert st(conn, s) == "waiting"
    assert scalar(conn, "SELECT pgjobs.retry(id => %s)", (got[0]["id"],))
    succeed(conn, got[0]["id"])
    succeed(conn, got[1]["id"])
    assert bstatus(conn, b)["state"] == "succeeded"
    assert st(conn, s) == "pending"


def _enqueue_time_cancellation_cascades_inside_the_call_and_settles_the_new_batch(conn: Conn, dsn: str) -> None:
    p = one_job(conn, "et-parent")
    fail(conn, p)
    with listening(dsn) as listener:
        got = many(
            conn,
            [
                {"kind": "et-a", "ref": "a", "depends_on": [{"job": p, "on": "success"}]},
                {"kind": "et-b", "ref": "b", "depends_on": [{"ref": "a"}]},
                {"kind": "et-h", "ref": "h", "queue": "handlers", "depends_on": [{"job": p, "on": "failure"}]},
            ],
            as_batch=True,
        )
        events = listener.drain()
    ids = {r["ref"]: r["id"] for r in got}
    assert (st(conn, ids["a"]), st(conn, ids["b"]), st(conn, ids["h"])) == ("cancelled", "cancelled", "pending")
    s = bstatus(conn, got[0]["batch_id"])
    assert (s["total"], s["pending"], s["cancelled"], s["state"]) == (3, 1, 2, "executing")
    seen = events_by_id(events)
    assert seen[ids["a"]][-1] == "cancelled" and seen[ids["b"]][-1] == "cancelled" and seen[ids["h"]][-1] == "pending"
    assert ("pgjobs_wake", "handlers") in events


def _a_member_being_cancelled_cannot_add_to_its_batch(conn: Conn) -> None:
    got = many(conn, [{"kind": "bx-run"}, {"kind": "bx-idle"}], as_batch=True)
    m, b = got[0]["id"], got[0]["batch_id"]
    token = claim(conn, m)
    assert scalar(conn, "SELECT pgjobs.cancel_batch(batch_id => %s)", (b,)) == 2
    raises(
        conn,
        "PJ004",
        "SELECT pgjobs.add_to_batch(id => %s, lease_token => %s, job => %s, before_continuations => false)",
        (m, token, Jsonb({"kind": "bx-sib"})),
    )
    assert bstatus(conn, b)["total"] == 2


# --- the tests (each runs its parts on one fresh database) -------------------------------------------


@pytest.mark.smoke
def test_enqueue_many_shape_and_depends_on(conn: Conn) -> None:
    _enqueue_many_returns_ref_id_created_batch_id(conn)
    _depends_on_in_job_status_names_jobs_and_batches_with_their_trigger(conn)
    _all_or_nothing_a_bad_spec_anywhere_creates_nothing(conn)


def test_graph_errors_are_pj002_and_pj005_and_change_nothing(conn: Conn) -> None:
    _unknown_trigger_is_pj002(conn)
    _unknown_trigger_in_continuations_and_add_to_batch_is_pj002(conn)
    _invalid_graphs_are_pj005_naming_the_offender(conn)
    _missing_parent_in_continuations_is_pj005_and_the_completion_rolls_back(conn)


def test_unknown_ids_wrong_states_and_pinned_search_path(conn: Conn) -> None:
    _reads_of_unknown_ids_return_no_row_or_null(conn)
    _mutations_of_unknown_ids_are_pj003(conn)
    _add_to_batch_from_a_job_outside_a_batch_is_pj004(conn)
    _every_pgjobs_function_pins_search_path(conn)


@pytest.mark.smoke
def test_trigger_rules_and_resolution_at_enqueue(conn: Conn) -> None:
    _trigger_rules_when_the_parent_settles_later(conn)
    _a_dependency_on_a_finished_parent_is_resolved_at_enqueue(conn)
    _a_dependency_on_a_settled_batch_is_resolved_at_enqueue(conn)
    _complete_with_continuations_adds_follow_ups_depending_on_the_parent(conn)


def test_batch_continuations_and_the_settled_state_rule(conn: Conn) -> None:
    _batch_continuations_follow_the_batch_state(conn)
    _settled_batch_state_rule(conn)


def test_and_semantics_and_cascade_cancellation(conn: Conn, dsn: str) -> None:
    _edges_are_anded_and_an_unmeetable_one_cancels_at_once(conn)
    _cascade_cancellation_through_the_graph_with_notifications(conn, dsn)


def test_status_events_and_wakes_of_propagation(conn: Conn, dsn: str) -> None:
    _completing_a_parent_notifies_the_released_child_and_wakes_its_queue(conn, dsn)
    _a_released_child_with_a_future_run_at_is_scheduled_not_woken(conn, dsn)
    _enqueue_time_cancellation_cascades_inside_the_call_and_settles_the_new_batch(conn, dsn)


@pytest.mark.smoke
def test_batch_status_and_batch_graph(conn: Conn) -> None:
    _batch_status_columns_counters_and_times(conn)
    _batch_graph_has_nodes_and_edges(conn)


def test_cancel_batch(conn: Conn, dsn: str) -> None:
    _cancel_batch_returns_how_many_members_it_cancelled(conn, dsn)
    _cancel_batch_with_a_running_member_settles_when_it_ends(conn)
    _a_member_being_cancelled_cannot_add_to_its_batch(conn)


def test_add_to_batch(conn: Conn) -> None:
    _add_to_batch_joins_the_batch_and_holds_it_open(conn)
    _add_to_batch_with_a_stale_token_changes_nothing(conn)
    _add_to_batch_named_with_defaults(conn)
    _before_continuations_makes_the_callers_continuations_wait_for_the_sibling(conn)


def test_retry_reopens_batches_and_revives_what_it_can(conn: Conn) -> None:
    _retry_of_a_failed_member_reopens_its_batch(conn)
    _retrying_the_failed_member_before_the_settle_lets_the_success_child_run(conn)


def test_purge(conn: Conn) -> None:
    _purge_ages_failed_before_covers_cancelled_and_returns_jobs_removed(conn)
    _purge_takes_batch_members_with_their_batch(conn)
    _purge_refuses_negative_ages_and_changes_nothing(conn)


def test_batch_level_continuations_wait_for_the_batch_to_settle(conn: Conn, dsn: str) -> None:
    _a_batch_success_child_waits_for_the_settle_even_after_a_member_failed(conn, dsn)
    _a_batch_success_child_waits_for_the_settle_after_a_member_is_cancelled(conn)
