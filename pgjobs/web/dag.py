"""A batch's dependency graph laid out for drawing (:func:`pgjobs.web.svg.batch_graph_svg` draws it).

Nodes go in columns by dependency depth (layers). A column taller than :data:`COLUMN_LIMIT` boxes is made
readable by grouping: first the jobs of one kind with the same parents and the same children (the
fan-out of a batch: 1,000 ``resize`` jobs between one ``fetch`` and one ``merge``) become one node with a
count and their states; if the column is still too tall, its jobs of one kind become one node whatever
their edges; then the biggest of those stay and the rest of the column becomes one node. Small graphs
are drawn job by job, as they are.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

COLUMN_LIMIT = 12  # boxes in one column before its jobs are grouped


@dataclass
class Node:
    """One box: a job (``j<id>``), the batch itself (``b<id>``: something depends on it as a whole), or a
    group of jobs (``g<n>``) with their ids and a count per state."""

    key: str
    data: dict[str, Any]
    depth: int
    ids: list[int] = field(default_factory=list)
    states: Counter[str] = field(default_factory=Counter)

    @property
    def group(self) -> bool:
        return self.key.startswith("g")

    @property
    def state(self) -> str:
        """The job's state; a group's when all its jobs share it, else ``mixed``."""
        if not self.group:
            return str(self.data.get("state"))
        return next(iter(self.states)) if len(self.states) == 1 else "mixed"


@dataclass
class Edge:
    src: str
    dst: str
    on: list[str]
    count: int
    satisfied: bool  # every dependency it stands for is met


@dataclass
class Layout:
    columns: list[list[Node]]
    edges: list[Edge]
    jobs: int  # jobs in the graph, before grouping

    @property
    def nodes(self) -> list[Node]:
        return [n for col in self.columns for n in col]


def _layers(node_ids: list[str], edges: list[tuple[str, str]]) -> dict[str, int]:
    """Depth of every node: the longest path from a node with no parent (Kahn's order, so cycles, which
    pgjobs refuses anyway, cannot loop forever)."""
    parents: dict[str, list[str]] = defaultdict(list)
    children: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        parents[b].append(a)
        children[a].append(b)
    indegree = {n: len(parents[n]) for n in node_ids}
    depth = dict.fromkeys(node_ids, 0)
    ready = [n for n in node_ids if indegree[n] == 0]
    while ready:
        n = ready.pop()
        for c in children[n]:
            if c not in indegree:
                continue
            depth[c] = max(depth[c], depth[n] + 1)
            indegree[c] -= 1
            if indegree[c] == 0:
                ready.append(c)
    return depth


def _group_column(
    keys: list[str],
    data: dict[str, dict[str, Any]],
    signature: dict[str, tuple[Any, ...]],
    fresh: list[int],
) -> list[tuple[str, list[str]]]:
    """The column's entries, each ``(key, members)``: single jobs keep their key, groups get ``g<n>``."""

    def bucket(by: Any, entries: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
        buckets: dict[Any, list[str]] = {}
        out: list[tuple[str, list[str]]] = []
        for key, members in entries:
            if key.startswith("b"):
                out.append((key, members))
                continue
            buckets.setdefault(by(members[0]), []).extend(members)
        for members in buckets.values():
            if len(members) == 1:
                out.append((members[0], members))
            else:
                fresh[0] += 1
                out.append((f"g{fresh[0]}", members))
        return out

    entries = [(k, [k]) for k in keys]
    for by in (
        lambda k: signature[k],  # same kind, same parents, same children
        lambda k: (data[k].get("kind"), data[k].get("member", True)),  # same kind
    ):
        if len(entries) <= COLUMN_LIMIT:
            return entries
        entries = bucket(by, entries)
    if len(entries) <= COLUMN_LIMIT:
        return entries
    # still too many kinds: the biggest groups stay, the rest of the column becomes one node
    fixed = [e for e in entries if e[0].startswith("b")]  # the batch node stays itself
    jobs = sorted((e for e in entries if not e[0].startswith("b")), key=lambda e: -len(e[1]))
    keep = COLUMN_LIMIT - len(fixed) - 1
    rest = [m for _, members in jobs[keep:] for m in members]
    fresh[0] += 1
    return [*fixed, *jobs[:keep], (f"g{fresh[0]}", rest)]


def layout(graph: dict[str, Any]) -> Layout:
    nodes: list[dict[str, Any]] = list(graph.get("nodes") or [])
    batch = graph.get("batch") or {}
    data: dict[str, dict[str, Any]] = {f"j{n['id']}": n for n in nodes}
    raw: list[tuple[str, str, dict[str, Any]]] = []
    for e in graph.get("edges") or []:
        src = f"j{e['from']}" if e.get("from") is not None else f"b{e.get('from_batch')}"
        if src.startswith("b") and src not in data:
            data[src] = {"batch": e.get("from_batch"), "state": batch.get("state", "executing")}
        raw.append((src, f"j{e['to']}", e))
    keys = list(data)
    depth = _layers(keys, [(a, b) for a, b, _ in raw])
    parents: dict[str, set[tuple[str, str]]] = defaultdict(set)
    children: dict[str, set[str]] = defaultdict(set)
    for a, b, e in raw:
        parents[b].add((a, str(e.get("on"))))
        children[a].add(b)
    signature = {
        k: (data[k].get("kind"), data[k].get("member", True), tuple(sorted(parents[k])), tuple(sorted(children[k])))
        for k in keys
    }
    by_depth: dict[int, list[str]] = defaultdict(list)
    for k in keys:
        by_depth[depth[k]].append(k)
    fresh = [0]
    columns: list[list[Node]] = []
    owner: dict[str, str] = {}
    for d in sorted(by_depth):
        column: list[Node] = []
        for key, members in _group_column(by_depth[d], data, signature, fresh):
            for m in members:
                owner[m] = key
            if key.startswith("g"):
                kinds = {data[m].get("kind") for m in members}
                first = data[members[0]]
                column.append(
                    Node(
                        key,
                        {
                            "kind": first.get("kind") if len(kinds) == 1 else None,
                            "member": first.get("member", True),
                            "batch_id": batch.get("id"),
                        },
                        d,
                        [int(data[m]["id"]) for m in members],
                        Counter(str(data[m].get("state")) for m in members),
                    )
                )
            else:
                column.append(Node(key, data[key], d))
        columns.append(column)
    merged: dict[tuple[str, str], Edge] = {}
    for a, b, e in raw:
        src, dst = owner[a], owner[b]
        edge = merged.setdefault((src, dst), Edge(src, dst, [], 0, True))
        edge.count += 1
        edge.satisfied = edge.satisfied and bool(e.get("satisfied"))
        if str(e.get("on")) not in edge.on:
            edge.on.append(str(e.get("on")))
    return Layout(columns, list(merged.values()), len(nodes))
