"""The ``pgjobs`` command line.

Every command is a function ``(args) -> int`` (the exit code). :func:`main` resolves the database once
(``--dsn``, ``PGJOBS_DSN``, ``DATABASE_URL``, else the embedded server; see :mod:`pgjobs.ops.dsn`), puts the
DSN in ``args.dsn``, checks that the server answers and (for commands that need it) that the schema is
installed, and turns every expected failure into one line on stderr and an exit code:

====  =====================================================================
0     done
1     refused by pgjobs (a ``PJxxx`` error: unknown job, wrong state, ...) or a job that ended badly
2     bad arguments, or the database cannot be reached
3     the database has no pgjobs schema (run ``pgjobs migrate``)
4     ``worker --app``: the module or attribute cannot be found
130   interrupted (Ctrl-C); 143 after SIGTERM
====  =====================================================================
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout
from rich.console import Console
from rich.progress_bar import ProgressBar
from rich.table import Table

from pgjobs import __version__
from pgjobs.client import Client
from pgjobs.errors import PgJobsError, SchemaMissing
from pgjobs.jsonable import to_jsonable
from pgjobs.ops import dsn as dsnmod
from pgjobs.records import JobState, JobStatus

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 2
EXIT_NOT_MIGRATED = 3
EXIT_UNKNOWN_APP = 4
EXIT_INTERRUPTED = 130

CONNECT_TIMEOUT = 10

# what a command needs before it runs: nothing, a server that answers, or an installed schema
NEEDS_NOTHING = "nothing"
NEEDS_SERVER = "server"
NEEDS_SCHEMA = "schema"

STATES = [s.value for s in JobState]


class CliError(Exception):
    """An expected failure: printed as one line on stderr, exits with ``code``."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------------------------------------
# small helpers shared by the commands (and pgjobs.cli.demo)


def stdout() -> Console:
    # piped output: wide enough that tables are not cut at 80 columns (COLUMNS still wins)
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(highlight=False, soft_wrap=False, width=160 if wide else None)


def one_line(text: str) -> str:
    return " ".join(text.split())


def parse_duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``12h``, ``7d``, ``2w`` and sums like ``1d12h``; a bare number is seconds."""
    value = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return timedelta(seconds=float(value))
    units = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([smhdw])", value)
    if not parts or re.sub(r"(\d+(?:\.\d+)?)\s*([smhdw])", "", value).strip():
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (examples: 30s, 15m, 12h, 7d, 1d12h)")
    total = timedelta()
    for number, unit in parts:
        total += timedelta(**{units[unit]: float(number)})
    return total


def parse_when(text: str) -> datetime:
    """``--run-at``: an ISO 8601 time (no zone: local time), or a delay from now (``30s``, ``+5m``, ``2h``)."""
    value = text.strip()
    with contextlib.suppress(argparse.ArgumentTypeError):
        return datetime.now(UTC) + parse_duration(value.removeprefix("+").removeprefix("in "))
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r} (an ISO 8601 time like 2026-12-01T09:30:00+00:00, or a delay like 30s, 5m)"
        ) from None
    return when if when.tzinfo is not None else when.astimezone()


def parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON ({exc.msg} at column {exc.colno}): {text!r}") from None


def parse_queues(text: str) -> dict[str, int | None]:
    """``default=10,emails=5`` (or ``default,emails``: the size comes from ``--concurrency``)."""
    queues: dict[str, int | None] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        name, sep, size = item.partition("=")
        name = name.strip()
        if not name:
            raise argparse.ArgumentTypeError(f"empty queue name in {text!r}")
        if sep:
            try:
                n = int(size)
            except ValueError:
                n = 0
            if n < 1:
                raise argparse.ArgumentTypeError(
                    f"queue {name!r}: concurrency must be a positive integer, got {size!r}"
                )
            queues[name] = n
        else:
            queues[name] = None
    if not queues:
        raise argparse.ArgumentTypeError(f"no queue in {text!r} (example: default=10,emails=5)")
    return queues


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def non_negative_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if x < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return x


def positive_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = 0.0
    if not x > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return x


def progress_fraction(progress: Any) -> float | None:
    """A fraction in [0, 1] from a job's progress, when it has a recognisable shape.

    Recognised: a number in [0, 1]; ``{"done": n, "total": m}`` (also ``current``/``total``);
    ``{"percent": p}``; ``{"fraction": f}``. Anything else is shown as JSON.
    """
    if isinstance(progress, bool):
        return None
    if isinstance(progress, int | float):
        return float(progress) if 0 <= progress <= 1 else None
    if isinstance(progress, dict):
        total = progress.get("total")
        done = progress.get("done", progress.get("current"))
        if isinstance(total, int | float) and isinstance(done, int | float) and total > 0:
            return max(0.0, min(1.0, float(done) / float(total)))
        if isinstance(progress.get("percent"), int | float):
            return max(0.0, min(1.0, float(progress["percent"]) / 100))
        if isinstance(progress.get("fraction"), int | float):
            return max(0.0, min(1.0, float(progress["fraction"])))
    return None


def describe_progress(progress: Any) -> str:
    if progress is None:
        return ""
    fraction = progress_fraction(progress)
    message = progress.get("message") if isinstance(progress, dict) else None
    if fraction is not None:
        text = f"{fraction:.0%}"
        if isinstance(progress, dict) and "done" in progress and "total" in progress:
            text += f" ({progress['done']}/{progress['total']})"
        return f"{text} {message}" if message else text
    return json.dumps(progress, default=str)


def print_json(value: Any) -> None:
    print(json.dumps(to_jsonable(value), indent=2, sort_keys=False))


def ago(when: datetime | None, now: datetime | None = None) -> str:
    if when is None:
        return ""
    seconds = ((now or datetime.now(UTC)) - when).total_seconds()
    future = seconds < 0
    seconds = abs(seconds)
    if seconds < 1:
        text = f"{seconds * 1000:.0f} ms"
    elif seconds < 90:
        text = f"{seconds:.0f} s"
    elif seconds < 90 * 60:
        text = f"{seconds / 60:.0f} min"
    elif seconds < 36 * 3600:
        text = f"{seconds / 3600:.1f} h"
    else:
        text = f"{seconds / 86400:.1f} d"
    return f"in {text}" if future else f"{text} ago"


def short(text: str | None, width: int = 60) -> str:
    if not text:
        return ""
    line = one_line(text)
    return line if len(line) <= width else line[: width - 1] + "…"


# ---------------------------------------------------------------------------------------------------------
# the database


def _connect_kwargs(dsn: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"autocommit": True}
    if "PGCONNECT_TIMEOUT" not in os.environ and not conninfo_to_dict(dsn).get("connect_timeout"):
        kwargs["connect_timeout"] = CONNECT_TIMEOUT
    return kwargs


def unreachable(dsn: str, exc: BaseException, where: str | None = None) -> CliError:
    reason = dsnmod.first_line(str(exc)) or type(exc).__name__
    return CliError(f"cannot connect to {where or 'the database ' + dsnmod.redact(dsn)}: {reason}", EXIT_UNREACHABLE)


def not_migrated(dsn: str, detail: str = "", where: str | None = None) -> CliError:
    suffix = f" ({detail})" if detail else ""
    return CliError(
        f"{where or 'the database ' + dsnmod.redact(dsn)} has no pgjobs schema{suffix}; run `pgjobs migrate` first",
        EXIT_NOT_MIGRATED,
    )


def check_database(dsn: str, need_schema: bool, where: str | None = None) -> None:
    """Raises :class:`CliError` (exit 2) when the server does not answer, (exit 3) when the schema is missing."""
    try:
        with psycopg.connect(dsn, **_connect_kwargs(dsn)) as conn:
            if not need_schema:
                return
            row = conn.execute(
                "SELECT n.oid IS NOT NULL,"
                " EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS p"
                "         WHERE p.pronamespace = n.oid AND p.proname = 'job_status')"
                " FROM (SELECT to_regnamespace('pgjobs')::oid AS oid) AS n"
            ).fetchone()
    except psycopg.OperationalError as exc:
        raise unreachable(dsn, exc, where) from None
    if row is None or not row[0]:
        raise not_migrated(dsn, where=where)
    if not row[1]:
        raise not_migrated(dsn, "its functions are not installed", where)


@contextlib.contextmanager
def open_client(dsn: str) -> Iterator[Client]:
    """A small :class:`Client` whose pool gives up after the connect timeout instead of 30 s."""
    pool: ConnectionPool[Any] = ConnectionPool(
        dsn, min_size=1, max_size=2, kwargs=_connect_kwargs(dsn), timeout=CONNECT_TIMEOUT, open=False, name="pgjobs-cli"
    )
    try:
        pool.open(wait=True, timeout=CONNECT_TIMEOUT)
    except PoolTimeout as exc:
        pool.close()
        raise unreachable(dsn, exc) from None
    try:
        with Client(pool=pool) as client:
            yield client
    finally:
        pool.close()


# ---------------------------------------------------------------------------------------------------------
# migrate


def cmd_migrate(args: argparse.Namespace) -> int:
    from pgjobs.ops import migrate

    out = stdout()
    if args.status:
        state = migrate.status(args.dsn)
        table = Table(title="migrations", title_justify="left")
        table.add_column("change")
        table.add_column("deployed")
        table.add_column("note")
        notes = {c.name: c.note for c in migrate.plan()}
        for name, deployed in state.items():
            table.add_row(name, "yes" if deployed else "[yellow]no[/]", notes.get(name, ""))
        out.print(table)
        out.print(f"functions: {_functions_state(args.dsn, migrate.sql_digest())}")
        return EXIT_OK if all(state.values()) else EXIT_ERROR
    if args.verify:
        try:
            checked = migrate.verify(args.dsn)
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            raise CliError(f"verification failed: {dsnmod.first_line(str(exc))}") from None
        if not checked:
            raise not_migrated(args.dsn, "nothing is deployed", args.where)
        out.print(f"verified {len(checked)} change(s): {', '.join(checked)}")
        return EXIT_OK
    if args.rollback:
        if sys.stdin.isatty() and not args.yes:
            what = f"the changes after {args.to!r}" if args.to else "every pgjobs change (all jobs are deleted)"
            answer = input(f"Revert {what} in {dsnmod.redact(args.dsn)}? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing reverted", file=sys.stderr)
                return EXIT_ERROR
        try:
            reverted = migrate.rollback(args.dsn, to=args.to)
        except ValueError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
        out.print(f"reverted: {', '.join(reverted)}" if reverted else "nothing to revert")
        return EXIT_OK
    t0 = time.perf_counter()
    result = migrate.migrate(args.dsn)
    elapsed = time.perf_counter() - t0
    applied = f"applied {', '.join(result.applied)}" if result.applied else "schema up to date"
    functions = "functions installed" if result.functions_installed else "functions up to date"
    where = " (embedded server)" if args.uses_embedded else ""
    out.print(f"{applied}; {functions} ({elapsed:.2f} s){where}")
    return EXIT_OK


def _functions_state(dsn: str, digest: str) -> str:
    with psycopg.connect(dsn, **_connect_kwargs(dsn)) as conn:
        if conn.execute("SELECT to_regclass('pgjobs.sql_revision')").fetchone() == (None,):
            return "not installed"
        row = conn.execute("SELECT digest FROM pgjobs.sql_revision").fetchone()
    if row is None:
        return "not installed"
    return "up to date" if row[0] == digest else "outdated (run `pgjobs migrate`)"


# ---------------------------------------------------------------------------------------------------------
# worker


def load_app(spec: str) -> Any:
    """``module:attribute`` (``module`` alone means ``module:app``) -> the :class:`pgjobs.App`."""
    import pgjobs

    module_name, _, attr_path = spec.partition(":")
    module_name = module_name.strip()
    attr_path = attr_path.strip() or "app"
    if not module_name:
        raise CliError(f"--app {spec!r}: expected module:attribute, e.g. myproject.jobs:app", EXIT_UNKNOWN_APP)
    # like `python -m`: the current directory is importable, so `--app tasks:app` finds ./tasks.py
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise CliError(f"--app {spec!r}: no module named {exc.name!r}", EXIT_UNKNOWN_APP) from None
        raise CliError(f"--app {spec!r}: importing {module_name!r} failed: {exc}", EXIT_UNKNOWN_APP) from None
    except ImportError as exc:
        raise CliError(f"--app {spec!r}: importing {module_name!r} failed: {exc}", EXIT_UNKNOWN_APP) from None
    obj: Any = module
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise CliError(f"--app {spec!r}: module {module_name!r} has no attribute {attr_path!r}", EXIT_UNKNOWN_APP)
        obj = getattr(obj, part)
    if not isinstance(obj, pgjobs.App):
        raise CliError(f"--app {spec!r}: {attr_path!r} is a {type(obj).__name__}, not a pgjobs.App", EXIT_UNKNOWN_APP)
    return obj


def worker_queues(queues: dict[str, int | None] | None, concurrency: int) -> dict[str, int]:
    if not queues:
        return {"default": concurrency}
    return {name: size if size is not None else concurrency for name, size in queues.items()}


def cmd_worker(args: argparse.Namespace) -> int:
    import pgjobs

    app = load_app(args.app)
    queues = worker_queues(args.queues, args.concurrency)
    worker = pgjobs.Worker(
        app,
        args.dsn,
        queues=queues,
        lease=args.lease,
        grace_period=args.grace_period,
        poll_interval=args.poll_interval,
        name=args.name,
        scheduler=not args.no_scheduler,
    )
    err = Console(stderr=True, highlight=False, width=stdout().width)
    where = args.target.describe() if args.target is not None else dsnmod.redact(args.dsn)
    err.print(
        f"pgjobs worker {worker.name}: app {args.app} ({len(app.handlers)} kinds), queues "
        f"{', '.join(f'{q}={n}' for q, n in queues.items())}, on {where}. Ctrl-C or SIGTERM stops it "
        f"gracefully ({args.grace_period:g} s grace)."
    )
    worker.run_sync()
    return EXIT_OK


# ---------------------------------------------------------------------------------------------------------
# enqueue, status, stats, jobs, cancel, retry, purge


def cmd_enqueue(args: argparse.Namespace) -> int:
    with open_client(args.dsn) as client:
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
        )
    if args.json:
        print_json(job)
    elif job.created:
        stdout().print(f"job {job.id} created, state {job.state.value}")
    else:
        stdout().print(f"job {job.id} already exists (unique key {args.unique_key!r}), state {job.state.value}")
    return EXIT_OK


def _job_table(job: JobStatus) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    now = datetime.now(UTC)

    def row(name: str, value: Any) -> None:
        if value not in (None, "", [], {}):
            table.add_row(name, value if isinstance(value, str) else json.dumps(to_jsonable(value)))

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
    row("result", job.result)
    row("last error", short(job.last_error, 200))
    if len(job.errors) > 1:
        row("errors", f"{len(job.errors)} failed attempts")
    return table


def _job_line(job: JobStatus) -> str:
    text = f"{datetime.now():%H:%M:%S}  job {job.id} {job.kind}: {job.state.value}"
    text += f", attempt {job.attempt}/{job.max_attempts}"
    if job.progress is not None:
        text += f", progress {describe_progress(job.progress)}"
    if job.state in (JobState.SCHEDULED, JobState.PENDING) and job.last_error:
        text += f", last error: {short(job.last_error, 80)}"
    if job.state == JobState.FAILED and job.last_error:
        text += f": {short(job.last_error, 120)}"
    return text


def _terminal_code(job: JobStatus) -> int:
    return EXIT_OK if job.state == JobState.SUCCEEDED else EXIT_ERROR


def cmd_status(args: argparse.Namespace) -> int:
    with open_client(args.dsn) as client:
        job = client.job_status(args.id)
    if job is None:
        raise CliError(f"job {args.id} not found")
    if not args.follow:
        if args.json:
            print_json(job)
        else:
            stdout().print(_job_table(job))
        return EXIT_OK
    if job.state.terminal:
        if args.json:
            print_json(job)
        else:
            stdout().print(_job_line(job))
        return _terminal_code(job)
    import anyio

    return anyio.run(_follow, args.dsn, args.id, args.json)


async def _follow(dsn: str, job_id: int, as_json: bool) -> int:
    """Streams one job's status until it is terminal: status events wake us, the durable row is the truth.

    A missed notification costs at most ``poll`` seconds: the row is re-read on every event and on a timer.
    """
    import anyio
    from rich.live import Live

    from pgjobs.client import AsyncClient

    poll = 1.0
    out = stdout()
    async with AsyncClient(dsn, min_size=1, max_size=3) as client:
        send, receive = anyio.create_memory_object_stream[object](max_buffer_size=1000)

        async def pump() -> None:
            async with send:
                async for event in client.subscribe(job_ids=[job_id]):  # ends by itself once the job is terminal
                    await send.send(event)

        async with anyio.create_task_group() as tg:
            tg.start_soon(pump)
            job: JobStatus | None = await client.job_status(job_id)
            last = ""
            live = Live(console=out, auto_refresh=False, transient=False) if out.is_terminal and not as_json else None
            with live if live is not None else contextlib.nullcontext():
                while job is not None:
                    if live is not None:
                        live.update(_job_table(job), refresh=True)
                    elif not as_json:
                        line = _job_line(job)
                        key = line.split("  ", 1)[1]
                        if key != last:
                            out.print(line)
                            last = key
                    if job.state.terminal:
                        break
                    with anyio.move_on_after(poll):
                        try:
                            await receive.receive()
                            with contextlib.suppress(anyio.WouldBlock):
                                while True:  # coalesce a burst of events into one re-read
                                    receive.receive_nowait()
                        except anyio.EndOfStream:  # the stream saw the job end (or stopped): poll until we do
                            await anyio.sleep(poll)
                    job = await client.job_status(job_id)
            tg.cancel_scope.cancel()
    if job is None:
        raise CliError(f"job {job_id} was deleted while it was followed")
    if as_json:
        print_json(job)
    return _terminal_code(job)


def cmd_stats(args: argparse.Namespace) -> int:
    with open_client(args.dsn) as client:
        stats = client.stats()
        workers = client.list_workers()
    if args.json:
        print_json({"queues": stats, "workers": workers})
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
    wt = Table(title="workers", title_justify="left")
    for col in ("worker", "last seen", "running", "queues", "host", "pid"):
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


def cmd_jobs(args: argparse.Namespace) -> int:
    with open_client(args.dsn) as client:
        jobs = client.list_jobs(args.state, args.queue, args.kind, args.search, args.limit, args.offset)
    if args.json:
        print_json(jobs)
        return EXIT_OK
    if not jobs:
        stdout().print("no jobs")
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
            short(j.last_error, 50),
        )
    stdout().print(table)
    return EXIT_OK


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


# ---------------------------------------------------------------------------------------------------------
# demo, bench


def cmd_demo(args: argparse.Namespace) -> int:
    from pgjobs.cli import demo

    return demo.run(args)


def cmd_bench(args: argparse.Namespace) -> int:
    return _bench(args.bench_args)


def _bench(argv: list[str]) -> int:
    try:
        from bench.__main__ import main as bench_main
    except ImportError as exc:
        raise CliError(f"the benchmarks are not installed ({exc}); run them from a source checkout") from None
    return int(bench_main(argv) or 0)


# ---------------------------------------------------------------------------------------------------------
# the parser


def _add_common(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument(
        "--dsn",
        default=default,
        help="PostgreSQL DSN or URI (default: $PGJOBS_DSN, else $DATABASE_URL, else the embedded server)",
    )
    parser.add_argument(
        "--data-dir",
        default=default,
        help="data directory of the embedded server (default: $PGJOBS_DATA_DIR, else a per-user directory)",
    )


class CommandParser(argparse.ArgumentParser):
    """Every subcommand's parser: ``--dsn`` and ``--data-dir`` are also accepted after the command name.

    ``argparse.SUPPRESS`` as default keeps a subcommand from overwriting the value given before it.
    Subcommands added by other modules (``register(subparsers)``) get the same options for free.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _add_common(self, argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgjobs",
        description="Durable background jobs inside PostgreSQL.",
        epilog="Exit codes: 0 ok, 1 refused/failed, 2 bad arguments or database unreachable, "
        "3 schema not migrated, 4 unknown --app, 130 interrupted.",
    )
    _add_common(parser, None)
    parser.add_argument("--version", action="version", version=f"pgjobs {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)

    p = sub.add_parser("migrate", help="apply the schema and install the SQL functions (idempotent)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--rollback", action="store_true", help="revert deployed changes (deletes their data)")
    mode.add_argument("--verify", action="store_true", help="run the verify script of every deployed change")
    mode.add_argument("--status", action="store_true", help="show which changes are deployed")
    p.add_argument("--to", metavar="CHANGE", help="with --rollback: revert only the changes after CHANGE")
    p.add_argument("--yes", "-y", action="store_true", help="with --rollback: do not ask for confirmation")
    p.set_defaults(func=cmd_migrate, _needs=NEEDS_SERVER)

    p = sub.add_parser("worker", help="run a worker for the jobs of an App")
    p.add_argument("--app", required=True, metavar="MODULE:ATTR", help="the pgjobs.App, e.g. myproject.jobs:app")
    p.add_argument(
        "--queues",
        type=parse_queues,
        metavar="Q=N,...",
        help="queues and their concurrency, e.g. default=10,emails=5 (default: default=CONCURRENCY)",
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
    p.set_defaults(func=cmd_worker, _needs=NEEDS_SCHEMA)

    p = sub.add_parser("enqueue", help="enqueue one job")
    p.add_argument("kind")
    p.add_argument("--payload", type=parse_json, default={}, metavar="JSON", help="job payload ({})")
    p.add_argument("--queue", default="default")
    p.add_argument("--run-at", type=parse_when, metavar="WHEN", help="ISO 8601 time, or a delay like 30s, 5m, 2h")
    p.add_argument("--priority", type=int, default=0, help="lower runs first (0)")
    p.add_argument("--unique-key", metavar="KEY", help="idempotency key: a second enqueue returns the first job")
    p.add_argument("--unique-live-only", action="store_true", help="the key only blocks while its job is not terminal")
    p.add_argument("--max-attempts", type=positive_int, default=20, metavar="N")
    p.add_argument("--group-key", metavar="GROUP", help="fairness group (tenant, customer ...)")
    p.add_argument("--meta", type=parse_json, default=None, metavar="JSON", help="caller tags, trace context")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_enqueue, _needs=NEEDS_SCHEMA)

    p = sub.add_parser("status", help="show one job; --follow streams it until it is done")
    p.add_argument("id", type=int)
    p.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="stream status changes until the job is terminal; exit 0 if it succeeded, 1 if not",
    )
    p.add_argument("--json", action="store_true", help="print the job as JSON")
    p.set_defaults(func=cmd_status, _needs=NEEDS_SCHEMA)

    p = sub.add_parser("stats", help="jobs by queue and state, and the live workers")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_stats, _needs=NEEDS_SCHEMA)

    p = sub.add_parser("jobs", help="list jobs, newest first")
    p.add_argument("--state", choices=STATES)
    p.add_argument("--queue")
    p.add_argument("--kind")
    p.add_argument("--search", help="substring of the kind or unique key (case-insensitive)")
    p.add_argument("--limit", type=positive_int, default=50)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--json", action="store_true")
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

    p = sub.add_parser(
        "demo",
        help="a showcase on the embedded PostgreSQL (or --dsn): jobs, retries, a resumed checkpoint, live progress",
    )
    p.add_argument("--no-worker", action="store_true", help="only enqueue and watch (a separate worker runs the jobs)")
    p.add_argument("--concurrency", type=positive_int, default=20, help="the in-process worker's concurrency (20)")
    p.add_argument("--timeout", type=non_negative_float, default=60.0, metavar="S", help="give up after S seconds (60)")
    p.add_argument("--plain", action="store_true", help="plain log lines instead of the live display")
    p.set_defaults(func=cmd_demo, _needs=NEEDS_NOTHING)

    p = sub.add_parser("bench", help="run the benchmarks (arguments go to python -m bench)", add_help=False)
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_bench, _needs=NEEDS_NOTHING)

    for register in _plugins():
        register(sub)
    return parser


def _plugins() -> list[Callable[[Any], None]]:
    """``register(subparsers)`` of the queue and schedule commands (imported here: they import this module)."""
    from pgjobs.cli import schedules as cli_schedules
    from pgjobs.web import server as web

    found: list[Callable[[Any], None]] = []
    try:  # the fairness engineer's `pgjobs queue ...`, while it is not there yet
        from pgjobs.cli import queue as cli_queue  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        pass
    else:
        found.append(cli_queue.register)
    found.append(cli_schedules.register)
    found.append(web.register)
    return found


def _global_split(argv: Sequence[str]) -> tuple[list[str], str | None, list[str]]:
    """Splits ``argv`` at the command: (global options, command, the rest)."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--dsn", "--data-dir"):
            i += 2
            continue
        if arg.startswith(("--dsn=", "--data-dir=")):
            i += 1
            continue
        if arg.startswith("-"):
            return list(argv), None, []
        return list(argv[:i]), arg, list(argv[i + 1 :])
    return list(argv), None, []


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(args_list)
    except CliError as exc:
        _error(str(exc))
        return exc.code
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_INTERRUPTED
    except SystemExit as exc:  # argparse: --help (0), bad arguments (2); SIGTERM with the embedded server (143)
        return exc.code if isinstance(exc.code, int) else EXIT_OK if exc.code is None else EXIT_ERROR


def _error(message: str) -> None:
    print(f"pgjobs: {one_line(message)}", file=sys.stderr)


def _main(argv: list[str]) -> int:
    before, command, rest = _global_split(argv)
    if command == "bench":
        # everything after `bench` is the benchmark's own, `--help` included
        global_only = argparse.ArgumentParser(prog="pgjobs")
        _add_common(global_only, None)
        parsed = global_only.parse_args(before)
        found = dsnmod.configured(parsed.dsn)
        if found is not None:
            os.environ[dsnmod.ENV_DSN] = found[0]
        return _bench(rest)

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if getattr(args, "to", None) and not getattr(args, "rollback", False):
        parser.error("--to needs --rollback")
    if args.command == "purge" and args.succeeded_before is None and args.failed_before is None:
        parser.error("purge needs --succeeded-before and/or --failed-before")
    needs = getattr(args, "_needs", NEEDS_SCHEMA)
    func: Callable[[argparse.Namespace], int] = args.func
    if needs == NEEDS_NOTHING:
        args.target = None
        args.uses_embedded = False
        args.where = None
        return func(args)
    try:
        with dsnmod.resolve(args.dsn, args.data_dir) as target:
            args.target = target
            args.dsn = target.dsn
            args.uses_embedded = target.uses_embedded
            args.where = target.describe() if target.uses_embedded else None
            check_database(target.dsn, needs == NEEDS_SCHEMA, args.where)
            return _run(func, args)
    except dsnmod.DsnError as exc:
        raise CliError(str(exc), EXIT_UNREACHABLE) from None


def _run(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return func(args)
    except Exception as exc:
        mapped = _expected(_only_leaf(exc), args)
        if mapped is None:
            raise
        raise mapped from None


def _only_leaf(exc: BaseException) -> BaseException:
    """The one exception inside (nested) exception groups, as anyio task groups raise them; else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _expected(exc: BaseException, args: argparse.Namespace) -> CliError | None:
    """The one-line error for a failure a user can expect, or None for a bug (its traceback is shown)."""
    if isinstance(exc, CliError):
        return exc
    if isinstance(exc, SchemaMissing):
        return not_migrated(args.dsn, dsnmod.first_line(str(exc)), args.where)
    if isinstance(exc, PgJobsError):
        return CliError(str(exc), EXIT_ERROR)
    if isinstance(exc, psycopg.OperationalError | PoolTimeout):
        return unreachable(args.dsn, exc, args.where)
    if isinstance(
        exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedFunction | psycopg.errors.UndefinedColumn
    ):
        # an object the installed pgjobs lacks: the schema is older (or newer) than this package's
        with contextlib.suppress(psycopg.Error):
            if _functions_state(args.dsn, _sql_digest()) != "up to date":
                return not_migrated(args.dsn, f"it is out of date: {dsnmod.first_line(str(exc))}", args.where)
        return None
    if isinstance(exc, psycopg.Error) and not os.environ.get("PGJOBS_DEBUG"):
        state = f" [{exc.sqlstate}]" if exc.sqlstate else ""
        return CliError(f"database error{state}: {dsnmod.first_line(str(exc))} (PGJOBS_DEBUG=1 shows the traceback)")
    return None


def _sql_digest() -> str:
    from pgjobs.ops.migrate import sql_digest

    return sql_digest()


if __name__ == "__main__":
    sys.exit(main())
