"""``pgjobs worker --app MODULE:ATTR [--queues Q=N,...]``: run a worker for the jobs of an App.

Without ``--queues`` the worker serves every queue the app declares (``@app.job(queue=...)`` and
``@app.periodic(queue=...)``), each with ``--concurrency`` slots, and says so when it starts: a handler
declared on a queue nobody serves would otherwise never run, silently.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from pgjobs.cli.common import (
    EXIT_OK,
    NEEDS_SCHEMA,
    load_app,
    non_negative_float,
    parse_queues,
    positive_float,
    positive_int,
    stdout,
)
from pgjobs.cli.opsflags import add_worker_ops_flags, worker_ops_kwargs
from pgjobs.ops import dsn as dsnmod


def register(sub: Any) -> argparse.ArgumentParser:
    """Adds ``worker``; returns its parser so that other modules can add their own flags to it."""
    p: argparse.ArgumentParser = sub.add_parser("worker", help="run a worker for the jobs of an App")
    p.add_argument("--app", required=True, metavar="MODULE:ATTR", help="the pgjobs.App, e.g. myproject.jobs:app")
    p.add_argument(
        "--queues",
        type=parse_queues,
        metavar="Q=N,...",
        help="queues and their concurrency, e.g. default=10,emails=5 "
        "(default: every queue the app declares, CONCURRENCY each)",
    )
    p.add_argument("--concurrency", type=positive_int, default=10, help="jobs at once per queue given without =N (10)")
    p.add_argument("--lease", type=positive_float, default=30.0, metavar="S", help="lease in seconds (30)")
    p.add_argument(
        "--grace-period",
        type=non_negative_float,
        default=30.0,
        metavar="S",
        help="on SIGINT/SIGTERM, how long running jobs may finish before they are released (30)",
    )
    p.add_argument(
        "--poll-interval",
        type=positive_float,
        default=5.0,
        metavar="S",
        help="fallback poll when no notification comes (5); LISTEN/NOTIFY wakes the worker at once",
    )
    p.add_argument("--name", help="worker name (default: host-pid)")
    p.add_argument("--no-scheduler", action="store_true", help="do not materialise recurring schedules")
    add_worker_ops_flags(p)  # --log-level --log-format --metrics-port --metrics-host --listen-dsn --no-prepare
    p.set_defaults(func=cmd_worker, _needs=NEEDS_SCHEMA)
    return p


def worker_queues(
    queues: dict[str, int | None] | None, concurrency: int, declared: list[str] | None = None
) -> dict[str, int]:
    """The ``queues`` a worker serves: the ``--queues`` given, else every queue in ``declared`` (else
    ``default``), each sized by ``concurrency`` unless given as ``name=N``."""
    if not queues:
        return {name: concurrency for name in (declared or ["default"])}
    return {name: size if size is not None else concurrency for name, size in queues.items()}


def cmd_worker(args: argparse.Namespace) -> int:
    import pgjobs

    app = load_app(args.app)
    queues = worker_queues(args.queues, args.concurrency, app.queues)
    worker = pgjobs.Worker(
        app,
        args.dsn,
        queues=queues,
        lease=args.lease,
        grace_period=args.grace_period,
        poll_interval=args.poll_interval,
        name=args.name,
        scheduler=not args.no_scheduler,
        **worker_ops_kwargs(args),  # logs, metrics, PgBouncer (cli/opsflags.py)
    )
    err = Console(stderr=True, highlight=False, width=stdout().width)
    where = args.target.describe() if args.target is not None else dsnmod.redact(args.dsn)
    served = ", ".join(f"{q}={n}" for q, n in queues.items())
    origin = "" if args.queues else " (every queue the app declares; --queues chooses)"
    err.print(
        f"pgjobs worker {worker.name}: app {args.app} ({len(app.handlers)} kinds), serving queues {served}{origin}, "
        f"on {where}. Ctrl-C or SIGTERM stops it gracefully ({args.grace_period:g} s grace)."
    )
    unserved = sorted({h.queue for h in app.handlers.values()} - set(queues))
    if unserved:
        err.print(f"[yellow]note:[/] no worker slot for queue(s) {', '.join(unserved)} declared by the app")
    worker.run_sync()
    # Stopped by a signal: the shell's convention, 128 + its number (130 for Ctrl-C, 143 for SIGTERM), as
    # for any other command interrupted so; the stop itself was graceful.
    return EXIT_OK if worker.stop_signal is None else 128 + worker.stop_signal
