"""Safe by default: Host allow-list, token authentication, same-origin and CSRF checks, read-only mode,
security headers. One ASGI middleware in front of every route (:class:`Guard`), plus :func:`check_csrf`
that every state-changing handler runs on its parsed form (through ``pages.action``).

Who may do what:

- every request must name an allowed Host (DNS rebinding: a hostile name resolving to 127.0.0.1 is refused);
- every page and API call needs the session cookie (set by ``POST /login`` with the token) or
  ``Authorization: Bearer <token>``; only ``/login`` and ``/static/`` are open;
- a state-changing request authenticated by the cookie must come from this origin (``Sec-Fetch-Site:
  same-origin`` and/or an ``Origin`` equal to this server's; a request with neither is refused) and carry the
  CSRF token; a Bearer request carries no ambient credential, so a cross-site page cannot forge one;
- ``--read-only`` refuses every state-changing request but login and logout.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgjobs.web.config import WebConfig

SESSION_COOKIE = "pgjobs_session"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"
OPEN_PATHS = ("/login", "/static/")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


def hostname_of(host_header: str) -> str:
    """``example.org:8080`` -> ``example.org``; ``[::1]:80`` -> ``::1``."""
    value = host_header.strip()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def bearer_ok(config: WebConfig, headers: Headers) -> bool:
    auth = headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), config.secret)


def session_ok(config: WebConfig, cookies: Mapping[str, str]) -> bool:
    value = cookies.get(SESSION_COOKIE, "")
    return bool(value) and hmac.compare_digest(value.encode(), config.session_value.encode())


def same_origin(headers: Headers, scheme: str) -> str | None:
    """Why this request is not from our own origin, or None when it is."""
    site = headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        return f"cross-site request refused (Sec-Fetch-Site: {site})"
    origin = headers.get("origin")
    if origin is not None:
        expected = f"{scheme}://{headers.get('host', '')}"
        if origin.lower() != expected.lower():
            return f"cross-origin request refused (Origin {origin} is not {expected})"
    if site is None and origin is None:
        return "request refused: neither Origin nor Sec-Fetch-Site says it comes from this dashboard"
    return None


def check_csrf(config: WebConfig, request: Request, form: Mapping[str, Any]) -> str | None:
    """Why the request's CSRF token is missing or wrong, or None. Bearer requests need none."""
    if bearer_ok(config, request.headers):
        return None
    sent = request.headers.get(CSRF_HEADER) or form.get(CSRF_FIELD) or ""
    if not isinstance(sent, str) or not hmac.compare_digest(sent.encode(), config.csrf_token.encode()):
        return "missing or wrong CSRF token (reload the page and try again)"
    return None


def wants_html(request: Request) -> bool:
    return not request.url.path.startswith(("/api/", "/metrics")) and "text/html" in request.headers.get("accept", "")


class Guard:
    """The middleware: see the module docstring."""

    def __init__(self, app: ASGIApp, config: WebConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in SECURITY_HEADERS if k not in present]
                if b"cache-control" not in present:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        refusal = self.refusal(Request(scope))
        if refusal is None:
            await self.app(scope, receive, send_with_headers)
            return
        status, body, extra = refusal
        headers = [(b"content-type", b"application/json"), *extra]
        await send_with_headers({"type": "http.response.start", "status": status, "headers": headers})
        await send_with_headers({"type": "http.response.body", "body": body})

    def refusal(self, request: Request) -> tuple[int, bytes, list[tuple[bytes, bytes]]] | None:
        """(status, JSON body, extra headers) when the request must be refused, else None."""
        config = self.config
        host = hostname_of(request.headers.get("host", ""))
        if not config.host_allowed(host):
            return _json(400, f"Host {host!r} is not allowed (add it with --allowed-host)")
        path = request.url.path
        open_path = path == "/login" or path.startswith("/static/")
        by_bearer = bearer_ok(config, request.headers)
        if not open_path and not by_bearer and not session_ok(config, request.cookies):
            if request.method in SAFE_METHODS and wants_html(request):
                target = path + (f"?{request.url.query}" if request.url.query else "")
                return 303, b"", [(b"location", f"/login?next={quote(target, safe='')}".encode())]
            return _json(401, "authentication required: log in at /login or send Authorization: Bearer <token>")
        if request.method in SAFE_METHODS:
            return None
        if not by_bearer:
            why = same_origin(request.headers, request.url.scheme)
            if why is not None:
                return _json(403, why)
        if config.read_only and path not in ("/login", "/logout"):
            return _json(403, "this dashboard is read-only (--read-only): actions are disabled")
        return None


def _json(status: int, message: str) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    return status, json.dumps({"error": message}).encode(), []
