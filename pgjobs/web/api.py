"""JSON API, the Server-Sent Events stream and ``/metrics``.

``/api/events`` subscribes to the process's one shared reader (:mod:`pgjobs.web.live`): a browser holds
no database connection of its own, so 200 open pages cost the database nothing more than one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from pgjobs.jsonable import to_jsonable
from pgjobs.web.backend import unavailable_reason
from pgjobs.web.live import Hub
from pgjobs.web.pages import backend, job_filter, overview_data
from pgjobs.web.views import BadParam, NotFound, job_view, param_int, path_id, progress_parts

KEEPALIVE = 15.0


def _json(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(to_jsonable(data), status)


async def api_overview(request: Request) -> Response:
    queues, points, workers = await overview_data(backend(request))
    return _json({"queues": queues, "throughput": points, "workers": workers})


async def api_jobs(request: Request) -> Response:
    b = backend(request)
    flt = job_filter(request)
    limit = param_int(request, "limit", 50, 0, 1000)
    offset = param_int(request, "offset", 0, 0, 10**9)
    page = await b.dash.jobs(flt, limit, offset)
    return _json({"total": page.total, "offset": offset, "jobs": page.jobs})


async def api_job(request: Request) -> Response:
    b = backend(request)
    job_id = path_id(request)
    job = await b.client.job_status(job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    view = job_view(job)
    parts = progress_parts(job.progress)
    view["progress_bar"] = None if parts is None else {"value": parts[0], "max": parts[1], "text": parts[2]}
    return _json(view)


async def api_batch(request: Request) -> Response:
    b = backend(request)
    batch_id = path_id(request)
    status, graph = await asyncio.gather(b.client.batch_status(batch_id), b.client.batch_graph(batch_id))
    if status is None:
        raise NotFound(f"batch {batch_id} not found")
    return _json({"batch": status, "graph": graph})


async def api_workers(request: Request) -> Response:
    b = backend(request)
    return _json(await b.dash.workers(b.config.stale_after))


def _int_list(raw: list[str], name: str) -> list[int]:
    out = []
    for item in raw:
        for part in item.split(","):
            if not part:
                continue
            try:
                out.append(int(part))
            except ValueError:
                raise BadParam(f"{name} must be integers, got {part!r}") from None
    return out


async def api_events(request: Request) -> Response:
    """SSE: ``data:`` lines with one event each (``type`` = ``event``, ``db`` or ``resync``); a comment
    every 15 s keeps proxies from closing an idle stream. Filters: ``job`` (repeatable or comma-separated),
    ``batch``, ``queue``."""
    hub: Hub = request.app.state.hub
    jobs = _int_list(request.query_params.getlist("job"), "job")
    batches = _int_list(request.query_params.getlist("batch"), "batch")
    if len(batches) > 1:
        raise BadParam("batch: one batch id at most")
    sub = hub.subscribe(jobs or None, batches[0] if batches else None, request.query_params.get("queue") or None)

    async def stream() -> AsyncIterator[bytes]:
        try:
            yield b": connected\n\nretry: 2000\n\n"
            while True:
                if sub.lagged:
                    sub.lagged = False
                    yield b'data: {"type": "resync"}\n\n'
                try:
                    message = await asyncio.wait_for(sub.inbox.get(), KEEPALIVE)
                except TimeoutError:
                    yield b": keep-alive\n\n"
                    continue
                if message is None:
                    return
                yield b"data: " + json.dumps(message).encode() + b"\n\n"
        finally:
            hub.unsubscribe(sub)

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"cache-control": "no-store", "x-accel-buffering": "no"}
    )


class _Families(Collector):
    def __init__(self, families: list[GaugeMetricFamily]) -> None:
        self.families = families

    def collect(self) -> Any:
        return iter(self.families)


async def metrics(request: Request) -> Response:
    """Prometheus text format, read from SQL at scrape time (see README "Dashboard" for each metric)."""
    b = backend(request)
    try:
        queues, workers = await asyncio.gather(
            b.cached("queues", b.dash.queues), b.cached("workers", lambda: b.dash.workers(b.config.stale_after))
        )
    except Exception as exc:
        reason = unavailable_reason(exc)
        if reason is None:
            raise
        return Response(f"# database unreachable: {reason}\n", 503, media_type="text/plain")
    jobs = GaugeMetricFamily("pgjobs_jobs", "Jobs by queue and state.", labels=["queue", "state"])
    oldest = GaugeMetricFamily(
        "pgjobs_oldest_pending_seconds",
        "Seconds since the oldest claimable (pending) job of the queue became due; 0 with none pending.",
        labels=["queue"],
    )
    for q in queues:
        for state in ("waiting", "scheduled", "pending", "active", "succeeded", "failed", "cancelled"):
            jobs.add_metric([q.queue, state], float(q.counts.get(state, 0)))
        oldest.add_metric([q.queue], float(q.oldest_pending_seconds or 0.0))
    by_status = GaugeMetricFamily(
        "pgjobs_workers", "Registered workers: live (heartbeat recent) or stale.", labels=["status"]
    )
    by_status.add_metric(["live"], float(sum(1 for w in workers if not w.stale)))
    by_status.add_metric(["stale"], float(sum(1 for w in workers if w.stale)))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([jobs, oldest, by_status]))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
