"""``pgjobs queue configure NAME ...``, ``pgjobs queue show [NAME]`` and ``pgjobs queue weight QUEUE GROUP
WEIGHT``: per-queue settings (``configure_queue``) and the weights of a fair queue's groups (``configure_group``).

:mod:`pgjobs.cli` adds these commands with :func:`register`; every command gets a ready DSN in ``args.dsn``.
Options left out leave a setting as it is; ``0`` removes a limit (``--max-active 0``); weight ``1`` resets a
group's weight. A fair queue's settings come with the groups in its ring: their weights and last serves.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from pgjobs.cli.common import ago, parse_duration
from pgjobs.client import Client, reports
from pgjobs.jsonable import to_jsonable
from pgjobs.records import FairGroup, QueueSettings

STATUS_EVENTS = ("all", "terminal", "none")
MAX_WEIGHT = 1000.0  # configure_group's bound (sql/admin.sql): refused here before a round trip
SHOWN_GROUPS = 20  # the groups a table lists per queue; --json lists them all


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more (0 removes the limit), got {value}")
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {value}")
    return value


def _weight(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, {MAX_WEIGHT:g}], got {text!r}") from None
    if not (math.isfinite(value) and 0 < value <= MAX_WEIGHT):
        raise argparse.ArgumentTypeError(f"expected a number in (0, {MAX_WEIGHT:g}] (1 resets it), got {text}")
    return value


def register(subparsers: Any) -> None:
    """Adds ``queue configure``, ``queue show`` and ``queue weight`` to the ``pgjobs`` command line."""
    queue = subparsers.add_parser("queue", help="show or change per-queue settings (fairness, caps, pause)")
    sub = queue.add_subparsers(dest="queue_command", metavar="SUBCOMMAND", parser_class=type(queue))
    queue.set_defaults(func=_usage(queue), _needs="nothing")

    p = sub.add_parser(
        "configure",
        help="change a queue's settings (options left out stay as they are; 0 removes a limit)",
        description="Change a queue's settings. Options left out stay as they are; 0 removes a limit.",
    )
    p.add_argument("name", metavar="NAME", help="the queue")
    fair = p.add_mutually_exclusive_group()
    fair.add_argument("--fair", dest="fair", action="store_true", default=None, help="fair selection between groups")
    fair.add_argument("--no-fair", dest="fair", action="store_false", help="plain claim order (priority, run_at, id)")
    p.add_argument(
        "--max-active-per-group", type=_non_negative_int, metavar="N", help="running jobs per group, cluster-wide"
    )
    p.add_argument("--max-active", type=_non_negative_int, metavar="N", help="running jobs of the queue, cluster-wide")
    p.add_argument("--max-length", type=_non_negative_int, metavar="N", help="jobs not yet finished (enqueue refuses)")
    p.add_argument(
        "--noisy-share", type=_share, metavar="X", help="a group holding more than this share of running jobs is noisy"
    )
    p.add_argument(
        "--noisy-min-active", type=_non_negative_int, metavar="N", help="... and at least this many running jobs"
    )
    p.add_argument("--status-events", choices=STATUS_EVENTS, help="which pgjobs_status events the queue sends")
    p.add_argument(
        "--retention",
        type=parse_duration,
        metavar="AGE",
        help="keep finished jobs this long, then maintenance drops them (7d; 0: keep until purge)",
    )
    p.add_argument(
        "--max-starts", type=_non_negative_int, metavar="N", help="starts per --per, cluster-wide (0 removes)"
    )
    p.add_argument("--per", type=parse_duration, metavar="AGE", help="the window of --max-starts (1s, 1m, 1h)")
    pause = p.add_mutually_exclusive_group()
    pause.add_argument("--pause", dest="paused", action="store_true", default=None, help="stop handing out jobs")
    pause.add_argument("--resume", dest="paused", action="store_false", help="hand out jobs again")
    p.add_argument("--json", action="store_true", help="print the settings as JSON")
    p.set_defaults(func=cmd_configure, _needs="schema")

    p = sub.add_parser("show", help="the settings of one queue, or of every configured queue")
    p.add_argument("name", metavar="NAME", nargs="?", help="the queue (default: every configured queue)")
    p.add_argument("--json", action="store_true", help="print the settings as JSON")
    p.set_defaults(func=cmd_show, _needs="schema")

    p = sub.add_parser(
        "weight",
        help="a fair queue's group's share of the claims while several groups have work (1 resets it)",
        description="Set the weight of GROUP in the fair queue QUEUE: while several groups have work, each is"
        " served in proportion to its weight (default 1). A group with no work gives its share to the others;"
        " one that comes back neither starves nor makes up for lost turns. WEIGHT 1 resets it.",
    )
    p.add_argument("queue", metavar="QUEUE", help="the fair queue")
    p.add_argument("group_key", metavar="GROUP", help="the group (the jobs' group_key)")
    p.add_argument("weight", metavar="WEIGHT", type=_weight, help=f"in (0, {MAX_WEIGHT:g}]; 1 (the default) resets")
    p.add_argument("--json", action="store_true", help="print the weight as JSON")
    p.set_defaults(func=cmd_weight, _needs="schema")


def _usage(parser: argparse.ArgumentParser) -> Any:
    def show_usage(args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return 2

    return show_usage


def _client(dsn: str) -> Client:
    return Client(dsn, min_size=1, max_size=1)


def cmd_configure(args: argparse.Namespace) -> int:
    with _client(args.dsn) as client:
        settings = client.configure_queue(
            args.name,
            max_length=args.max_length,
            paused=args.paused,
            fair=args.fair,
            noisy_share=args.noisy_share,
            noisy_min_active=args.noisy_min_active,
            max_active_per_group=args.max_active_per_group,
            max_active=args.max_active,
            status_events=args.status_events,
            retention=args.retention,
            max_starts=args.max_starts,
            per=args.per,
        )
        live = _live(client, [settings.queue])
        groups = _groups(client, [settings])
    if args.json:
        _print_json(_as_dict(settings, live.get(settings.queue), groups.get(settings.queue)))
    else:
        out = _console()
        out.print(_table([settings], live, title=f"queue {settings.queue}"))
        _print_groups(out, groups)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with _client(args.dsn) as client:
        configured = client.queues()
        if args.name is not None:
            found = [q for q in configured if q.queue == args.name]
            rows = found or [_defaults(args.name)]
        else:
            rows = configured
        live = _live(client, [q.queue for q in rows])
        groups = _groups(client, rows)
    if args.json:
        items = [_as_dict(q, live.get(q.queue), groups.get(q.queue)) for q in rows]
        _print_json(items[0] if args.name is not None else items)
        return 0
    out = _console()
    if not rows:
        out.print("no configured queues (every queue has the defaults: unbounded, not fair, no caps)")
        return 0
    title = "queues" if args.name is None else f"queue {args.name}"
    if args.name is not None and not any(q.queue == args.name for q in configured):
        title += " (not configured: the defaults)"
    out.print(_table(rows, live, title=title))
    _print_groups(out, groups)
    return 0


def cmd_weight(args: argparse.Namespace) -> int:
    with _client(args.dsn) as client:
        weight = client.configure_group(args.queue, args.group_key, args.weight)
        fair = any(q.queue == args.queue and q.fair for q in client.queues())
    if args.json:
        _print_json({"queue": args.queue, "group_key": args.group_key, "weight": weight, "fair": fair})
        return 0
    text = f"queue {args.queue!r} group {args.group_key!r}: weight {weight:g}"
    if weight == 1:
        text += " (the default)"
    if not fair:
        text += f"; the queue is not fair: weights apply once it is (pgjobs queue configure {args.queue} --fair)"
    _console().print(text, markup=False)
    return 0


def _defaults(name: str) -> QueueSettings:
    return QueueSettings(
        queue=name,
        max_length=None,
        paused=False,
        fair=False,
        noisy_share=0.5,
        noisy_min_active=2,
        max_active_per_group=None,
        max_active=None,
        status_events="all",
        updated_at=None,  # type: ignore[arg-type]
    )


def _live(client: Client, queues: list[str]) -> dict[str, dict[str, int]]:
    """Pending and running jobs, and groups in the fair ring (cursors of live groups), per queue."""
    out: dict[str, dict[str, int]] = {q: {"pending": 0, "active": 0, "groups": 0} for q in queues}
    if not queues:
        return out
    with client.pool.connection() as conn:
        rows = reports.run(conn, reports.queue_live(queues))
    for queue, pending, active, groups in rows:
        out[queue] = {"pending": int(pending), "active": int(active), "groups": int(groups)}
    return out


def _groups(client: Client, rows: list[QueueSettings]) -> dict[str, list[FairGroup]]:
    """The groups in the ring of each fair queue of ``rows``, heaviest first (``fair_ring_groups``)."""
    return {q.queue: client.fair_groups(q.queue) for q in rows if q.fair}


def _print_groups(out: Console, groups: dict[str, list[FairGroup]]) -> None:
    for queue, found in groups.items():
        if not found:
            continue
        out.print(f"groups of {queue} with pending work at its last claim", markup=False)
        table = Table()
        for name, right in (("group", False), ("weight", True), ("last served", False), ("served", True)):
            table.add_column(name, justify="right" if right else "left")
        for g in found[:SHOWN_GROUPS]:
            table.add_row(
                "(ungrouped)" if g.group_key is None else g.group_key,
                f"{g.weight:g}",
                ago(g.last_served_at) or "never",
                str(g.served),
            )
        out.print(table)
        if len(found) > SHOWN_GROUPS:
            out.print(f"... and {len(found) - SHOWN_GROUPS} more groups (--json lists them all)", markup=False)


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


def _table(rows: list[QueueSettings], live: dict[str, dict[str, int]], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for name, right in (
        ("queue", False),
        ("state", False),
        ("fair", False),
        ("max active", True),
        ("per group", True),
        ("max length", True),
        ("noisy share", True),
        ("noisy min", True),
        ("status events", False),
        ("pending", True),
        ("running", True),
        ("groups", True),
    ):
        table.add_column(name, justify="right" if right else "left")
    for q in rows:
        counts = live.get(q.queue, {})
        table.add_row(
            q.queue,
            "[yellow]paused[/]" if q.paused else "running",
            "yes" if q.fair else "no",
            _limit(q.max_active),
            _limit(q.max_active_per_group),
            _limit(q.max_length),
            f"{q.noisy_share:g}",
            str(q.noisy_min_active),
            q.status_events,
            str(counts.get("pending", 0)),
            str(counts.get("active", 0)),
            str(counts.get("groups", 0)),
        )
    return table


def _as_dict(
    settings: QueueSettings, counts: dict[str, int] | None, groups: list[FairGroup] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = to_jsonable(settings)
    out.update(counts or {})
    out["fair_groups"] = to_jsonable(groups or [])
    return out


def _print_json(value: Any) -> None:
    print(json.dumps(to_jsonable(value), indent=2))


def _console() -> Console:
    return Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 160)
