"""State-changing requests: plain HTML forms (they work without JavaScript) that answer with a redirect
back and a notice, or JSON when asked for it (``Accept: application/json``). Each goes through
:func:`action`: the CSRF check, the admin pool, and errors turned into 4xx with their message. The
middleware (:mod:`pgjobs.web.security`) has already checked the session, the origin and read-only mode.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from pgjobs.client import AsyncClient
from pgjobs.client.dashboard import AsyncDashboard, JobFilter
from pgjobs.records import JobState
from pgjobs.web.config import WebConfig
from pgjobs.web.security import SESSION_COOKIE, check_csrf, same_origin
from pgjobs.web.views import BadParam, NotFound, param_state, path_id, render

Handler = Callable[[Request, FormData, AsyncClient, AsyncDashboard], Awaitable[str]]
MAX_BULK = 1000


def _next_url(request: Request, form: FormData, default: str) -> str:
    """Where to go back: a path on this server only (never ``//evil`` or ``https://evil``)."""
    target = str(form.get("next") or default)
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return default
    return target


def _with_notice(url: str, notice: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "notice"] + [("notice", notice)]
    return f"{parts.path}?{urlencode(query)}"


def action(default_next: Callable[[Request], str]) -> Callable[[Handler], Callable[[Request], Awaitable[Response]]]:
    def wrap(fn: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            config: WebConfig = request.app.state.config
            form = await request.form()
            why = check_csrf(config, request, form)
            if why is not None:
                return JSONResponse({"error": why}, 403)
            client, dash = request.app.state.backend.actions()
            message = await fn(request, form, client, dash)
            request.app.state.backend.invalidate()
            if "application/json" in request.headers.get("accept", ""):
                return JSONResponse({"ok": True, "message": message})
            return RedirectResponse(_with_notice(_next_url(request, form, default_next(request)), message), 303)

        endpoint.__name__ = fn.__name__
        return endpoint

    return wrap


def _job_url(request: Request) -> str:
    return f"/jobs/{request.path_params['id']}"


@action(_job_url)
async def cancel_job(request: Request, form: FormData, client: AsyncClient, dash: AsyncDashboard) -> str:
    job_id = path_id(request)
    done = await client.cancel(job_id)
    if not done:
        return f"job {job_id} had already ended: nothing to cancel"
    # cancel() is true for a running job too, which only gets cancel_requested: its worker ends it (or
    # does not, if it finishes first). The state read after the call says which of the two happened.
    job = await client.job_status(job_id)
    if job is None or job.state.value == "cancelled":
        return f"job {job_id}: cancelled"
    if job.state.value == "active":
        return f"job {job_id}: cancellation requested (still running: its worker stops it)"
    if job.state.terminal:
        return f"job {job_id}: cancellation requested, but it ended {job.state.value} first"
    return f"job {job_id}: cancellation requested (it is {job.state.value} now)"


@action(_job_url)
async def retry_job(request: Request, form: FormData, client: AsyncClient, dash: AsyncDashboard) -> str:
    job_id = path_id(request)
    await client.retry(job_id)
    return f"job {job_id}: queued again"


async def confirm_delete_job(request: Request) -> Response:
    """The confirm step before a delete (a page, so that it holds without JavaScript too): what will be
    gone, and the button that posts the deletion."""
    if request.app.state.config.read_only:
        raise PermissionError("this dashboard is read-only (--read-only): actions are disabled")
    job_id = path_id(request)
    job = await request.app.state.backend.client.job_status(job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return render(request, "confirm_delete.html", {"job": job})


@action(lambda r: "/jobs")
async def delete_job(request: Request, form: FormData, client: AsyncClient, dash: AsyncDashboard) -> str:
    job_id = path_id(request)
    await client.delete(job_id)  # a job that is not finished: PJ004, shown as a 409 with its reason
    return f"job {job_id} deleted"


def _ids(form: FormData) -> list[int]:
    out: list[int] = []
    for raw in form.getlist("ids"):
        try:
            out.append(int(str(raw)))
        except ValueError:
            raise BadParam(f"ids must be job ids (integers), got {raw!r}") from None
    return out


@action(lambda r: "/jobs")
async def bulk(request: Request, form: FormData, client: AsyncClient, dash: AsyncDashboard) -> str:
    what = str(form.get("action") or "")
    if what not in ("cancel", "retry"):
        raise BadParam(f"action must be cancel or retry, got {what!r}")
    scope = str(form.get("scope") or "selected")
    if scope == "selected":
        ids = _ids(form)
        if not ids:
            raise BadParam("no job selected: tick some jobs, or choose every job matching the filter")
        if len(ids) > MAX_BULK:
            raise BadParam(f"at most {MAX_BULK} jobs at once, got {len(ids)}")
        outcome = await dash.bulk(what, ids, JobFilter(), MAX_BULK)
    elif scope == "filter":
        flt = JobFilter(
            state=param_state(str(form.get("state") or "") or None),
            queue=str(form.get("queue") or "") or None,
            kind=str(form.get("kind") or "") or None,
            search=str(form.get("search") or "") or None,
        )
        outcome = await dash.bulk(what, None, flt, MAX_BULK)
    else:
        raise BadParam(f"scope must be selected or filter, got {scope!r}")
    done = [o.id for o in outcome if o.done]
    refused = [o for o in outcome if o.error]
    if what == "cancel" and done:
        # as for one job: a running job only got its cancellation requested (cancel_job)
        states = await dash.job_states(done)
        running = sum(1 for i in done if states.get(i) == JobState.ACTIVE)
        cancelled = sum(1 for i in done if states.get(i, JobState.CANCELLED) == JobState.CANCELLED)
        text = f"{cancelled} of {len(outcome)} jobs cancelled"
        if running:
            text += f", {running} running: cancellation requested (their workers stop them)"
        if len(done) - cancelled - running:
            text += f", {len(done) - cancelled - running} ended before the cancellation took effect"
    else:
        text = f"{len(done)} of {len(outcome)} jobs {'cancelled' if what == 'cancel' else 'queued again'}"
    if refused:
        text += f"; {len(refused)} refused (first: {refused[0].error})"
    return text


def _queue_url(request: Request) -> str:
    return f"/queues/{quote(request.path_params['queue'], safe='')}"


@action(_queue_url)
async def pause_queue(request: Request, form: FormData, client: AsyncClient, dash: AsyncDashboard) -> str:
    await client.configure_queue(request.path_params["queue"], paused=True)
    return f"queue {request.path_params['queue']} paused"


@action(_queue_url)
async def resume_queue(request: Request, form: FormData, client: AsyncClient, dash: AsyncDashboard) -> str:
    await client.configure_queue(request.path_params["queue"], paused=False)
    return f"queue {request.path_params['queue']} resumed"


def _limit(form: FormData, name: str) -> int | None:
    raw = str(form.get(name) or "").strip()
    if raw == "":
        return None  # left as it is
    try:
        value = int(raw)
    except ValueError:
        raise BadParam(f"{name} must be an integer (0 removes the limit), got {raw!r}") from None
    if value < 0:
        raise BadParam(f"{name} must be >= 0 (0 removes the limit), got {value}")
    return value


@action(_queue_url)
async def configure_queue(request: Request, form: FormData, client: AsyncClient, dash: AsyncDashboard) -> str:
    name = request.path_params["queue"]
    fair = {"on": True, "off": False}.get(str(form.get("fair") or ""))
    await client.configure_queue(
        name,
        fair=fair,
        max_length=_limit(form, "max_length"),
        max_active=_limit(form, "max_active"),
        max_active_per_group=_limit(form, "max_active_per_group"),
    )
    return f"queue {name}: settings saved"


@action(_queue_url)
async def weight_group(request: Request, form: FormData, client: AsyncClient, dash: AsyncDashboard) -> str:
    name = request.path_params["queue"]
    group = str(form.get("group_key") or "").strip()
    raw = str(form.get("weight") or "").strip()
    if not group:
        raise BadParam("group_key must be a group of the queue, got nothing")
    try:
        weight = float(raw)
    except ValueError:
        raise BadParam(f"weight must be a number in (0, 1000] (1 resets it), got {raw!r}") from None
    got = await client.configure_group(name, group, weight)  # configure_group checks the range: PJ002 -> 400
    return f"queue {name}: group {group} has weight {got:g}" + (" (the default)" if got == 1 else "")


@action(lambda r: f"/batches/{r.path_params['id']}")
async def cancel_batch(request: Request, form: FormData, client: AsyncClient, dash: AsyncDashboard) -> str:
    n = await client.cancel_batch(path_id(request))
    return f"{n} jobs of the batch cancelled"


@action(lambda r: "/schedules")
async def pause_schedule(request: Request, form: FormData, client: AsyncClient, dash: AsyncDashboard) -> str:
    name = request.path_params["name"]
    done = await client.pause_schedule(name)
    return f"schedule {name} paused" if done else f"schedule {name} was paused already"


@action(lambda r: "/schedules")
async def resume_schedule(request: Request, form: FormData, client: AsyncClient, dash: AsyncDashboard) -> str:
    name = request.path_params["name"]
    done = await client.resume_schedule(name)
    return f"schedule {name} resumed" if done else f"schedule {name} was not paused"


@action(lambda r: "/schedules")
async def trigger_schedule(request: Request, form: FormData, client: AsyncClient, dash: AsyncDashboard) -> str:
    name = request.path_params["name"]
    job_id = await dash.trigger_schedule(name)
    return f"schedule {name}: job {job_id} enqueued now"


# -- login / logout (the middleware lets /login through without a session) -----------------------------


async def login_page(request: Request) -> Response:
    return render(request, "login.html", {"next": request.query_params.get("next") or "/", "error": None})


async def login(request: Request) -> Response:
    config: WebConfig = request.app.state.config
    why = same_origin(request.headers, request.url.scheme)  # no login CSRF from another site either
    if why is not None:
        return JSONResponse({"error": why}, 403)
    form = await request.form()
    token = str(form.get("token") or "")
    target = _next_url(request, form, "/")
    if not hmac.compare_digest(token.encode(), config.secret):
        return render(request, "login.html", {"next": target, "error": "wrong token"}, 401)
    response = RedirectResponse(target, 303)
    response.set_cookie(
        SESSION_COOKIE,
        config.session_value,
        httponly=True,
        samesite="strict",
        secure=config.secure_cookie,
        path="/",
    )
    return response


async def logout(request: Request) -> Response:
    form = await request.form()
    why = check_csrf(request.app.state.config, request, form)
    if why is not None:
        return JSONResponse({"error": why}, 403)
    response = RedirectResponse("/login", 303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


def routes_args() -> list[tuple[str, Callable[[Request], Awaitable[Response]]]]:
    return [
        ("/jobs/bulk", bulk),
        ("/jobs/{id}/cancel", cancel_job),
        ("/jobs/{id}/retry", retry_job),
        ("/jobs/{id}/delete", delete_job),
        ("/queues/{queue}/pause", pause_queue),
        ("/queues/{queue}/resume", resume_queue),
        ("/queues/{queue}/configure", configure_queue),
        ("/queues/{queue}/weight", weight_group),
        ("/batches/{id}/cancel", cancel_batch),
        ("/schedules/{name}/pause", pause_schedule),
        ("/schedules/{name}/resume", resume_schedule),
        ("/schedules/{name}/trigger", trigger_schedule),
        ("/logout", logout),
    ]
