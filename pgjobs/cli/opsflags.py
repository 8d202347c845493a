"""The worker command's operations flags, in one block: logs, metrics, PgBouncer.

``add_worker_ops_flags(parser)`` adds them; ``worker_ops_kwargs(args)`` configures logging and returns the
matching ``Worker(...)`` keyword arguments.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from pgjobs.runtime.logs import FORMATS, LEVELS, configure_logging


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a port number is an integer, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port number is 0-65535 (0: any free port), got {value}")
    return value


def _level(text: str) -> str:
    name = text.upper()
    if name not in LEVELS:
        raise argparse.ArgumentTypeError(f"log level is one of {', '.join(LEVELS)}, got {text!r}")
    return name


def add_worker_ops_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("logs, metrics, PgBouncer")
    g.add_argument(
        "--log-level",
        type=_level,
        default=os.environ.get("PGJOBS_LOG_LEVEL", "INFO"),
        metavar="LEVEL",
        help="DEBUG (adds job starts and each retry of an outage), INFO (one line per finished job, "
        "connection lost/restored, the stop sequence), WARNING, ERROR (default: $PGJOBS_LOG_LEVEL or INFO)",
    )
    g.add_argument(
        "--log-format",
        choices=FORMATS,
        default=os.environ.get("PGJOBS_LOG_FORMAT", "text"),
        help="text lines, or one JSON object per line (default: $PGJOBS_LOG_FORMAT or text)",
    )
    g.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve Prometheus metrics on this port (/metrics); off by default",
    )
    g.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address the metrics endpoint binds (default 127.0.0.1; 0.0.0.0 to be scraped from other hosts)",
    )
    g.add_argument(
        "--listen-dsn",
        metavar="DSN",
        default=os.environ.get("PGJOBS_LISTEN_DSN"),
        help="a direct (not pooled) connection for LISTEN when --dsn goes through PgBouncer in transaction "
        "mode (default: $PGJOBS_LISTEN_DSN, else --dsn)",
    )
    g.add_argument(
        "--no-prepare",
        action="store_true",
        help="no server-side prepared statements and no session options from the start (PgBouncer before 1.21 in"
        " transaction mode is also found by the error it gives)",
    )


def worker_ops_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Configures logging from the flags; returns the ``Worker`` keyword arguments they set."""
    configure_logging(args.log_level, args.log_format)
    return {
        "metrics_port": args.metrics_port,
        "metrics_host": args.metrics_host,
        "listen_dsn": args.listen_dsn,
        "prepare": not args.no_prepare,
    }
