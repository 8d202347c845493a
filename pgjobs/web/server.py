"""``pgjobs web``: the dashboard (a Starlette app, :mod:`pgjobs.web.app`) served by uvicorn.

Needs the ``web`` extra (``pip install 'pgjobs-queue[web]'``): without it the command says so and exits 2.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any

from pgjobs.web.config import WebConfig, check_bind

EXTRA_HINT = "the dashboard needs the web extra: pip install 'pgjobs-queue[web]'"
ENV_TOKEN = "PGJOBS_WEB_TOKEN"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "web",
        help="serve the dashboard (token-protected; binds 127.0.0.1 by default)",
        description="The pgjobs dashboard. Every page needs the token (--token, PGJOBS_WEB_TOKEN, or a "
        "generated one printed at start). Needs: pip install 'pgjobs-queue[web]'.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (8080; 0 picks a free one)")
    p.add_argument("--token", default=None, help=f"the login token (default: ${ENV_TOKEN}, else a generated one)")
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name the dashboard answers to besides the bound host, localhost and 127.0.0.1 (repeatable)",
    )
    p.add_argument("--read-only", action="store_true", help="hide and refuse every action")
    p.add_argument(
        "--read-dsn",
        "--reader-dsn",
        dest="reader_dsn",
        default=None,
        help="DSN for reading: pages and the live stream (a hot standby, or a user in pgjobs_reader); actions"
        " still go to the primary (--dsn or --admin-dsn)",
    )
    p.add_argument("--admin-dsn", default=None, help="DSN for actions (e.g. a user in pgjobs_admin)")
    p.add_argument("--role", default=None, help="role the reading connections take (-c role=...): pgjobs_reader")
    p.add_argument("--admin-role", default=None, help="role the action connections take: pgjobs_admin")
    p.add_argument("--stale-after", type=float, default=30.0, metavar="S", help="a worker silent S seconds is stale")
    p.add_argument("--secure-cookie", action="store_true", help="mark the session cookie Secure (behind HTTPS)")
    p.set_defaults(func=_run)


def config_from_args(args: argparse.Namespace) -> WebConfig:
    return WebConfig(
        dsn=args.dsn,
        host=args.host,
        port=args.port,
        token=args.token or os.environ.get(ENV_TOKEN) or None,
        allowed_hosts=list(args.allowed_host),
        read_only=args.read_only,
        reader_dsn=args.reader_dsn,
        admin_dsn=args.admin_dsn,
        role=args.role,
        admin_role=args.admin_role,
        stale_after=args.stale_after,
        secure_cookie=args.secure_cookie,
    )


def _run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from pgjobs.web.app import create_app
    except ImportError as exc:
        print(f"pgjobs: {EXTRA_HINT} (missing: {exc.name})", file=sys.stderr)
        return 2
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"pgjobs: {exc}", file=sys.stderr)
        return 2
    refused = check_bind(config)
    if refused is not None:
        print(f"pgjobs: {refused}", file=sys.stderr)
        return 2
    app = create_app(config)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level="warning",
            timeout_graceful_shutdown=2,  # SSE streams never end by themselves
            proxy_headers=False,
        )
    )
    # bound here, so the address printed is the real one (--port 0 picks a free port)
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as exc:
        sock.close()
        print(f"pgjobs: cannot listen on {config.host}:{config.port}: {exc.strerror}", file=sys.stderr)
        return 2
    port = sock.getsockname()[1]
    shown = config.host if ":" not in config.host else f"[{config.host}]"
    print(f"pgjobs dashboard on http://{shown}:{port}/  (Ctrl-C to stop)", flush=True)
    if config.token_generated:
        print(f"login token (generated; set --token or {ENV_TOKEN} to choose one): {config.token}", flush=True)
    server.run(sockets=[sock])
    return 0
