"""The dashboard's settings (``pgjobs web`` options) and the secrets derived from its token."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
from dataclasses import dataclass, field

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def new_token() -> str:
    return secrets.token_urlsafe(24)


@dataclass
class WebConfig:
    """What ``create_app`` needs. ``token`` None means: generate one (printed at start by the CLI)."""

    dsn: str
    host: str = "127.0.0.1"
    port: int = 8080
    token: str | None = None
    allowed_hosts: list[str] = field(default_factory=list)
    read_only: bool = False
    reader_dsn: str | None = None
    admin_dsn: str | None = None
    role: str | None = None  # role taken at connect by the reader pool (``-c role=...``): e.g. pgjobs_reader
    admin_role: str | None = None  # the same for the admin pool: e.g. pgjobs_admin
    pool_size: int = 4
    connect_timeout: float = 3.0  # seconds: a page waits at most this for a connection
    statement_timeout_ms: int = 5000
    stale_after: float = 30.0  # a worker not heard from for this long is shown as stale
    poll_interval: float = 0.5  # the shared event reader's poll period
    application_name: str = "pgjobs-web"
    secure_cookie: bool = False  # set Secure on the session cookie (behind TLS)
    token_generated: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.token is None:
            self.token = new_token()
            self.token_generated = True
        else:
            self.token_generated = False
        if not self.token:
            raise ValueError("the dashboard token must not be empty")
        for role in (self.role, self.admin_role):
            # it goes into the connection's options (-c role=...): a plain identifier only
            if role is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*", role):
                raise ValueError(f"invalid role name {role!r}")

    @property
    def secret(self) -> bytes:
        assert self.token is not None
        return self.token.encode()

    def derive(self, purpose: str) -> str:
        """A value only the token's holder can compute: the session cookie, the CSRF token."""
        return hmac.new(self.secret, purpose.encode(), hashlib.sha256).hexdigest()

    @property
    def session_value(self) -> str:
        return self.derive("pgjobs-web session")

    @property
    def csrf_token(self) -> str:
        return self.derive("pgjobs-web csrf")

    def host_allowed(self, hostname: str) -> bool:
        allowed = {h.lower() for h in (*self.allowed_hosts, self.host, *LOOPBACK_NAMES)}
        if self.host in ("0.0.0.0", "::"):  # bound to every address: only the names given are allowed
            allowed.discard(self.host)
        return hostname.lower().strip("[]") in {h.strip("[]") for h in allowed}


def check_bind(config: WebConfig) -> str | None:
    """Why this configuration must not start, or None."""
    if not is_loopback(config.host) and config.token_generated:
        return (
            f"refusing to listen on {config.host} (not a loopback address) without an explicit token: "
            "pass --token or set PGJOBS_WEB_TOKEN"
        )
    return None
