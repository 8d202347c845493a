"""Inline SVG drawn on the server: the throughput chart and a batch's dependency graph.

No script draws anything: the page is complete as sent (and under the CSP's ``style-src 'self'`` only
presentation attributes and classes are used, never ``style=``).
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any
from urllib.parse import quote

from markupsafe import Markup

from pgjobs.client.dashboard import Throughput
from pgjobs.web.dag import Node, layout

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


def batch_graph_svg(graph: dict[str, Any]) -> Markup:
    """The batch's jobs as boxes coloured by state, in columns by dependency depth, edges as arrows
    (solid once satisfied); jobs outside the batch are drawn dashed, the batch itself is a node when
    something depends on it as a whole. Each job links to its page. A column too tall to read shows its
    same-kind siblings as one node with a count and a bar of their states (:mod:`pgjobs.web.dag`), which
    links to the member list of that kind."""
    lay = layout(graph)
    drawn = lay.nodes
    if len(drawn) > MAX_GRAPH_NODES:
        return Markup(
            f'<p class="muted">The graph has {lay.jobs} jobs in {len(drawn)} boxes; only graphs of up to'
            f" {MAX_GRAPH_NODES} boxes are drawn. The member list below has them all.</p>"
        )
    box_w, box_h, gap_x, gap_y, pad = 168, 40, 56, 14, 10
    pos: dict[str, tuple[float, float]] = {}
    for col, members in enumerate(lay.columns):
        for row, n in enumerate(members):
            pos[n.key] = (pad + col * (box_w + gap_x), pad + 4 + row * (box_h + gap_y))
    width = pad * 2 + max(len(lay.columns), 1) * (box_w + gap_x) - gap_x
    height = pad * 2 + 4 + max([len(m) for m in lay.columns] + [1]) * (box_h + gap_y) - gap_y
    grouped = sum(len(n.ids) for n in drawn if n.group)
    label = f"dependency graph: {lay.jobs} jobs" + (f", {grouped} of them in groups" if grouped else "")
    out = [
        f'<svg class="dag" id="dag" viewBox="0 0 {width} {height}" width="{width}" height="{height}"'
        f' xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{escape(label)}">',
        # (in user units: an edge drawn thicker for the many dependencies it stands for keeps a small head)
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7"'
        ' markerUnits="userSpaceOnUse" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#6b7280"/>'
        "</marker></defs>",
    ]
    for e in lay.edges:
        (x1, y1), (x2, y2) = pos[e.src], pos[e.dst]
        sx, sy, tx, ty = x1 + box_w, y1 + box_h / 2, x2, y2 + box_h / 2
        mid = (sx + tx) / 2
        dash = "" if e.satisfied else ' stroke-dasharray="5 4"'
        on = "/".join(e.on)
        title = f"on {on}" + (f" ({e.count} dependencies)" if e.count > 1 else "")
        thick = f' stroke-width="{min(1 + e.count / 50, 4):.1f}"' if e.count > 1 else ""
        out.append(
            f'<path class="edge edge-{escape(on)}" d="M{sx:.0f},{sy:.0f} C{mid:.0f},{sy:.0f}'
            f' {mid:.0f},{ty:.0f} {tx:.0f},{ty:.0f}" fill="none" stroke="#6b7280"{dash}{thick}'
            f' marker-end="url(#arrow)"><title>{escape(title)}</title></path>'
        )
    for n in drawn:
        if n.group:
            out.append(_group_svg(n, pos[n.key], box_w, box_h))
        else:
            out.append(_node_svg(n.key, n.data, pos[n.key], box_w, box_h))
    out.append("</svg>")
    return Markup("".join(out))


def _group_svg(n: Node, at: tuple[float, float], w: int, h: int) -> str:
    """A group: a stack of boxes, "kind x count", its commonest states, and a bar of every state."""
    x, y = at
    kind = n.data.get("kind")
    label = f"{kind or 'other jobs'} \u00d7{len(n.ids)}"
    if len(label) > 22:
        label = label[:21] + "\u2026"
    order = [s for s in STATE_COLOURS if n.states.get(s)] + sorted(s for s in n.states if s not in STATE_COLOURS)
    summary = " \u00b7 ".join(f"{n.states[s]} {s}" for s in order)
    # a count per state, each after a square of its colour (the legend's): the words would not fit
    shown = "".join(f'<tspan fill="{STATE_COLOURS.get(s, "#6b7280")}">\u25a0</tspan> {n.states[s]} ' for s in order[:4])
    href = f"/batches/{n.data.get('batch_id')}?kind={quote(str(kind))}#members" if kind else "#members"
    outside = "" if n.data.get("member", True) else ' stroke-dasharray="4 3"'
    bar = []
    bx, bw = x + 1.0, w - 2.0
    for s in order:
        seg = bw * n.states[s] / len(n.ids)
        bar.append(
            f'<rect class="seg seg-{escape(s)}" x="{bx:.1f}" y="{y + h - 6:.0f}" width="{seg:.1f}" height="5"'
            f' fill="{STATE_COLOURS.get(s, "#6b7280")}"/>'
        )
        bx += seg
    first, last = min(n.ids), max(n.ids)
    return (
        f'<a href="{escape(href)}" class="node group" data-count="{len(n.ids)}" data-kind="{escape(str(kind or ""))}"'
        f' data-state="{escape(n.state)}">'
        f'<rect x="{x + 5:.0f}" y="{y - 5:.0f}" width="{w}" height="{h}" rx="6" fill="#e5e7eb" stroke="#9ca3af"/>'
        f'<rect x="{x + 2.5:.1f}" y="{y - 2.5:.1f}" width="{w}" height="{h}" rx="6" fill="#eef0f3" stroke="#9ca3af"/>'
        f'<rect x="{x:.0f}" y="{y:.0f}" width="{w}" height="{h}" rx="6" fill="#ffffff" stroke="#1f2937"'
        f' stroke-width="1"{outside}/>'
        + "".join(bar)
        + f'<text x="{x + 8:.0f}" y="{y + 15:.0f}" fill="#111827" class="node-label">{escape(label)}</text>'
        f'<text x="{x + 8:.0f}" y="{y + 28:.0f}" fill="#374151" class="node-state">{shown}</text>'
        f"<title>{escape(label)} (jobs {first}\u2013{last}): {escape(summary)}</title></a>"
    )


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
