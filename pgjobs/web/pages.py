"""The HTML pages, each with its own URL. Every page renders whole on the server (app.js only refreshes
it live); ``X-Partial: 1`` returns just its ``<main>`` content, which is what app.js fetches."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from pgjobs.client.dashboard import Event, JobFilter, QueueOverview, Throughput, WorkerView
from pgjobs.records import JobState, JobStatus, RateLimit
from pgjobs.web.backend import Backend
from pgjobs.web.svg import batch_graph_svg, throughput_chart
from pgjobs.web.views import (
    LIVE_STATES,
    STATES,
    NotFound,
    display_job,
    job_view,
    param_int,
    param_state,
    path_id,
    render,
    span,
)

PER_PAGE = (25, 50, 100, 200)


def backend(request: Request) -> Backend:
    b: Backend = request.app.state.backend
    return b


async def overview_data(b: Backend) -> tuple[list[QueueOverview], list[Throughput], list[WorkerView]]:
    return await asyncio.gather(
        b.cached("queues", b.dash.queues),
        b.cached(("throughput", None), lambda: b.dash.throughput(60)),
        b.cached("workers", lambda: b.dash.workers(b.config.stale_after)),
    )


async def overview(request: Request) -> Response:
    b = backend(request)
    queues, points, workers = await overview_data(b)
    unhandled = await b.cached("unhandled", b.client.unhandled_kinds)  # jobs no live worker takes
    totals: dict[str, int] = {}
    for q in queues:
        for state, n in q.counts.items():
            totals[state] = totals.get(state, 0) + n
    oldest = max([q.oldest_pending_seconds or 0.0 for q in queues] + [0.0])
    return render(
        request,
        "overview.html",
        {
            "queues": queues,
            "totals": totals,
            "chart": throughput_chart(points, ("succeeded",), "jobs succeeded per minute"),
            "failure_chart": throughput_chart(points, ("failed", "cancelled"), "jobs failed or cancelled per minute"),
            "settled_hour": sum(p.succeeded for p in points),
            "failed_hour": sum(p.failed for p in points),
            "oldest": oldest,
            "live_workers": sum(1 for w in workers if not w.stale),
            "stale_workers": sum(1 for w in workers if w.stale),
            "unhandled": unhandled,
            "live": "",
            "refresh": True,
        },
    )


def _window(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return span(seconds)


def rate_text(limit: RateLimit) -> str:
    """A queue's rate limit as its page says it: "10 starts per 1 min (+ burst 5); 3 tokens now"."""
    text = f"{limit.max_starts} starts per {_window(limit.per.total_seconds())}"
    if limit.burst:
        text += f" (+ burst {limit.burst})"
    if limit.tokens is not None:
        text += f"; {limit.tokens} token{'' if limit.tokens == 1 else 's'} now"
    return text


async def queue_page(request: Request) -> Response:
    b = backend(request)
    name = request.path_params["queue"]
    queues, points, groups, ring, limits = await asyncio.gather(
        b.cached("queues", b.dash.queues),
        b.cached(("throughput", name), lambda: b.dash.throughput(60, name)),
        b.dash.groups(name),
        b.client.fair_groups(name),
        b.cached("rate_limits", b.client.rate_limits),
    )
    found = next((q for q in queues if q.queue == name), None)
    if found is None:
        raise NotFound(f"queue {name!r} has no jobs and no settings")
    rate = next((r for r in limits if r.scope == "queue" and r.key == name), None)
    return render(
        request,
        "queue.html",
        {
            "q": found,
            "groups": groups,
            # a group's weight is known while it is in the ring (pending work at the last claim)
            "weights": {g.group_key: g.weight for g in ring if g.group_key is not None},
            "weighted": sum(1 for g in ring if g.weight != 1),
            "rate": rate,
            "rate_text": None if rate is None else rate_text(rate),
            "chart": throughput_chart(points),
            "live": urlencode({"queue": name}),
            "refresh": True,
        },
    )


async def queues_page(request: Request) -> Response:
    b = backend(request)
    queues = await b.cached("queues", b.dash.queues)
    # max_length bounds the jobs that are not finished
    live = {q.queue: sum(q.counts.get(s, 0) for s in LIVE_STATES) for q in queues}
    return render(request, "queues.html", {"queues": queues, "live_counts": live, "refresh": True})


def job_filter(request: Request) -> JobFilter:
    qp = request.query_params
    return JobFilter(
        state=param_state(qp.get("state")),
        queue=qp.get("queue") or None,
        kind=qp.get("kind") or None,
        search=qp.get("search") or None,
    )


def filter_query(flt: JobFilter, **extra: Any) -> str:
    items = {k: v for k, v in flt.params().items() if v}
    items.update({k: v for k, v in extra.items() if v is not None})
    return urlencode(items)


async def jobs_page(request: Request) -> Response:
    b = backend(request)
    flt = job_filter(request)
    per_page = param_int(request, "per_page", 50, 1, 200)
    page = param_int(request, "page", 1, 1, 10**6)
    result, queues, counts = await asyncio.gather(
        b.dash.jobs(flt, per_page, (page - 1) * per_page),
        b.cached("queues", b.dash.queues),
        b.dash.state_counts(flt),
    )
    any_state = replace(flt, state=None)
    tabs = [("all", None, sum(counts.values()))] + [(s, s, counts.get(s, 0)) for s in STATES]
    first = (page - 1) * per_page + 1 if result.jobs else 0
    last = (page - 1) * per_page + len(result.jobs)
    pages = max(1, -(-result.total // per_page))
    return render(
        request,
        "jobs.html",
        {
            "flt": flt,
            "jobs": result.jobs,
            "total": result.total,
            "first": first,
            "last": last,
            "page": page,
            "pages": pages,
            "per_page": per_page,
            "per_page_choices": PER_PAGE,
            "queue_names": [q.queue for q in queues],
            "tabs": [
                {
                    "label": label,
                    "state": st,
                    "n": n,
                    "url": "/jobs?" + filter_query(any_state, state=st, per_page=per_page),
                }
                for label, st, n in tabs
            ],
            "prev_url": f"/jobs?{filter_query(flt, page=page - 1, per_page=per_page)}" if page > 1 else None,
            "next_url": f"/jobs?{filter_query(flt, page=page + 1, per_page=per_page)}" if page < pages else None,
            "here": f"/jobs?{filter_query(flt, page=page, per_page=per_page)}",
            "live": urlencode({"queue": flt.queue}) if flt.queue else "",
            "refresh": True,
        },
    )


def timeline(job: JobStatus, events: list[Event] | None) -> list[dict[str, Any]]:
    """Every step of the job, oldest first, each failed attempt with its error: from the event log when
    there is one, else from the row (created, first start, each failed attempt from ``errors``, now)."""
    errors = [e for e in (job.errors or []) if isinstance(e, dict)]
    # (the log keeps events for its retention only: an older job's steps come from its row)
    steps = _steps_from_events(events) if events else _steps_from_row(job)
    for e in errors:
        attempt = int(e.get("attempt") or 0)
        # the step that ended the attempt: the first one of that attempt that is not "active"
        target = next((s for s in steps if s["attempt"] == attempt and s["state"] != "active"), None)
        if target is None or target.get("error") is not None:
            target = {"at": _ts(e.get("at")), "state": "attempt failed", "attempt": attempt}
            steps.append(target)
        target["error"] = str(e.get("error", ""))
        target["worker"] = e.get("worker")
    far = datetime.max.replace(tzinfo=UTC)
    steps.sort(key=lambda s: s["at"] or far)
    return steps


def _steps_from_events(events: list[Event]) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    for ev in events:
        last = steps[-1] if steps else None
        if last is not None and last["state"] == ev.state.value == "active" and last["attempt"] == ev.attempt:
            continue  # a progress report of the running attempt, not a new step
        steps.append({"at": ev.at, "state": ev.state.value, "attempt": ev.attempt, "error": None})
    return steps


def _steps_from_row(job: JobStatus) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [{"at": job.created_at, "state": "enqueued", "attempt": 0, "error": None}]
    if job.first_started_at is not None:
        steps.append({"at": job.first_started_at, "state": "active", "attempt": 1, "error": None})
    if job.state.terminal:
        steps.append({"at": job.completed_at, "state": job.state.value, "attempt": job.attempt, "error": None})
    return steps


def _ts(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


async def job_page(request: Request) -> Response:
    b = backend(request)
    job_id = path_id(request)
    job, recorded = await asyncio.gather(b.client.job_status(job_id), b.client.durable_status(job_id))
    if job is None:
        raise NotFound(f"job {job_id} not found")
    why = None if job.state.terminal else await b.client.explain(job_id)  # "why not running" (docs/explain.md)
    not_taken = None  # why no live worker will take this job, when none will
    if job.state in (JobState.PENDING, JobState.SCHEDULED):
        rows = [u for u in await b.client.unhandled_kinds([job.queue]) if u.kind == job.kind]
        not_taken = rows[0].reason if rows else None
    events = None
    if request.app.state.hub.mode == "log" or await b.dash.has_event_log():
        events = await b.dash.read_events(after_id=0, max_rows=1000, job_ids=[job_id])
    steps = timeline(job, events)
    # the running attempt's start, when the event log has it (first_started_at is the first attempt's)
    started = next((s["at"] for s in reversed(steps) if s["state"] == "active" and s["attempt"] == job.attempt), None)
    return render(
        request,
        "job.html",
        {
            "job": display_job(job),  # large values cut for the page
            "view": job_view(job),
            "steps": steps,
            "started": started if job.attempt > 1 else None,
            "durable": durable_view(recorded),
            "live": urlencode({"job": job_id}),
            "refresh": True,
            "job_id": job_id,
            "why": why,
            "not_taken": not_taken,
        },
    )


def durable_view(recorded: dict[str, Any] | None) -> dict[str, Any] | None:
    """The job page's durable-execution block (templates/durable.html): None for a job that recorded no step,
    sleep or wait; its times as datetimes."""
    if not recorded or not (recorded["steps"] or recorded["waits"]):
        return None
    waiting = recorded.get("waiting_for")
    return {
        "steps": [{**s, "done_at": _ts(s["done_at"])} for s in recorded["steps"]],
        "sleeping_until": _ts(recorded.get("sleeping_until")),
        "waiting_for": None if not waiting else {
            "key": waiting["key"], "since": _ts(waiting["since"]), "timeout_at": _ts(waiting.get("timeout_at")),
        },
    }  # fmt: skip


async def batch_page(request: Request) -> Response:
    b = backend(request)
    batch_id = path_id(request)
    status, graph = await asyncio.gather(b.client.batch_status(batch_id), b.client.batch_graph(batch_id))
    if status is None or graph is None:
        raise NotFound(f"batch {batch_id} not found")
    kind = request.query_params.get("kind") or None  # a grouped node's link: the members of its kind
    svg = batch_graph_svg(graph)
    shown = [n for n in graph.get("nodes", []) if kind is None or n.get("kind") == kind]
    return render(
        request,
        "batch.html",
        {
            "batch": status,
            "graph": svg,
            "grouped": 'class="node group"' in svg,
            "kind": kind,
            "members": [n for n in shown if n.get("member")],
            "outside": [n for n in shown if not n.get("member")],
            "live": urlencode({"batch": batch_id}),
            "refresh": True,
        },
    )


async def schedules_page(request: Request) -> Response:
    b = backend(request)
    return render(request, "schedules.html", {"schedules": await b.client.list_schedules(), "refresh": True})


async def workers_page(request: Request) -> Response:
    b = backend(request)
    workers = await b.dash.workers(b.config.stale_after)
    return render(request, "workers.html", {"workers": workers, "stale_after": b.config.stale_after, "refresh": True})
