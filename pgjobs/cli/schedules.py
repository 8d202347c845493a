"""``pgjobs schedules list|add|pause|resume|remove`` and ``pgjobs.runtime.scheduler``.

:func:`register` adds the commands to the ``pgjobs`` parser (pgjobs/cli/main.py calls it). Each command is a
function ``(args) -> int``; ``args.dsn`` is resolved by the main CLI, which also turns pgjobs errors
(unknown schedule, code-defined schedule, bad cron ...) into one line on stderr and exit code 1.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import anyio
from rich.console import Console
from rich.table import Table

from pgjobs.client import Client
from pgjobs.errors import InvalidState
from pgjobs.jsonable import to_jsonable
from pgjobs.records import Schedule
from pgjobs.runtime.scheduler import Scheduler

NEEDS_SCHEMA = "schema"


def register(subparsers: Any) -> None:
    """Adds ``schedules`` (with list/add/pause/resume/remove) and ``scheduler`` to the ``pgjobs`` CLI."""
    p = subparsers.add_parser("schedules", help="recurring schedules: list, add, pause, resume, remove")
    p.set_defaults(func=cmd_list, json=False, _needs=NEEDS_SCHEMA)  # bare `pgjobs schedules` lists
    sub = p.add_subparsers(dest="schedules_command", metavar="ACTION", parser_class=type(p))

    q = sub.add_parser("list", help="every schedule with its next and last run")
    q.add_argument("--json", action="store_true", help="print the schedules as JSON")
    q.set_defaults(func=cmd_list, _needs=NEEDS_SCHEMA)

    q = sub.add_parser("add", help="add (or update) a dynamic schedule")
    q.add_argument("name", help="the schedule's unique name")
    q.add_argument("kind", help="the job kind each run enqueues")
    q.add_argument(
        "cron", help="cron expression, e.g. '*/5 * * * *'; six fields put seconds first: '*/5 * * * * *' is every 5 s"
    )
    q.add_argument("--timezone", "--tz", default="UTC", help="IANA time zone the cron is read in (UTC)")
    q.add_argument("--payload", type=_json_object, default={}, metavar="JSON", help="job payload ({})")
    q.add_argument("--queue", default="default")
    q.add_argument("--priority", type=int, default=0, help="lower runs first (0)")
    q.add_argument("--max-attempts", type=int, default=20, metavar="N")
    q.add_argument(
        "--missed",
        choices=["once", "skip"],
        default="once",
        help="after downtime: run a missed run once ('once', default) or skip to the next run ('skip')",
    )
    q.set_defaults(func=cmd_add, _needs=NEEDS_SCHEMA)

    q = sub.add_parser("pause", help="stop a schedule from running (until resumed)")
    q.add_argument("name")
    q.set_defaults(func=cmd_pause, _needs=NEEDS_SCHEMA)

    q = sub.add_parser("resume", help="resume a paused schedule at its next future run")
    q.add_argument("name")
    q.add_argument("--catch-up", action="store_true", help="keep its old next run: a run missed while paused runs once")
    q.set_defaults(func=cmd_resume, _needs=NEEDS_SCHEMA)

    q = sub.add_parser("remove", help="delete a dynamic schedule (its jobs stay)")
    q.add_argument("name")
    q.add_argument("--force", action="store_true", help="also delete a code-defined schedule")
    q.set_defaults(func=cmd_remove, _needs=NEEDS_SCHEMA)

    p = subparsers.add_parser("scheduler", help="run a standalone scheduler until Ctrl-C or SIGTERM")
    p.add_argument(
        "--app", metavar="MODULE:ATTR", help="an App whose @app.periodic schedules are synchronised at start"
    )
    p.add_argument("--batch-size", type=int, default=500, metavar="N", help="schedules per transaction (500)")
    p.set_defaults(func=cmd_scheduler, _needs=NEEDS_SCHEMA)


def _json_object(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None


def _console() -> Console:
    return Console(highlight=False, soft_wrap=False, width=160 if not sys.stdout.isatty() else None)


def _when(value: datetime | None, tz_name: str, now: datetime) -> str:
    if value is None:
        return "-"
    try:
        local = value.astimezone(ZoneInfo(tz_name))
    except Exception:  # an unusable zone stored by another client: show UTC
        local = value.astimezone(UTC)
    seconds = (value - now).total_seconds()
    ago = abs(seconds)
    span = (
        f"{ago:.0f}s"
        if ago < 90
        else f"{ago / 60:.0f}m"
        if ago < 5400
        else f"{ago / 3600:.1f}h"
        if ago < 172800
        else f"{ago / 86400:.0f}d"
    )
    rel = f"in {span}" if seconds >= 0 else f"{span} ago"
    return f"{local:%Y-%m-%d %H:%M:%S %Z} ({rel})"


def print_schedules(schedules: list[Schedule], console: Console | None = None) -> None:
    console = console or _console()
    if not schedules:
        console.print("no schedules")
        return
    now = datetime.now(UTC)
    table = Table(title="schedules", title_justify="left")
    for column in ("name", "kind", "cron", "zone", "queue", "next run", "last run", "last job", "state", "origin"):
        table.add_column(column, no_wrap=column in ("next run", "last run"))
    for s in schedules:
        table.add_row(
            s.name,
            s.kind,
            s.cron,
            s.timezone,
            s.queue,
            "-" if s.paused else _when(s.next_run_at, s.timezone, now),
            _when(s.last_run_at, s.timezone, now),
            str(s.last_job_id) if s.last_job_id is not None else "-",
            "paused" if s.paused else "active",
            f"code ({s.missed})" if s.code_defined else f"dynamic ({s.missed})",
        )
    console.print(table)


def cmd_list(args: argparse.Namespace) -> int:
    with Client(args.dsn, max_size=1) as client:
        schedules = client.list_schedules()
    if getattr(args, "json", False):
        print(json.dumps(to_jsonable(schedules), indent=2))
    else:
        print_schedules(schedules)
    return 0


def cmd_add(args: argparse.Namespace) -> int:
    with Client(args.dsn, max_size=1) as client:
        s = client.add_schedule(
            args.name,
            args.kind,
            args.cron,
            timezone=args.timezone,
            payload=args.payload,
            queue=args.queue,
            priority=args.priority,
            max_attempts=args.max_attempts,
            missed=args.missed,
        )
    _console().print(f"schedule {s.name!r}: {s.kind} at {s.cron!r} ({s.timezone}), next run {_next(s)}")
    return 0


def _next(s: Schedule) -> str:
    return "-" if s.paused else _when(s.next_run_at, s.timezone, datetime.now(UTC))


def cmd_pause(args: argparse.Namespace) -> int:
    with Client(args.dsn, max_size=1) as client:
        changed = client.pause_schedule(args.name)
    _console().print(f"schedule {args.name!r} {'paused' if changed else 'was already paused'}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    with Client(args.dsn, max_size=1) as client:
        changed = client.resume_schedule(args.name, catch_up=args.catch_up)
        s = client.get_schedule(args.name)
    state = "resumed" if changed else "was not paused"
    _console().print(f"schedule {args.name!r} {state}, next run {_next(s) if s is not None else '-'}")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    with Client(args.dsn, max_size=1) as client:
        try:
            client.remove_schedule(args.name, force=args.force)
        except InvalidState as exc:
            # the SQL message speaks to SQL callers ("pass force => true"); here the switch is --force
            message = str(exc).replace("pass force => true", f"pgjobs schedules remove {args.name} --force")
            raise InvalidState(message) from None
    _console().print(f"schedule {args.name!r} removed")
    return 0


def cmd_scheduler(args: argparse.Namespace) -> int:
    app = None
    if args.app:
        from pgjobs.cli.common import load_app  # the worker command's loader: same MODULE:ATTR rules and errors

        app = load_app(args.app)
    err = Console(stderr=True, highlight=False)
    err.print(
        f"pgjobs scheduler: {'app ' + args.app + ', ' if args.app else ''}batch size {args.batch_size}. "
        "Ctrl-C or SIGTERM stops it."
    )

    async def main() -> int:
        async with anyio.create_task_group() as tg:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                await tg.start(Scheduler(args.dsn, app=app, batch_size=args.batch_size).run)
                async for signum in signals:
                    err.print(f"pgjobs scheduler: {signal.Signals(signum).name}, stopping")
                    tg.cancel_scope.cancel()
                    break
        return 0

    return anyio.run(main)
