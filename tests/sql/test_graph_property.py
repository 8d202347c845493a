"""Property test: random DAGs (some on pre-existing, already settled jobs; some in a batch with batch-level
continuations), settled in random orders and groups, with random cancellations of waiting jobs. After
every step nothing waits on a dependency that is settled and unsatisfied, nothing runs early, and every
batch's counters equal a recount; at the end every job is in the state its triggers imply."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.graph import Conn, batch, cancel, counters, enqueue_rows, fail, one, recount, rows, take

TRIGGERS = ("success", "failure", "complete")
OUTCOMES = ("ok", "fail", "cancel")
_example = itertools.count()


@dataclass
class Node:
    name: str
    plan: str  # what the test does when the job becomes runnable
    parents: list[tuple[str, str]] = field(default_factory=list)  # (parent name, trigger)
    in_batch: bool = False
    on_batch: str | None = None  # a batch continuation: its trigger
    id: int = 0


def satisfied(trigger: str, outcome: str) -> bool:
    return trigger == "complete" or (trigger, outcome) in {("success", "succeeded"), ("failure", "failed")}


def expected_states(nodes: dict[str, Node], user_cancelled: set[str]) -> dict[str, str]:
    """The model: a job runs (and ends as planned) iff every edge is satisfied; otherwise it is cancelled."""
    done: dict[str, str] = {}
    planned = {"ok": "succeeded", "fail": "failed", "cancel": "cancelled"}

    def outcome(name: str) -> str:
        if name in done:
            return done[name]
        node = nodes[name]
        if name in user_cancelled:
            result = "cancelled"
        elif node.on_batch is not None:
            members = [outcome(m) for m, n in nodes.items() if n.in_batch]
            batch_state = "failed" if "failed" in members else "cancelled" if "cancelled" in members else "succeeded"
            result = planned[node.plan] if satisfied(node.on_batch, batch_state) else "cancelled"
        elif all(satisfied(t, outcome(p)) for p, t in node.parents):
            result = planned[node.plan]
        else:
            result = "cancelled"
        done[name] = result
        return result

    return {name: outcome(name) for name in nodes}


@st.composite
def graphs(draw: st.DrawFn) -> tuple[dict[str, Node], list[str], bool]:
    n_pre = draw(st.integers(0, 2))
    n = draw(st.integers(1, 9))
    nodes: dict[str, Node] = {}
    for i in range(n_pre):
        nodes[f"pre{i}"] = Node(f"pre{i}", draw(st.sampled_from(OUTCOMES)))
    as_batch = draw(st.booleans())
    names = [f"n{i}" for i in range(n)]
    for i, name in enumerate(names):
        candidates = names[:i] + [f"pre{k}" for k in range(n_pre)]
        parents = draw(st.lists(st.sampled_from(candidates), unique=True, max_size=3)) if candidates else []
        nodes[name] = Node(
            name,
            draw(st.sampled_from(OUTCOMES)),
            [(p, draw(st.sampled_from(TRIGGERS))) for p in parents],
            in_batch=as_batch,
        )
    if as_batch:
        for k, trigger in enumerate(draw(st.lists(st.sampled_from(TRIGGERS), max_size=3))):
            nodes[f"b{k}"] = Node(f"b{k}", "ok", on_batch=trigger)
    # submit the graph in a random order: refs may point forward
    order = draw(st.permutations(names))
    return nodes, order, as_batch


def check_invariants(conn: Conn, nodes: dict[str, Node], batch_id: int | None) -> None:
    by_id = {
        r["id"]: r
        for r in rows(
            conn,
            "SELECT id, state, remaining_deps FROM pgjobs.jobs WHERE id = ANY(%s)",
            ([n.id for n in nodes.values()],),
        )
    }
    terminal = ("succeeded", "failed", "cancelled")
    for node in nodes.values():
        job = by_id[node.id]
        if node.on_batch is not None or not node.parents:
            continue
        parent_states = [(by_id[nodes[p].id]["state"], t) for p, t in node.parents]
        settled = [(s, t) for s, t in parent_states if s in terminal]
        if job["state"] == "waiting":
            # an unsatisfiable edge cancels at once; all edges satisfied releases at once
            assert all(satisfied(t, s) for s, t in settled), (node.name, parent_states)
            assert len(settled) < len(parent_states), (node.name, parent_states)
            assert job["remaining_deps"] == len(parent_states) - len(settled), (node.name, job)
        elif job["state"] in ("pending", "active", "succeeded", "failed"):
            # never runs early
            assert all(s in terminal and satisfied(t, s) for s, t in parent_states), (node.name, parent_states)
    if batch_id is not None:
        status = batch(conn, batch_id)
        assert counters(status) == recount(conn, batch_id)
        assert (status["state"] == "executing") == (status["pending"] > 0)


@pytest.mark.smoke
@pytest.mark.timeout(600)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(graph=graphs(), data=st.data())
def test_random_dags_settle_as_their_triggers_imply(conn: Conn, graph: Any, data: st.DataObject) -> None:
    nodes, order, as_batch = graph
    prefix = f"x{next(_example)}_"  # one database for all examples: kinds are unique per example
    planned: dict[str, Any] = {"ok": None, "fail": fail, "cancel": cancel}

    def settle(names: list[str]) -> None:
        oks = [nodes[x].id for x in names if nodes[x].plan == "ok"]
        tokens = [take(conn, i) for i in oks]
        if oks:
            assert one(
                conn,
                "SELECT pgjobs.complete_many(ids => %s::bigint[], lease_tokens => %s::uuid[])",
                (oks, tokens),
            ) == len(oks)
        for x in names:
            action = planned[nodes[x].plan]
            if action is not None:
                action(conn, nodes[x].id)

    # pre-existing parents, settled before the graph is inserted (resolution at insert)
    pre = [x for x in nodes if x.startswith("pre")]
    if pre:
        created = enqueue_rows(conn, [{"kind": prefix + x, "ref": x} for x in pre])
        for r in created:
            nodes[r["ref"]].id = r["id"]
        settle(pre)

    specs = []
    for name in order:
        deps = [
            {"job": nodes[p].id, "on": t} if p.startswith("pre") else {"ref": p, "on": t}
            for p, t in nodes[name].parents
        ]
        specs.append({"kind": prefix + name, "ref": name, "depends_on": deps})
    created = enqueue_rows(conn, specs, as_batch=as_batch)
    for r in created:
        nodes[r["ref"]].id = r["id"]
    batch_id = created[0]["batch_id"] if as_batch else None
    conts = [x for x in nodes if nodes[x].on_batch is not None]
    if conts:
        out = enqueue_rows(
            conn,
            [
                {"kind": prefix + x, "ref": x, "depends_on": [{"batch": batch_id, "on": nodes[x].on_batch}]}
                for x in conts
            ],
        )
        for r in out:
            nodes[r["ref"]].id = r["id"]

    user_cancelled: set[str] = set()
    graph_nodes = {x: n for x, n in nodes.items() if not x.startswith("pre")}
    check_invariants(conn, nodes, batch_id)
    for _step in range(100):
        by_state = {
            r["id"]: r["state"]
            for r in rows(
                conn, "SELECT id, state FROM pgjobs.jobs WHERE id = ANY(%s)", ([n.id for n in nodes.values()],)
            )
        }
        runnable = sorted(x for x in graph_nodes if by_state[nodes[x].id] == "pending")
        waiting = sorted(x for x in graph_nodes if by_state[nodes[x].id] == "waiting")
        if not runnable:
            assert not waiting, waiting
            break
        if waiting and data.draw(st.integers(0, 9), label="cancel a waiting job?") == 0:
            victim = data.draw(st.sampled_from(waiting), label="victim")
            assert cancel(conn, nodes[victim].id)
            user_cancelled.add(victim)
        else:
            group = data.draw(st.lists(st.sampled_from(runnable), min_size=1, unique=True), label="settle together")
            settle(group)
        check_invariants(conn, nodes, batch_id)

    got = {
        x: r["state"]
        for x, n in nodes.items()
        for r in rows(conn, "SELECT state FROM pgjobs.jobs WHERE id = %s", (n.id,))
    }
    assert got == expected_states(nodes, user_cancelled)
    if batch_id is not None:
        status = batch(conn, batch_id)
        members = [got[x] for x, n in nodes.items() if n.in_batch]
        rule = "failed" if "failed" in members else "cancelled" if "cancelled" in members else "succeeded"
        assert status["state"] == rule and status["completed_at"] is not None
        assert counters(status) == recount(conn, batch_id)
