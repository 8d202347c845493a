"""Rendering helpers shared by the pages: templates and their filters, request parameters checked into
4xx errors, and the shapes pages show (relative times, progress, a job without its lease token)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeGuard

from markupsafe import Markup, escape
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.templating import Jinja2Templates

from pgjobs.jsonable import WEB_DISPLAY_CHARS, cut_text, shown_json, to_jsonable
from pgjobs.records import JobState, JobStatus
from pgjobs.web.security import wants_html

HERE = Path(__file__).parent
STATES = [s.value for s in JobState]
LIVE_STATES = ("waiting", "scheduled", "pending", "active")


class BadParam(Exception):
    """A bad request parameter: 400 with this message."""


class NotFound(Exception):
    """No such job / batch / queue / schedule: 404 with this message."""


def ago(seconds: float) -> str:
    s = abs(seconds)
    if s < 45:
        text = f"{int(s)} s"
    elif s < 90 * 60:
        text = f"{round(s / 60)} min"
    elif s < 36 * 3600:
        text = f"{round(s / 3600)} h"
    else:
        text = f"{round(s / 86400)} d"
    return f"{text} ago" if seconds >= 0 else f"in {text}"


def reltime(value: datetime | None) -> Markup:
    """``<time>`` with a relative text ("3 min ago", "in 20 s"); app.js keeps the text current."""
    if value is None:
        return Markup('<span class="muted">\u2014</span>')
    seconds = (datetime.now(UTC) - value).total_seconds()
    iso = value.isoformat()
    return Markup(f'<time datetime="{escape(iso)}" title="{escape(iso)}" data-rel>{escape(ago(seconds))}</time>')


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "\u2014"
    return ago(seconds).removesuffix(" ago")


def span(seconds: float) -> str:
    """A length of time, as precise as it is useful: "340 ms", "2.3 s", "45 s", "3 min 5 s", "2 h 10 min"."""
    s = max(seconds, 0.0)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 10:
        return f"{s:.1f} s"
    if s < 60:
        return f"{s:.0f} s"
    m = int(s // 60)
    if m < 60:
        return f"{m} min {int(s % 60)} s" if m < 10 else f"{m} min"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def run_time(job: Any, started: datetime | None = None) -> Markup:
    """How long a job ran or has been running, or has waited since it became due: "ran 2.3 s",
    "running for 3 min 5 s" (a ``<time data-since>`` that app.js keeps current), "waiting 12 s". A job that
    ran more than once is measured from its first start (``started``: the current attempt's start when
    known, for a running job). Empty for a job that never started and is not due."""
    state = str(getattr(job.state, "value", job.state))
    first = job.first_started_at
    now = datetime.now(UTC)
    if state == "active" and (started or first) is not None:
        since = started or first
        assert since is not None
        iso = escape(since.isoformat())
        title = "since this attempt started" if started else "since its first start"
        return Markup(
            f'<span class="run-time" title="{title}">running for <time datetime="{iso}" data-since>'
            f"{escape(span((now - since).total_seconds()))}</time></span>"
        )
    if state in ("succeeded", "failed", "cancelled") and first is not None and job.completed_at is not None:
        text = span((job.completed_at - first).total_seconds())
        if job.attempt > 1:
            return Markup(
                f'<span class="run-time" title="from its first start to its end, retries and their waits'
                f' included">took {escape(text)} over {job.attempt} attempts</span>'
            )
        return Markup(f'<span class="run-time" title="from its start to its end">ran {escape(text)}</span>')
    if state == "pending" and job.run_at is not None and job.run_at <= now:
        text = span((now - job.run_at).total_seconds())
        return Markup(f'<span class="run-time muted" title="due since then, not yet claimed">waiting {text}</span>')
    return Markup("")


def pretty(value: Any) -> str:
    """JSON for a page, cut at WEB_DISPLAY_CHARS with a marker (the API has the value whole)."""
    return shown_json(value, WEB_DISPLAY_CHARS, indent=2, sort_keys=True)


def display_job(job: JobStatus) -> JobStatus:
    """The job as its page shows it: a progress report too large to show becomes its cut text (payload,
    result and checkpoint are cut by :func:`pretty`)."""
    if job.progress is None or isinstance(job.progress, int | float | bool):
        return job
    text = json.dumps(to_jsonable(job.progress), ensure_ascii=False, default=str)
    if len(text) <= WEB_DISPLAY_CHARS:
        return job
    return dataclasses.replace(job, progress=cut_text(text, WEB_DISPLAY_CHARS))


def number(value: float) -> str:
    """12.0 -> "12", 2.5 -> "2.5", 1000000.0 -> "1000000" (never "1e+06")."""
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _count_of(progress: dict[str, Any]) -> tuple[str, float, float] | None:
    """(name, done, total) of ``{"done"|"current"|<any name>: n, "total"|"of": m}`` with m > 0: the
    counter is ``done`` or ``current`` when present, else the one other numeric field."""
    total = progress.get("total", progress.get("of"))
    if not _number(total) or total <= 0:
        return None
    for name in ("done", "current"):
        if _number(progress.get(name)):
            return name, float(progress[name]), float(total)
    others = [k for k, v in progress.items() if k not in ("total", "of", "percent") and _number(v)]
    if len(others) == 1:
        return others[0], float(progress[others[0]]), float(total)
    return None


def progress_parts(progress: Any) -> tuple[float, float, str] | None:
    """(value, max, text) of a reported progress: a count of a total (``{"done", "total"}``,
    ``{"current", "total"}``, ``{"done", "of"}``, ``{"frame", "of"}``: any one numeric field with ``total``
    or ``of``; an optional ``message``), ``{"percent"}``, or a bare number (a fraction when <= 1, else a
    percentage). None when it says nothing measurable."""
    if _number(progress):
        frac = float(progress) if progress <= 1 else float(progress) / 100
        return max(0.0, min(frac, 1.0)), 1.0, f"{frac:.0%}"
    if not isinstance(progress, dict):
        return None
    message = str(progress.get("message") or "")
    count = _count_of(progress)
    if count is not None:
        name, done, total = count
        label = "" if name in ("done", "current") else f"{name} "
        return done, total, f"{label}{number(done)}/{number(total)} {message}".strip()
    percent = progress.get("percent")
    if _number(percent):
        return float(percent), 100.0, f"{percent:g}% {message}".strip()
    return None


def job_view(job: Any) -> dict[str, Any]:
    """A job as pages and the API show it: everything but its lease token (which would let anyone who
    reads the page complete or fail the running attempt)."""
    data: dict[str, Any] = to_jsonable(job)
    data.pop("lease_token", None)
    return data


def param_int(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadParam(f"{name} must be an integer, got {raw!r}") from None
    if not lo <= value <= hi:
        raise BadParam(f"{name} must be between {lo} and {hi}, got {value}")
    return value


def param_state(raw: str | None) -> JobState | None:
    if raw is None or raw == "":
        return None
    try:
        return JobState(raw)
    except ValueError:
        raise BadParam(f"state {raw!r} is not one of {', '.join(STATES)}") from None


def path_id(request: Request, name: str = "id") -> int:
    raw = request.path_params[name]
    try:
        value = int(raw)
    except ValueError:
        raise BadParam(f"{name} must be an integer, got {raw!r}") from None
    if not 0 < value < 2**63:
        raise BadParam(f"{name} out of range: {raw}")
    return value


def make_templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    env = templates.env
    env.filters["reltime"] = reltime
    env.filters["pretty"] = pretty
    env.filters["duration"] = duration
    env.filters["run_time"] = run_time
    env.filters["num"] = number
    env.globals["STATES"] = STATES
    env.globals["progress_parts"] = progress_parts
    env.globals["LIVE_STATES"] = LIVE_STATES
    return templates


def render(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
    state = request.app.state
    config = state.config
    ctx = {
        "csrf": config.csrf_token,
        "read_only": config.read_only,
        "partial": request.headers.get("x-partial") == "1",
        "db_error": None,
        "notice": request.query_params.get("notice"),
        "live": "",
        **context,
    }
    response: Response = state.templates.TemplateResponse(request, name, ctx, status_code=status)
    return response


def error_response(request: Request, status: int, message: str, db_error: str | None = None) -> Response:
    if wants_html(request) or request.headers.get("x-partial") == "1":
        try:
            return render(request, "error.html", {"status": status, "message": message, "db_error": db_error}, status)
        except Exception:  # templates broken: still say something useful
            return HTMLResponse(f"<h1>{status}</h1><p>{escape(message)}</p>", status)
    body: dict[str, Any] = {"error": message}
    if db_error is not None:
        body["database"] = "unreachable"
    return JSONResponse(body, status)
