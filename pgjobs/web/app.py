"""The dashboard as an ASGI app (Starlette): ``create_app(WebConfig(dsn, ...))``; ``pgjobs web`` serves it
with uvicorn. Routes, the lifespan (pools, the shared live reader) and how errors become responses:

- a bad parameter -> 400 naming it; an unknown job/batch/queue/schedule -> 404; a refusal from SQL
  (``PJ002`` 400, ``PJ003`` 404, ``PJ004`` 409) with its message;
- the database unreachable or too slow -> 503 within a few seconds, the page showing a banner.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pgjobs.errors import PgJobsError
from pgjobs.web import actions, api, pages
from pgjobs.web.backend import Backend, is_refusal, unavailable_reason
from pgjobs.web.config import WebConfig
from pgjobs.web.live import Hub
from pgjobs.web.security import Guard
from pgjobs.web.views import HERE, BadParam, NotFound, error_response, make_templates

log = logging.getLogger("pgjobs.web")

_STATUS_BY_SQLSTATE = {"PJ001": 409, "PJ002": 400, "PJ003": 404, "PJ004": 409, "PJ005": 400}


async def _on_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, BadParam):
        return error_response(request, 400, str(exc))
    if isinstance(exc, NotFound):
        return error_response(request, 404, str(exc))
    if isinstance(exc, PermissionError):
        return error_response(request, 403, str(exc))
    if isinstance(exc, HTTPException):
        return error_response(request, exc.status_code, str(exc.detail))
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        first = str(exc).strip().splitlines()[0]
        return error_response(
            request,
            403,
            f"the database refused: {first} (connect as a role that may: --role, --reader-dsn, --admin-dsn)",
        )
    if is_refusal(exc):
        assert isinstance(exc, PgJobsError)
        return error_response(request, _STATUS_BY_SQLSTATE.get(exc.sqlstate or "", 400), str(exc))
    reason = unavailable_reason(exc)
    if reason is not None:
        return error_response(request, 503, f"the database is unreachable: {reason}", db_error=reason)
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(request, 500, f"internal error: {type(exc).__name__}")


def routes() -> list[Route | Mount]:
    out: list[Route | Mount] = [
        Route("/", pages.overview),
        Route("/queues", pages.queues_page),
        Route("/queues/{queue}", pages.queue_page),
        Route("/jobs", pages.jobs_page),
        Route("/jobs/{id}", pages.job_page),
        Route("/jobs/{id}/delete", actions.confirm_delete_job, methods=["GET"]),
        Route("/batches/{id}", pages.batch_page),
        Route("/schedules", pages.schedules_page),
        Route("/workers", pages.workers_page),
        Route("/login", actions.login_page, methods=["GET"]),
        Route("/login", actions.login, methods=["POST"]),
        Route("/api/overview", api.api_overview),
        Route("/api/jobs", api.api_jobs),
        Route("/api/jobs/{id}", api.api_job),
        Route("/api/batches/{id}", api.api_batch),
        Route("/api/workers", api.api_workers),
        Route("/api/events", api.api_events),
        Route("/metrics", api.metrics),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    out += [Route(path, fn, methods=["POST"]) for path, fn in actions.routes_args()]
    return out


def create_app(config: WebConfig) -> Starlette:
    backend = Backend.create(config)
    hub = Hub(
        backend.dash, config.poll_interval,
        listen_dsn=config.reader_dsn or config.dsn, application_name=f"{config.application_name}-listen",
    )  # fmt: skip

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await backend.open()
        try:
            yield
        finally:
            await hub.stop()
            await backend.close()

    # (classes, not Exception: those are handled inside the middleware stack, so the Guard's security
    # headers are on error pages too; anything else is a 500 from Starlette's outermost handler)
    handlers = {
        psycopg.Error: _on_error,
        PermissionError: _on_error,
        HTTPException: _on_error,
        BadParam: _on_error,
        NotFound: _on_error,
        PgJobsError: _on_error,
    }
    app = Starlette(
        routes=routes(),
        middleware=[Middleware(Guard, config=config)],
        exception_handlers=handlers,
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.backend = backend
    app.state.hub = hub
    app.state.templates = make_templates()
    return app
