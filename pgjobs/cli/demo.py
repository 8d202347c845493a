"""``pgjobs.cli.demo``: the whole system in a few seconds, on a machine with no database.

With no ``--dsn`` (nor ``PGJOBS_DSN``/``DATABASE_URL``) it starts the embedded PostgreSQL, creates a
fresh database ``pgjobs_demo_<pid>`` on it, migrates it, enqueues the showcase of :mod:`pgjobs.cli.demo_app`
(about 300 jobs: quick ones, flaky ones that are retried, some that fail for good, a long report that
crashes half way and resumes from its checkpoint, an import that reports progress), runs a worker in
this process, draws the live progress, prints a summary, drops the database and stops the server.
Ctrl-C and SIGTERM stop the worker, drop the database and stop the server too.

With a DSN it uses that database as it is (migrating it if needed) and creates nothing else: the jobs go
to the queue ``pgjobs.cli.demo`` and stay there. ``--no-worker`` only enqueues and watches, for a worker
that runs elsewhere (``pgjobs worker --app pgjobs.cli.demo_app:app --queues pgjobs-demo=20``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import anyio
import psycopg
from psycopg import sql
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from pgjobs.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    CliError,
    check_database,
    describe_progress,
    progress_fraction,
    short,
    stdout,
)
from pgjobs.ops import dsn as dsnmod
from pgjobs.records import JobState

DEMO_DATABASE = "pgjobs_demo"
EXIT_SIGTERM = 143
REFRESH = 0.1  # seconds between two snapshots of the jobs
SETTLED = ("succeeded", "failed", "cancelled")
STATE_STYLE = {
    "waiting": "dim",
    "scheduled": "yellow",
    "pending": "cyan",
    "active": "bold blue",
    "succeeded": "green",
    "failed": "bold red",
    "cancelled": "magenta",
}


class Interrupted(Exception):
    """The demo was stopped (Ctrl-C, SIGTERM, or its worker was stopped from outside)."""


# ---------------------------------------------------------------------------------------------------------
# signals


class _Signals:
    """Ctrl-C and SIGTERM stop the demo the same way, whatever state it is in.

    While the server starts and while the demo cleans up (dropping its database, stopping the server), a
    signal is only noted: cutting either short could leave a server running. In between (``armed``), a
    signal raises KeyboardInterrupt, except while the event loop runs: there the first one cancels the
    demo's main task (``call_soon_threadsafe`` from the handler), so the worker stops, its jobs are
    released and every ``finally`` runs; a second one raises KeyboardInterrupt at once. A SIGINT that the
    parent ignores (``nohup``, ``&`` in a script) stays ignored.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self.interrupt: Callable[[], object] | None = None  # set while the event loop runs
        self._saved: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._saved[sig] = signal.getsignal(sig)
        self._install(self._note)
        return self

    def _install(self, handler: Callable[[int, FrameType | None], None]) -> None:
        for sig, previous in self._saved.items():
            if previous is not signal.SIG_IGN:
                signal.signal(sig, handler)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.received = self.received or signum

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        first = self.received is None
        self.received = self.received or signum
        if first and self.interrupt is not None:
            self.interrupt()
            return
        raise KeyboardInterrupt

    def arm(self) -> None:
        """From now on a signal interrupts; one that came while disarmed interrupts now."""
        self._install(self._on_signal)
        if self.received is not None:
            raise KeyboardInterrupt

    def disarm(self) -> None:
        self.interrupt = None
        self._install(self._note)

    def bind(self) -> None:
        """Called on the event loop: the first signal cancels the task that called it."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self.interrupt = lambda: loop.call_soon_threadsafe(task.cancel)

    def __exit__(self, *exc: object) -> None:
        self.interrupt = None
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)

    @property
    def exit_code(self) -> int:
        return EXIT_SIGTERM if self.received == signal.SIGTERM else EXIT_INTERRUPTED


# ---------------------------------------------------------------------------------------------------------
# what the display and the summary read


@dataclass
class Tracked:
    id: int
    kind: str
    state: str = "pending"
    attempt: int = 0
    progress: Any = None
    checkpoint: Any = None


@dataclass
class Snapshot:
    total: int
    by_state: dict[str, int]
    tracked: dict[int, Tracked]
    elapsed: float

    @property
    def settled(self) -> int:
        return sum(self.by_state.get(s, 0) for s in SETTLED)

    @property
    def done(self) -> bool:
        return self.settled >= self.total


@dataclass
class Run:
    """What one demo run did, for the summary."""

    target: str
    showcase: Any = None
    started: float = field(default_factory=time.perf_counter)
    snapshot: Snapshot | None = None
    events: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=7))
    event_count: int = 0
    finished: bool = False


async def _snapshot(conn: psycopg.AsyncConnection[Any], run: Run) -> Snapshot:
    show = run.showcase
    cur = await conn.execute(
        "SELECT state::text, count(*)::int FROM pgjobs.jobs WHERE id = ANY(%(ids)s) GROUP BY state",
        {"ids": show.ids},
    )
    by_state = {state: n for state, n in await cur.fetchall()}
    cur = await conn.execute(
        "SELECT id, kind, state::text, attempt, progress, checkpoint FROM pgjobs.jobs WHERE id = ANY(%(ids)s)",
        {"ids": [show.report_id, show.import_id]},
    )
    tracked = {row[0]: Tracked(*row) for row in await cur.fetchall()}
    return Snapshot(len(show.ids), by_state, tracked, time.perf_counter() - run.started)


# ---------------------------------------------------------------------------------------------------------
# the live display


def _bar(fraction: float, width: int = 32) -> ProgressBar:
    return ProgressBar(total=1000, completed=int(fraction * 1000), width=width)


def _render(run: Run, snap: Snapshot) -> Group:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(justify="right", style="bold")
    grid.add_column()
    grid.add_column()
    grid.add_row(
        "all jobs",
        _bar(snap.settled / max(snap.total, 1)),
        Text(f"{snap.settled}/{snap.total} settled  {snap.elapsed:4.1f} s"),
    )
    for tracked in snap.tracked.values():
        fraction = progress_fraction(tracked.progress) or (1.0 if tracked.state == "succeeded" else 0.0)
        label = tracked.kind.removeprefix("demo.")
        detail = f"{tracked.state}, attempt {tracked.attempt}"
        if tracked.progress is not None:
            detail += f", {describe_progress(tracked.progress)}"
        grid.add_row(label, _bar(fraction), Text(detail, style=STATE_STYLE.get(tracked.state, "")))
    states = Text("  ")
    for state in JobState:
        n = snap.by_state.get(state.value, 0)
        if n or state.value in ("pending", "active", "succeeded"):
            states.append(f"{state.value} {n}   ", style=STATE_STYLE.get(state.value, ""))
    parts: list[Any] = [grid, states]
    if run.events:
        parts.append(Text("status stream:", style="bold"))
        parts.extend(Text(f"  {line}", style="dim") for line in run.events)
    return Group(*parts)


def _plain_line(snap: Snapshot) -> str:
    states = ", ".join(f"{s} {snap.by_state[s]}" for s in (st.value for st in JobState) if snap.by_state.get(s))
    tracked = "; ".join(
        f"{t.kind.removeprefix('demo.')} {t.state} {describe_progress(t.progress)}".rstrip()
        for t in snap.tracked.values()
    )
    return f"[{snap.elapsed:5.1f} s] {snap.settled}/{snap.total} settled ({states}); {tracked}"


# ---------------------------------------------------------------------------------------------------------
# the run


async def _status_feed(dsn: str, run: Run, console: Console | None) -> None:
    """Follows the report, the import and the card charges through the status stream (for display only)."""
    import pgjobs

    show = run.showcase
    kinds = ["demo.nightly_report", "demo.import_csv", "demo.charge_card"]
    last: dict[int, tuple[str, int]] = {}
    try:
        async with pgjobs.AsyncClient(dsn, min_size=1, max_size=2) as client:
            async for ev in client.subscribe(queue=show.queue, kinds=kinds):
                key = (str(ev.state), int(ev.attempt))
                if last.get(ev.id) == key:
                    continue  # a progress report: the bars show those
                last[ev.id] = key
                run.event_count += 1
                at = time.perf_counter() - run.started
                line = f"{at:4.1f} s  job {ev.id} {ev.kind}: {ev.state} (attempt {ev.attempt})"
                run.events.append(line)
                if console is not None:
                    console.print(f"  status: {line}")
    except Exception as exc:  # the stream is decoration here: the demo goes on without it
        run.events.append(f"(status stream stopped: {short(str(exc), 80)})")


async def _watch(dsn: str, run: Run, console: Console, plain: bool, worker: Any, worker_done: anyio.Event) -> Snapshot:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        snap = await _snapshot(conn, run)
        if plain:
            last_print = 0.0
            while not snap.done:
                if worker is not None and worker_done.is_set():
                    raise Interrupted("the worker stopped")
                if snap.elapsed - last_print >= 1.0:
                    console.print(_plain_line(snap))
                    last_print = snap.elapsed
                await anyio.sleep(REFRESH)
                snap = await _snapshot(conn, run)
            console.print(_plain_line(snap))
            return snap
        with Live(_render(run, snap), console=console, refresh_per_second=12, transient=False) as live:
            while not snap.done:
                if worker is not None and worker_done.is_set():
                    raise Interrupted("the worker stopped")
                await anyio.sleep(REFRESH)
                snap = await _snapshot(conn, run)
                live.update(_render(run, snap))
        return snap


async def _run_async(
    dsn: str, run: Run, args: argparse.Namespace, console: Console, plain: bool, signals: _Signals
) -> None:
    import pgjobs

    signals.bind()

    from pgjobs.cli import demo_app

    async with pgjobs.AsyncClient(dsn, min_size=1, max_size=2) as client:
        t0 = time.perf_counter()
        run.showcase = await demo_app.enqueue_showcase(client)
        kinds = ", ".join(f"{n} {k.removeprefix('demo.')}" for k, n in run.showcase.kinds.items())
        ms = (time.perf_counter() - t0) * 1000
        console.print(f"enqueued {len(run.showcase.ids)} jobs in one enqueue_many call ({ms:.0f} ms): {kinds}")
    worker: Any = None
    if not args.no_worker:
        worker = pgjobs.Worker(
            demo_app.app,
            dsn,
            queues={demo_app.QUEUE: args.concurrency},
            lease=10.0,
            grace_period=1.0,
            # retries come back within a second or two; a short fallback beat keeps the demo brisk even
            # where no notification announces them
            poll_interval=0.5,
            name=f"pgjobs-demo-{os.getpid()}",
            scheduler=False,
        )
        console.print(f"worker: {args.concurrency} jobs at once on queue {demo_app.QUEUE!r}, in this process")
    else:
        console.print(f"waiting for a worker on queue {demo_app.QUEUE!r} (pgjobs worker --app pgjobs.cli.demo_app:app)")
    worker_done = anyio.Event()

    async def run_worker() -> None:
        try:
            await worker.run()
        finally:
            worker_done.set()

    outcome: BaseException | None = None
    async with anyio.create_task_group() as tg:
        if worker is not None:
            tg.start_soon(run_worker)
        feed = anyio.CancelScope()

        async def feed_task() -> None:
            with feed:
                await _status_feed(dsn, run, console if plain else None)

        tg.start_soon(feed_task)
        try:
            with anyio.fail_after(args.timeout):
                run.snapshot = await _watch(dsn, run, console, plain, worker, worker_done)
            run.finished = True
        except (TimeoutError, Interrupted) as exc:  # raised below, outside the task group (no ExceptionGroup)
            outcome = exc
        finally:
            feed.cancel()
            if worker is not None:
                worker.stop()
                with anyio.move_on_after(10, shield=True):
                    await worker_done.wait()
    if isinstance(outcome, TimeoutError):
        raise CliError(f"the demo did not finish within {args.timeout:g} s (--timeout)", EXIT_ERROR)
    if outcome is not None:
        raise outcome


def _summary(dsn: str, run: Run, console: Console) -> None:
    show = run.showcase
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT kind, state::text, count(*)::int, sum(attempt)::int, sum(jsonb_array_length(errors))::int"
            " FROM pgjobs.jobs WHERE id = ANY(%(ids)s) GROUP BY kind, state ORDER BY kind, state",
            {"ids": show.ids},
        ).fetchall()
        span = conn.execute(
            "SELECT extract(epoch FROM max(completed_at) - min(created_at))::float8,"
            " count(*) FILTER (WHERE attempt > 1)::int"
            " FROM pgjobs.jobs WHERE id = ANY(%(ids)s) AND first_started_at IS NOT NULL",
            {"ids": show.ids},
        ).fetchone()
        report = conn.execute(
            "SELECT state::text, attempt, checkpoint, errors, result FROM pgjobs.jobs WHERE id = %s", (show.report_id,)
        ).fetchone()
        failed = conn.execute(
            "SELECT kind, last_error FROM pgjobs.jobs WHERE id = ANY(%(ids)s) AND state = 'failed' ORDER BY id LIMIT 1",
            {"ids": show.ids},
        ).fetchone()

    kinds: dict[str, dict[str, int]] = {}
    totals: dict[str, int] = collections.Counter()
    attempts = errors = 0
    for kind, state, n, att, errs in rows:
        k = kinds.setdefault(kind, collections.Counter())
        k[state] += n
        k["attempts"] += att
        k["errors"] += errs
        totals[state] += n
        attempts += att
        errors += errs
    table = Table(title="summary", title_justify="left")
    table.add_column("kind")
    for col in ("jobs", "succeeded", "failed", "cancelled", "attempts", "errors"):
        table.add_column(col, justify="right")
    for kind, k in kinds.items():
        jobs = sum(k[s] for s in (st.value for st in JobState))
        table.add_row(
            kind,
            str(jobs),
            str(k["succeeded"]),
            str(k["failed"]),
            str(k["cancelled"]),
            str(k["attempts"]),
            str(k["errors"]),
        )
    table.add_row(
        "[bold]all[/]",
        str(len(show.ids)),
        str(totals["succeeded"]),
        str(totals["failed"]),
        str(totals["cancelled"]),
        str(attempts),
        str(errors),
        style="bold",
    )
    console.print(table)
    seconds, retried = span if span is not None else (None, 0)
    ran = len(show.ids) - totals["cancelled"]
    if seconds:
        console.print(
            f"{ran} jobs ran in {seconds:.1f} s, first enqueue to last completion: {ran / seconds:.0f} jobs/s with "
            f"{attempts} attempts. The handlers sleep on purpose and retries wait for their backoff; "
            "`pgjobs bench` measures raw throughput."
        )
    console.print(
        f"{retried} jobs needed more than one attempt; {errors} errors are kept in their jobs' history "
        f"(`pgjobs status ID`). {totals['failed']} jobs failed for good"
        + (f", e.g. {failed[0]}: {short(_last_line(failed[1]), 90)}" if failed else "")
        + f". {totals['cancelled']} job scheduled an hour ahead was cancelled before it ran."
    )
    if run.event_count:
        console.print(
            f"the status stream (LISTEN pgjobs_status) delivered {run.event_count} transitions of the report, the "
            "import and the card charges; any process can follow a job the same way: pgjobs status ID --follow"
        )
    if report is not None:
        _report_story(console, show.report_id, report)


def _last_line(error: Any) -> str:
    """The exception line of a stored traceback (its last line), without the module path of the class."""
    lines = [x.strip() for x in str(error or "").strip().splitlines() if x.strip()]
    last = lines[-1] if lines else "error"
    name, sep, rest = last.partition(": ")
    return f"{name.rsplit('.', 1)[-1]}{sep}{rest}" if sep and " " not in name else last


def _report_story(console: Console, job_id: int, report: tuple[Any, ...]) -> None:
    state, attempt, checkpoint, errors, _result = report
    runs = checkpoint.get("runs", []) if isinstance(checkpoint, dict) else []
    console.print(f"[bold]checkpoint story[/] of job {job_id} demo.nightly_report ({state} after {attempt} attempts):")
    crash_errors = {e.get("attempt"): e.get("error", "") for e in errors or [] if isinstance(e, dict)}
    seen: list[int] = []
    for i, r in enumerate(runs):
        first, last = int(r["first"]), int(r["last"])
        span = f"chunks {first}-{last}" if last >= first else "no chunk"
        how = "started from the beginning" if i == 0 else f"resumed from its checkpoint at chunk {first}"
        line = f"  attempt {r['attempt']}: {how}, ran {span}"
        if r.get("crashed"):
            line += f", then crashed ({short(_last_line(crash_errors.get(r['attempt'])), 100)})"
        console.print(line)
        seen.extend(range(first, last + 1))
    if runs:
        once = len(seen) == len(set(seen))
        console.print(
            "  every chunk ran exactly once: the work done before the crash was not redone"
            if once
            else "  [yellow]some chunks ran twice[/] (a crash between a chunk and its checkpoint)"
        )


# ---------------------------------------------------------------------------------------------------------
# entry point


def _demo_database() -> str:
    """This run's database: one per process, so two demos on one embedded server never collide."""
    return f"{DEMO_DATABASE}_{os.getpid()}"


def _create_database(admin_dsn: str) -> str:
    """Creates this run's database, after dropping those left by demos that were killed (their pid is gone)."""
    name = _demo_database()
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = %s OR datname ~ %s",
            [DEMO_DATABASE, f"^{DEMO_DATABASE}_[0-9]+$"],
        ).fetchall()
        for (stale,) in rows:
            pid = stale.rpartition("_")[2]
            if stale == name or not pid.isdigit() or not _pid_alive(int(pid)):
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(stale)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return dsnmod.with_database(admin_dsn, name)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _drop_database(admin_dsn: str) -> None:
    with contextlib.suppress(psycopg.Error), psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(_demo_database())))


def run(args: argparse.Namespace) -> int:
    console = stdout()
    plain = bool(args.plain) or not console.is_terminal
    # the handlers fail on purpose: the worker's warnings about it would scribble over the display
    quiet = logging.getLogger("pgjobs")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return _run(args, console, plain)
    finally:
        quiet.setLevel(level)


def _run(args: argparse.Namespace, console: Console, plain: bool) -> int:
    from pgjobs.ops.migrate import migrate

    with _Signals() as signals:
        try:
            if args.no_worker and dsnmod.configured(args.dsn) is None:
                raise CliError("--no-worker needs a database that a worker elsewhere can reach: give --dsn", 2)
            t0 = time.perf_counter()
            with dsnmod.resolve(args.dsn, args.data_dir) as target:
                try:
                    signals.arm()
                    if target.uses_embedded:
                        demo_dsn = _create_database(target.dsn)
                        where = f"embedded PostgreSQL in {target.data_dir}, fresh database {_demo_database()!r}"
                    else:
                        check_database(target.dsn, need_schema=False)
                        demo_dsn = target.dsn
                        where = target.describe()
                    version = _server_version(demo_dsn)
                    migrated = migrate(demo_dsn)
                    console.print(
                        f"[bold]pgjobs demo[/] on PostgreSQL {version} ({where}); ready in "
                        f"{time.perf_counter() - t0:.1f} s"
                        + (", schema installed" if migrated.applied else "")
                    )
                    demo = Run(target.describe())
                    anyio.run(_run_async, demo_dsn, demo, args, console, plain, signals)
                    _summary(demo_dsn, demo, console)
                    if not target.uses_embedded:
                        console.print("the jobs stay in queue 'pgjobs-demo': pgjobs jobs --queue pgjobs-demo")
                finally:
                    signals.disarm()  # until the server is stopped
                    if target.uses_embedded:
                        _drop_database(target.dsn)
            # the embedded server is stopped here (when no other process uses it)
            if signals.received:
                raise KeyboardInterrupt
            console.print(
                f"done in {time.perf_counter() - t0:.1f} s" + (", server stopped" if target.uses_embedded else "")
            )
            return EXIT_OK
        except (KeyboardInterrupt, asyncio.CancelledError, Interrupted):
            console.print("[yellow]demo interrupted[/]; the worker is stopped and the server with it")
            return signals.exit_code
        except dsnmod.DsnError as exc:
            raise CliError(str(exc), EXIT_UNREACHABLE) from None
        except psycopg.OperationalError as exc:
            raise CliError(f"the database went away: {dsnmod.first_line(str(exc))}", EXIT_UNREACHABLE) from None


def _server_version(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('server_version')").fetchone()
    return str(row[0]).split()[0] if row else "?"
