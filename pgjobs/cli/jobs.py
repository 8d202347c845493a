"""``pgjobs enqueue``, ``stats``, ``jobs``, ``cancel``, ``retry`` and ``purge``."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

from rich.table import Table

from pgjobs.cli.common import (
    EXIT_OK,
    NEEDS_SCHEMA,
    STATES,
    CliError,
    ago,
    error_line,
    job_json,
    load_app,
    open_client,
    parse_duration,
    parse_json,
    parse_when,
    positive_int,
    print_json,
    print_unhandled,
    short,
    stdout,
)
from pgjobs.records import JobState


def register(sub: Any) -> None:
    p = sub.add_parser("enqueue", help="enqueue one job")
    p.add_argument("kind")
    p.add_argument("--payload", type=parse_json, default={}, metavar="JSON", help="job payload ({})")
    p.add_argument(
        "--app",
        metavar="MODULE:ATTR",
        help="the pgjobs.App whose declared queue, priority and max_attempts the kind takes (as pgjobs worker --app)",
    )
    p.add_argument("--queue", help="queue (default: the kind's declared one with --app, else 'default')")
    p.add_argument("--run-at", type=parse_when, metavar="WHEN", help="ISO 8601 time, or a delay like 30s, 5m, 2h")
    p.add_argument("--priority", type=int, help="lower runs first (default: declared with --app, else 0)")
    p.add_argument("--unique-key", metavar="KEY", help="idempotency key: a second enqueue returns the first job")
    p.add_argument("--unique-live-only", action="store_true", help="the key only blocks while its job is not terminal")
    p.add_argument(
        "--max-attempts", type=positive_int, metavar="N", help="attempts (default: declared with --app, else 20)"
    )
    p.add_argument("--group-key", metavar="GROUP", help="fairness group (tenant, customer ...)")
    p.add_argument(
        "--rate-key", metavar="KEY", help="the rate limit its starts draw tokens from (pgjobs rate-limit KEY ...)"
    )
    p.add_argument("--meta", type=parse_json, default=None, metavar="JSON", help="caller tags, trace context")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_enqueue, _needs=NEEDS_SCHEMA)

    p = sub.add_parser("stats", help="jobs by queue and state, and the workers (stale ones marked)")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--read-dsn",
        default=None,
        metavar="DSN",
        help="read from this server instead (a hot standby; host=a,b target_session_attrs=prefer-standby)",
    )
    p.set_defaults(func=cmd_stats, _needs=NEEDS_SCHEMA)

    p = sub.add_parser("jobs", help="list jobs, newest first, a page at a time")
    p.add_argument("--state", choices=STATES)
    p.add_argument("--queue")
    p.add_argument("--kind")
    p.add_argument("--search", help="substring of the kind, unique key or payload text (case-insensitive)")
    p.add_argument("--limit", type=positive_int, default=50, help="jobs per page (50)")
    window = p.add_mutually_exclusive_group()
    window.add_argument("--page", type=positive_int, metavar="N", help="page N of --limit jobs (1 is the newest)")
    window.add_argument("--offset", type=_non_negative_int, metavar="N", help="skip the N newest matching jobs")
    p.add_argument("--json", action="store_true", help="print the page's jobs as a JSON array")
    p.set_defaults(func=cmd_jobs, _needs=NEEDS_SCHEMA)

    p = sub.add_parser("cancel", help="cancel a job (a running job's worker is asked to stop it)")
    p.add_argument("id", type=int)
    p.set_defaults(func=cmd_cancel, _needs=NEEDS_SCHEMA)

    p = sub.add_parser("retry", help="run a failed or cancelled job again")
    p.add_argument("id", type=int)
    p.set_defaults(func=cmd_retry, _needs=NEEDS_SCHEMA)

    p = sub.add_parser("purge", help="delete old terminal jobs")
    p.add_argument("--succeeded-before", type=parse_duration, metavar="AGE", help="succeeded jobs older than AGE (7d)")
    p.add_argument(
        "--failed-before", type=parse_duration, metavar="AGE", help="failed and cancelled jobs older than AGE (30d)"
    )
    p.set_defaults(func=cmd_purge, _needs=NEEDS_SCHEMA)


def _non_negative_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return n


def cmd_enqueue(args: argparse.Namespace) -> int:
    app = load_app(args.app) if args.app else None
    if app is not None and args.kind not in app.handlers:
        note = f"kind {args.kind!r} is not declared by {args.app}: the SQL defaults apply; its workers skip it"
        print(f"pgjobs: note: {note}", file=sys.stderr)
    with open_client(args.dsn, app=app) as client:
        job = client.enqueue(
            args.kind,
            args.payload,
            queue=args.queue,
            run_at=args.run_at,
            priority=args.priority,
            max_attempts=args.max_attempts,
            unique_key=args.unique_key,
            unique_live_only=args.unique_live_only,
            group_key=args.group_key,
            meta=args.meta,
            rate_key=args.rate_key,
        )
    if args.json:
        print_json(job)
    elif job.created:
        stdout().print(f"job {job.id} created, state {job.state.value}")
    else:
        stdout().print(f"job {job.id} already exists (unique key {args.unique_key!r}), state {job.state.value}")
    return EXIT_OK


def cmd_stats(args: argparse.Namespace) -> int:
    with open_client(args.read_dsn or args.dsn) as client:
        stats = client.stats()
        workers = client.list_workers()
        unhandled = client.unhandled_kinds()
    if args.json:
        print_json({"queues": stats, "workers": workers, "unhandled": unhandled})
        return EXIT_OK
    out = stdout()
    counts: dict[str, dict[str, int]] = {}
    for s in stats:
        counts.setdefault(s.queue, {})[s.state.value] = s.jobs
    table = Table(title="jobs by queue and state", title_justify="left")
    table.add_column("queue")
    for state in STATES:
        table.add_column(state, justify="right")
    table.add_column("total", justify="right", style="bold")
    for queue in sorted(counts):
        row = counts[queue]
        table.add_row(queue, *(_count(row.get(st, 0)) for st in STATES), str(sum(row.values())))
    if len(counts) > 1:
        table.add_row(
            "[bold]all[/]",
            *(_count(sum(r.get(st, 0) for r in counts.values())) for st in STATES),
            str(sum(sum(r.values()) for r in counts.values())),
        )
    out.print(table if counts else "no jobs")
    print_unhandled(out, unhandled)
    wt = Table(title="workers", title_justify="left")
    for col in ("worker", "status", "last seen", "running", "queues", "host", "pid"):
        wt.add_column(col, justify="right" if col in ("running", "pid") else "left")
    now = datetime.now(UTC)
    for w in workers:
        queues = w.meta.get("queues")
        queue_text = (
            ", ".join(f"{k}={v}" for k, v in queues.items())
            if isinstance(queues, dict)
            else ", ".join(map(str, queues))
            if isinstance(queues, list)
            else ""
        )
        wt.add_row(
            w.id,
            w.status if w.live else f"[bold red]{w.status}[/]",
            ago(w.last_seen, now),
            str(w.active_jobs),
            queue_text,
            str(w.meta.get("host", "")),
            str(w.meta.get("pid", "")),
        )
    out.print(wt if workers else "no workers")
    return EXIT_OK


def _count(n: int) -> str:
    return str(n) if n else "[dim]0[/]"


def page_window(page: int | None, offset: int | None, limit: int) -> int:
    """The row offset of ``--page N`` (1-based) or ``--offset N``."""
    if page is not None:
        return (page - 1) * limit
    return offset or 0


def cmd_jobs(args: argparse.Namespace) -> int:
    skip = page_window(args.page, args.offset, args.limit)
    with open_client(args.dsn) as client:
        jobs = client.list_jobs(args.state, args.queue, args.kind, args.search, args.limit, skip)
        total = client.count_jobs(args.state, args.queue, args.kind, args.search)
    if args.json:
        print_json([job_json(j) for j in jobs])
        return EXIT_OK
    out = stdout()
    if not jobs:
        out.print(f"no jobs (of {total})" if total else "no jobs")
        return EXIT_OK
    table = Table()
    for col in ("id", "kind", "queue", "state", "attempt", "created", "run at / completed", "last error"):
        table.add_column(col, justify="right" if col in ("id", "attempt") else "left", overflow="ellipsis")
    now = datetime.now(UTC)
    for j in jobs:
        when = ago(j.completed_at, now) if j.completed_at else ago(j.run_at, now)
        table.add_row(
            str(j.id),
            j.kind,
            j.queue,
            j.state.value,
            f"{j.attempt}/{j.max_attempts}",
            ago(j.created_at, now),
            when,
            short(error_line(j.last_error), 50),
        )
    out.print(table)
    out.print(page_footer(skip, len(jobs), total, args.limit))
    return EXIT_OK


def page_footer(skip: int, shown: int, total: int, limit: int) -> str:
    """``jobs 1-50 of 312 (page 1 of 7; --page 2 for the next)``."""
    pages = max(1, -(-total // limit))
    page = skip // limit + 1
    text = f"jobs {skip + 1}-{skip + shown} of {total}"
    if skip % limit == 0:
        text += f" (page {page} of {pages}"
        text += f"; --page {page + 1} for the next)" if skip + shown < total else ")"
    elif skip + shown < total:
        text += f" (--offset {skip + shown} for the next)"
    return text


def cmd_cancel(args: argparse.Namespace) -> int:
    with open_client(args.dsn) as client:
        done = client.cancel(args.id)
        job = client.job_status(args.id)
    state = job.state.value if job is not None else "gone"
    if not done:
        raise CliError(f"job {args.id} is already {state}; nothing to cancel")
    if job is not None and job.state == JobState.ACTIVE:
        stdout().print(f"job {args.id} is running; its worker was asked to stop it")
    else:
        stdout().print(f"job {args.id} cancelled")
    return EXIT_OK


def cmd_retry(args: argparse.Namespace) -> int:
    with open_client(args.dsn) as client:
        client.retry(args.id)
        job = client.job_status(args.id)
    stdout().print(f"job {args.id} is {job.state.value if job else 'gone'} again")
    return EXIT_OK


def cmd_purge(args: argparse.Namespace) -> int:
    with open_client(args.dsn) as client:
        n = client.purge(args.succeeded_before, args.failed_before)
    stdout().print(f"purged {n} job(s)")
    return EXIT_OK
