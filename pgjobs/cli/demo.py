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
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import anyio
import psycopg
from rich.console import Console
from rich.live import Live

from pgjobs.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    CliError,
    check_database,
    short,
    stdout,
)
from pgjobs.cli.demo_view import Run, Snapshot, plain_line, read_snapshot, render, summary
from pgjobs.ops import dsn as dsnmod
from pgjobs.ops import probe, scratch

DEMO_DATABASE = "pgjobs_demo"
EXIT_SIGTERM = 143
REFRESH = 0.1  # seconds between two snapshots of the jobs


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
        snap = await read_snapshot(conn, run)
        if plain:
            last_print = 0.0
            while not snap.done:
                if worker is not None and worker_done.is_set():
                    raise Interrupted("the worker stopped")
                if snap.elapsed - last_print >= 1.0:
                    console.print(plain_line(snap))
                    last_print = snap.elapsed
                await anyio.sleep(REFRESH)
                snap = await read_snapshot(conn, run)
            console.print(plain_line(snap))
            return snap
        with Live(render(run, snap), console=console, refresh_per_second=12, transient=False) as live:
            while not snap.done:
                if worker is not None and worker_done.is_set():
                    raise Interrupted("the worker stopped")
                await anyio.sleep(REFRESH)
                snap = await read_snapshot(conn, run)
                live.update(render(run, snap))
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


# ---------------------------------------------------------------------------------------------------------
# entry point


def _demo_database() -> str:
    """This run's database: one per process, so two demos on one embedded server never collide."""
    return f"{DEMO_DATABASE}_{os.getpid()}"


def _create_database(admin_dsn: str) -> str:
    """Creates this run's database, after dropping those left by demos that were killed (their pid is gone)."""
    name = _demo_database()
    for stale in probe.databases_named(admin_dsn, DEMO_DATABASE, f"^{DEMO_DATABASE}_[0-9]+$"):
        pid = stale.rpartition("_")[2]
        if stale == name or not pid.isdigit() or not _pid_alive(int(pid)):
            scratch.drop(admin_dsn, stale)
    probe.create_database(admin_dsn, name)
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
    with contextlib.suppress(psycopg.Error):
        scratch.drop(admin_dsn, _demo_database())


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
                    version = probe.server_version(demo_dsn)
                    migrated = migrate(demo_dsn)
                    console.print(
                        f"[bold]pgjobs demo[/] on PostgreSQL {version} ({where}); ready in "
                        f"{time.perf_counter() - t0:.1f} s" + (", schema installed" if migrated.applied else "")
                    )
                    demo = Run(target.describe())
                    anyio.run(_run_async, demo_dsn, demo, args, console, plain, signals)
                    summary(demo_dsn, demo, console)
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
