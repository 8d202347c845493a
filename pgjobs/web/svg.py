"""Inline SVG drawn on the server: the throughput chart and a batch's dependency graph.

No script draws anything: the page is complete as sent (and under the CSP's ``style-src 'self'`` only
presentation attributes and classes are used, never ``style=``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from html import escape
from typing import Any

from markupsafe import Markup

from pgjobs.client.dashboard import Throughput

STATE_COLOURS = {
    "waiting": "#8b7fd6",
    "scheduled": "#a99be3",
    "pending": "#d99a1e",
    "active": "#2f6fdb",
    "succeeded": "#2f9e55",
    "failed": "#d0423c",
    "cancelled": "#9a9a9a",
}
MAX_GRAPH_NODES = 400


def throughput_chart(
    points: Sequence[Throughput],
    series: Sequence[str] = ("succeeded", "failed", "cancelled"),
    label: str = "jobs settled per minute",
) -> Markup:
    """Bars per minute over ``points``, the ``series`` (succeeded, failed, cancelled) stacked."""
    width, height, pad_l, pad_b, pad_t = 720, 130, 34, 18, 8
    n = max(len(points), 1)
    peak = max([sum(int(getattr(p, name)) for name in series) for p in points] + [1])
    bar = (width - pad_l) / n
    plot_h = height - pad_b - pad_t
    out = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}"'
        ' xmlns="http://www.w3.org/2000/svg" preserveAspectRatio="none">',
        f'<line x1="{pad_l}" y1="{height - pad_b}" x2="{width}" y2="{height - pad_b}" stroke="#c8ccd4"/>',
        f'<text x="{pad_l - 4}" y="{pad_t + 9}" text-anchor="end" class="axis">{peak}</text>',
        f'<text x="{pad_l - 4}" y="{height - pad_b}" text-anchor="end" class="axis">0</text>',
        f'<text x="{pad_l}" y="{height - 4}" class="axis">-{len(points)} min</text>',
        f'<text x="{width}" y="{height - 4}" text-anchor="end" class="axis">now</text>',
    ]
    for i, p in enumerate(points):
        x = pad_l + i * bar
        y = float(height - pad_b)
        for name in series:
            value = int(getattr(p, name))
            if value <= 0:
                continue
            h = plot_h * value / peak
            y -= h
            out.append(
                f'<rect class="bar bar-{name}" x="{x + 0.5:.1f}" y="{y:.1f}" width="{max(bar - 1, 1):.1f}"'
                f' height="{h:.1f}" fill="{STATE_COLOURS[name]}"><title>{p.minute:%H:%M} {value} {name}</title></rect>'
            )
    out.append("</svg>")
    return Markup("".join(out))


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


def batch_graph_svg(graph: dict[str, Any]) -> Markup:
    """The batch's jobs as boxes coloured by state, in columns by dependency depth, edges as arrows
    (solid once satisfied); jobs outside the batch are drawn dashed, the batch itself is a node when
    something depends on it as a whole. Each job links to its page."""
    nodes: list[dict[str, Any]] = list(graph.get("nodes") or [])
    raw_edges: list[dict[str, Any]] = list(graph.get("edges") or [])
    batch = graph.get("batch") or {}
    if len(nodes) > MAX_GRAPH_NODES:
        return Markup(
            f'<p class="muted">The graph has {len(nodes)} jobs; only graphs of up to {MAX_GRAPH_NODES} are drawn.'
            " The member list below has them all.</p>"
        )
    by_key: dict[str, dict[str, Any]] = {f"j{n['id']}": n for n in nodes}
    edges: list[tuple[str, str, dict[str, Any]]] = []
    for e in raw_edges:
        src = f"j{e['from']}" if e.get("from") is not None else f"b{e.get('from_batch')}"
        if src.startswith("b") and src not in by_key:
            by_key[src] = {"batch": e.get("from_batch"), "state": batch.get("state", "executing")}
        edges.append((src, f"j{e['to']}", e))
    keys = list(by_key)
    depth = _layers(keys, [(a, b) for a, b, _ in edges])
    columns: dict[int, list[str]] = defaultdict(list)
    for k in keys:
        columns[depth[k]].append(k)
    box_w, box_h, gap_x, gap_y, pad = 168, 40, 56, 14, 10
    pos: dict[str, tuple[float, float]] = {}
    for col, members in columns.items():
        for row, k in enumerate(members):
            pos[k] = (pad + col * (box_w + gap_x), pad + row * (box_h + gap_y))
    width = pad * 2 + (max(columns) + 1 if columns else 1) * (box_w + gap_x) - gap_x
    height = pad * 2 + max([len(m) for m in columns.values()] + [1]) * (box_h + gap_y) - gap_y
    out = [
        f'<svg class="dag" id="dag" viewBox="0 0 {width} {height}" width="{width}" height="{height}"'
        ' xmlns="http://www.w3.org/2000/svg" role="img" aria-label="dependency graph">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7"'
        ' orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#6b7280"/></marker></defs>',
    ]
    for a, b, e in edges:
        (x1, y1), (x2, y2) = pos[a], pos[b]
        sx, sy, tx, ty = x1 + box_w, y1 + box_h / 2, x2, y2 + box_h / 2
        mid = (sx + tx) / 2
        dash = "" if e.get("satisfied") else ' stroke-dasharray="5 4"'
        out.append(
            f'<path class="edge edge-{escape(str(e.get("on")))}" d="M{sx:.0f},{sy:.0f} C{mid:.0f},{sy:.0f}'
            f' {mid:.0f},{ty:.0f} {tx:.0f},{ty:.0f}" fill="none" stroke="#6b7280"{dash}'
            f' marker-end="url(#arrow)"><title>on {escape(str(e.get("on")))}</title></path>'
        )
    for k in keys:
        out.append(_node_svg(k, by_key[k], pos[k], box_w, box_h))
    out.append("</svg>")
    return Markup("".join(out))


def _node_svg(key: str, n: dict[str, Any], at: tuple[float, float], w: int, h: int) -> str:
    x, y = at
    state = str(n.get("state"))
    colour = STATE_COLOURS.get(state, "#6b7280")
    if key.startswith("b"):
        label, href = f"batch {n.get('batch')}", f"/batches/{n.get('batch')}"
    else:
        label, href = f"#{n['id']} {n.get('kind', '')}", f"/jobs/{n['id']}"
    if len(label) > 22:
        label = label[:21] + "\u2026"
    outside = ' stroke-dasharray="4 3"' if key.startswith("j") and not n.get("member", True) else ""
    text_colour = "#ffffff" if state in ("active", "succeeded", "failed", "waiting") else "#111827"
    return (
        f'<a href="{escape(href)}" class="node" data-id="{escape(key[1:])}" data-state="{escape(state)}">'
        f'<rect x="{x:.0f}" y="{y:.0f}" width="{w}" height="{h}" rx="6" fill="{colour}" stroke="#1f2937"'
        f' stroke-width="1"{outside}/>'
        f'<text x="{x + 8:.0f}" y="{y + 16:.0f}" fill="{text_colour}" class="node-label">{escape(label)}</text>'
        f'<text x="{x + 8:.0f}" y="{y + 32:.0f}" fill="{text_colour}" class="node-state">{escape(state)}</text>'
        f"<title>{escape(label)}: {escape(state)}</title></a>"
    )
