"""``pgjobs status ID [--follow] [--json] [--errors]``: one job, or its status as it changes.

``--follow`` reads the job's durable row whenever the status stream (``client.subscribe``) reports a change,
and on a timer (a missed notification costs latency, never a state). With ``--json`` it prints one JSON
object per line as things happen: ``{"type": "job", ...}`` (the job's status) first and last, and
``{"type": "event", ...}`` for every transition and progress report in between.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from datetime import UTC, datetime
from typing import Any

from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from pgjobs.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    NEEDS_SCHEMA,
    CliError,
    ago,
    describe_progress,
    error_line,
    job_json,
    open_client,
    print_json,
    print_unhandled,
    progress_fraction,
    short,
    stdout,
)
from pgjobs.cli.durable_view import durable_rows
from pgjobs.jsonable import CLI_DISPLAY_CHARS, shown_json, to_jsonable
from pgjobs.records import JobState, JobStatus, UnhandledKind

POLL = 1.0  # seconds between two re-reads of a followed job when no event comes


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="show one job; --follow streams it until it is done")
    p.add_argument("id", type=int)
    p.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="stream status changes until the job is terminal; exit 0 if it succeeded, 1 if not",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the job as JSON; with --follow, one JSON object per line as events happen",
    )
    p.add_argument("--errors", action="store_true", help="also print every failed attempt's full error")
    p.add_argument(
        "--read-dsn",
        default=None,
        metavar="DSN",
        help="read from this server instead (a hot standby; host=a,b target_session_attrs=prefer-standby)",
    )
    p.set_defaults(func=cmd_status, _needs=NEEDS_SCHEMA)


def _job_table(job: JobStatus, durable: dict[str, Any] | None = None) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    now = datetime.now(UTC)

    def row(name: str, value: Any) -> None:
        if value not in (None, "", [], {}):
            # (as Text: a value's brackets are not rich markup)
            table.add_row(name, Text(value if isinstance(value, str) else shown_json(value, CLI_DISPLAY_CHARS)))

    row("job", f"{job.id}  {job.kind}  (queue {job.queue})")
    row("state", f"{job.state.value}" + ("  [cancel requested]" if job.cancel_requested else ""))
    row("attempt", f"{job.attempt} of {job.max_attempts}")
    row("created", f"{job.created_at:%Y-%m-%d %H:%M:%S%z} ({ago(job.created_at, now)})")
    if not job.state.terminal:
        row("run at", f"{job.run_at:%Y-%m-%d %H:%M:%S%z} ({ago(job.run_at, now)})")
    if job.first_started_at:
        row("started", f"{job.first_started_at:%Y-%m-%d %H:%M:%S%z} ({ago(job.first_started_at, now)})")
    if job.completed_at:
        row("completed", f"{job.completed_at:%Y-%m-%d %H:%M:%S%z} ({ago(job.completed_at, now)})")
    if job.leased_by and job.state == JobState.ACTIVE:
        row("worker", f"{job.leased_by} (lease {ago(job.lease_expires_at, now)})")
    row("priority", str(job.priority) if job.priority else None)
    row("unique key", job.unique_key)
    row("group", job.group_key)
    row("batch", str(job.batch_id) if job.batch_id is not None else None)
    row("depends on", job.depends_on)
    row("payload", job.payload)
    fraction = progress_fraction(job.progress)
    if fraction is not None:
        bar = Table.grid(padding=(0, 1))
        bar.add_row(ProgressBar(total=1000, completed=int(fraction * 1000), width=30), describe_progress(job.progress))
        table.add_row("progress", bar)
    else:
        row("progress", describe_progress(job.progress))
    row("checkpoint", job.checkpoint)
    for label, text in durable_rows(durable, now):  # steps done, sleeping until, waiting for (durable_view.py)
        row(label, text)
    row("result", job.result)
    row("last error", short(error_line(job.last_error), 200))
    if job.errors:
        attempts = f"{len(job.errors)} failed attempt" + ("s" if len(job.errors) > 1 else "")
        row("errors", f"{attempts} (--errors shows the tracebacks)")
    return table


def _job_line(job: JobStatus) -> str:
    text = f"{datetime.now():%H:%M:%S}  job {job.id} {job.kind}: {job.state.value}"
    text += f", attempt {job.attempt}/{job.max_attempts}"
    if job.progress is not None:
        text += f", progress {describe_progress(job.progress)}"
    if job.state in (JobState.SCHEDULED, JobState.PENDING) and job.last_error:
        text += f", last error: {short(error_line(job.last_error), 80)}"
    if job.state == JobState.FAILED and job.last_error:
        text += f": {short(error_line(job.last_error), 120)}"
    return text


def _terminal_code(job: JobStatus) -> int:
    return EXIT_OK if job.state == JobState.SUCCEEDED else EXIT_ERROR


def _print_errors(job: JobStatus) -> None:
    out = stdout()
    if not job.errors:
        out.print("no failed attempts")
    for entry in job.errors:
        where = f" on {entry.get('worker')}" if entry.get("worker") else ""
        out.print(f"[bold]attempt {entry.get('attempt')}[/] at {entry.get('at')}{where}:")
        out.print(str(entry.get("error", "")), markup=False)


def _json_line(value: dict[str, Any]) -> None:
    print(json.dumps(to_jsonable(value), separators=(",", ":")), flush=True)


def _job_object(job: JobStatus) -> dict[str, Any]:
    return {"type": "job", **job_json(job)}


def _unhandled(job: JobStatus | None, rows: list[UnhandledKind]) -> list[UnhandledKind]:
    """``rows`` (``unhandled_kinds`` of the job's queue) that say no live worker will take this job."""
    if job is None or job.state not in (JobState.PENDING, JobState.SCHEDULED):
        return []
    return [u for u in rows if u.kind == job.kind]


def cmd_status(args: argparse.Namespace) -> int:
    with open_client(args.read_dsn or args.dsn) as client:
        job = client.job_status(args.id)
        durable = None if job is None or args.follow else client.durable_status(args.id)
        waiting = job is not None and not args.json and job.state in (JobState.PENDING, JobState.SCHEDULED)
        unhandled = _unhandled(job, client.unhandled_kinds([job.queue]) if job is not None and waiting else [])
    if job is None:
        lag = " on the --read-dsn server (a standby shows a new job once it has replayed it)" if args.read_dsn else ""
        raise CliError(f"job {args.id} not found{lag}")
    if not args.follow:
        if args.json:
            recorded = durable is not None and bool(durable["steps"] + durable["waits"])
            print_json({**job_json(job), "durable": durable} if recorded else job_json(job))
        else:
            stdout().print(_job_table(job, durable))
            print_unhandled(stdout(), unhandled)
            if args.errors:
                _print_errors(job)
        return EXIT_OK
    if job.state.terminal:
        if args.json:
            _json_line(_job_object(job))
        else:
            stdout().print(_job_line(job))
        return _terminal_code(job)
    import anyio

    print_unhandled(stdout(), unhandled)
    return anyio.run(_follow, args.read_dsn or args.dsn, args.id, args.json)


async def _follow(dsn: str, job_id: int, as_json: bool) -> int:
    """Streams one job's status until it is terminal: status events wake us, the durable row is the truth."""
    import anyio
    from rich.live import Live

    from pgjobs.client import AsyncClient

    out = stdout()
    async with AsyncClient(dsn, min_size=1, max_size=3) as client:
        inbox = _Inbox()

        async def pump() -> None:
            try:
                async for event in client.subscribe(job_ids=[job_id]):  # ends by itself once the job is terminal
                    inbox.put(event)
            finally:
                inbox.close()

        async with anyio.create_task_group() as tg:
            tg.start_soon(pump)
            job: JobStatus | None = await client.job_status(job_id)
            if as_json and job is not None:
                _json_line(_job_object(job))
            last = ""
            live = Live(console=out, auto_refresh=False, transient=False) if out.is_terminal and not as_json else None
            with live if live is not None else contextlib.nullcontext():
                while job is not None and not job.state.terminal:
                    if live is not None:
                        live.update(_job_table(job), refresh=True)
                    elif not as_json:
                        line = _job_line(job)
                        key = line.split("  ", 1)[1]
                        if key != last:
                            out.print(line)
                            last = key
                    await _wait_for_change(inbox, as_json)
                    job = await client.job_status(job_id)
                if live is not None and job is not None:
                    live.update(_job_table(job), refresh=True)
            tg.cancel_scope.cancel()
    if job is None:
        raise CliError(f"job {job_id} was deleted while it was followed")
    if as_json:
        _json_line(_job_object(job))
    elif live is None:
        out.print(_job_line(job))
    return _terminal_code(job)


class _Inbox:
    """The followed job's events, handed from the stream to the loop that prints them. The loop waits on an
    event and takes what is there: a wait cut short by its deadline loses nothing (a memory stream's receive
    cancelled just as an item came dropped that item)."""

    def __init__(self) -> None:
        import anyio

        self.items: list[Any] = []
        self.ended = False
        self.changed = anyio.Event()

    def put(self, item: Any) -> None:
        self.items.append(item)
        self.changed.set()

    def close(self) -> None:
        self.ended = True
        self.changed.set()

    async def take(self, timeout: float) -> list[Any]:
        """What came, once something did or ``timeout`` passed (no await between the take and the reset)."""
        import anyio

        with anyio.move_on_after(timeout):
            await self.changed.wait()
        items, self.items = self.items, []
        if self.changed.is_set() and not self.ended:
            self.changed = anyio.Event()
        return items


async def _wait_for_change(inbox: _Inbox, as_json: bool) -> None:
    """Until the stream reports something (printed as it comes with ``--json``) or :data:`POLL` passes."""
    import anyio

    events = await inbox.take(POLL)
    if not events and inbox.ended:  # the stream saw the job end (or stopped): poll until we do
        await anyio.sleep(POLL)
        return
    if as_json:
        for event in events:
            _json_line({"type": "event", **to_jsonable(event)})
    sys.stdout.flush()
