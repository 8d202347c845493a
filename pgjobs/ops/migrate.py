"""Schema migrations and the installation of the SQL functions.

One source of SQL, two tools: ``migrations/`` is a sqitch project (``sqitch.plan`` with
``deploy/``, ``revert/`` and ``verify/`` scripts), and this module feeds those very scripts to
yoyo-migrations, which records what is applied in its own tables. After the versioned
migrations, every file of ``sql/`` (functions only, ``CREATE OR REPLACE``) is installed in one
transaction, unless the installed revision already matches (so a second run changes nothing).

Concurrent ``migrate`` calls are safe: the whole run holds a session advisory lock.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict
from yoyo import get_backend
from yoyo.migrations import Migration, MigrationList, StepCollector

from pgjobs.ops import guard
from pgjobs.ops.guard import MigrationRefused as MigrationRefused

ROOT = Path(__file__).resolve().parent.parent.parent


def _locate(dirname: str, packaged: str) -> Path:
    """The repo's top-level directory in a checkout; the copy packaged inside pgjobs/ in a wheel."""
    in_repo = ROOT / dirname
    if in_repo.is_dir():
        return in_repo
    return Path(__file__).resolve().parent.parent / packaged


MIGRATIONS_DIR = _locate("migrations", "_migrations")
SQL_DIR = _locate("sql", "_sql")
# Any constant works; it only has to be the same for every migrating process.
_LOCK_KEY = 0x70676A6F6273  # "pgjobs"
_TXN_LINE = re.compile(r"^\s*(BEGIN|COMMIT)\s*;\s*$", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class Change:
    """One line of ``sqitch.plan``."""

    name: str
    requires: tuple[str, ...]
    note: str

    def script(self, kind: str) -> str:
        return (MIGRATIONS_DIR / kind / f"{self.name}.sql").read_text()


def plan() -> list[Change]:
    """The changes of ``migrations/sqitch.plan``, in deployment order."""
    changes: list[Change] = []
    for raw in (MIGRATIONS_DIR / "sqitch.plan").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("%", "#", "@")):
            continue
        m = re.match(r"^(\S+)\s*(?:\[([^\]]*)\])?.*?(?:#\s*(.*))?$", line)
        if not m:
            continue
        requires = tuple(r for r in (m.group(2) or "").split() if not r.startswith("!"))
        changes.append(Change(m.group(1), requires, (m.group(3) or "").strip()))
    return changes


def _strip_transaction(script: str) -> str:
    # sqitch scripts carry their own BEGIN/COMMIT; under yoyo the transaction is yoyo's.
    return _TXN_LINE.sub("", script)


class _SqitchMigration(Migration):  # type: ignore[misc]
    """A yoyo migration whose steps are a sqitch change's deploy and revert scripts."""

    def __init__(self, change: Change, previous: list[Migration]) -> None:
        super().__init__(change.name, str(MIGRATIONS_DIR / "deploy" / f"{change.name}.sql"), str(MIGRATIONS_DIR))
        self.change = change
        self._previous = previous

    def load(self) -> None:
        if self.loaded:
            return
        deploy = _strip_transaction(self.change.script("deploy"))
        revert = _strip_transaction(self.change.script("revert"))
        collector = StepCollector(migration=self)
        collector.add_step(lambda conn: conn.execute(deploy), lambda conn: conn.execute(revert))
        by_name = {m.id: m for m in self._previous}
        self._depends = {by_name[r] for r in self.change.requires if r in by_name}
        self.use_transactions = True
        self.source = deploy
        self.steps = collector.create_steps(True)


def _yoyo_migrations() -> MigrationList:
    built: list[Migration] = []
    for change in plan():
        built.append(_SqitchMigration(change, list(built)))
    return MigrationList(built)


def yoyo_uri(dsn: str) -> str:
    """A yoyo URI (psycopg 3 driver) for any libpq DSN, URI or key=value, sockets included.

    yoyo's connection runs with ``search_path = pgjobs_migrations`` (``pg_catalog`` is searched first when
    not listed): its tables are created there, and the migration scripts it runs resolve no name in a
    schema another role can create in (``public``)."""
    params: dict[str, Any] = {k: v for k, v in conninfo_to_dict(dsn).items() if v is not None}
    dbname = params.pop("dbname", "postgres")
    params["schema"] = guard.BOOKKEEPING_SCHEMA
    return f"postgresql+psycopg:///{dbname}?{urlencode(params)}"


COMMENTS_FILE = "api_comments.sql"
ROLES_FILE = "roles.sql"
# The tables as a migrated database has them (rendered by pgjobs.ops.schemadoc): documentation, never installed.
SCHEMA_FILE = "schema.sql"
# Run after every function file, in this order: the comments name functions by name alone (so every
# function must exist, stale overloads dropped), then the grants of what the others created.
_LAST_FILES = (COMMENTS_FILE, ROLES_FILE)
# The longest an install waits for the calls that were running at its commit before it drops the internal
# routines the new files no longer define (a call still running then may fail; its transaction rolls back).
DRAIN_SECONDS = 30.0


def sql_files() -> list[Path]:
    """The function files in install order: by name, then ``api_comments.sql`` (the reference text of the
    public functions) and ``roles.sql`` last (it grants what the others created, in the same transaction).
    ``schema.sql`` is not one of them: it shows the tables, it creates nothing."""
    return sorted(
        (f for f in SQL_DIR.glob("*.sql") if f.name != SCHEMA_FILE),
        key=lambda f: (_LAST_FILES.index(f.name) if f.name in _LAST_FILES else -1, f.name),
    )


def sql_digest() -> str:
    h = hashlib.sha256()
    for f in sql_files():
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


@contextmanager
def _migration_lock(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """The migrator's own connection (search path pinned), holding the advisory lock, after the checks of
    :func:`pgjobs.ops.guard.prepare` passed (:class:`~pgjobs.ops.guard.MigrationRefused` otherwise)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        guard.pin_search_path(conn)
        conn.execute("SELECT pg_catalog.pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            guard.prepare(conn)
            yield conn
        finally:
            conn.execute("SELECT pg_catalog.pg_advisory_unlock(%s)", (_LOCK_KEY,))


class PreReleaseDatabase(MigrationRefused):
    """The database records changes this plan does not have: it was migrated by a plan from before the
    first release, whose schema no change of this plan starts from."""

    def __init__(self, unknown: list[str]) -> None:
        self.problems = unknown
        RuntimeError.__init__(
            self,
            "pgjobs migrate refuses to run: this database was migrated by a pre-release plan of pgjobs (changes "
            f"{', '.join(unknown)} are not in this version's plan) and cannot be upgraded; recreate it "
            "(drop the schemas pgjobs and pgjobs_migrations, or use a new database) and migrate again",
        )


def _refuse_unknown_changes(conn: psycopg.Connection[Any]) -> None:
    """Raises :class:`PreReleaseDatabase` when the bookkeeping records a change the plan does not have."""
    if conn.execute("SELECT pg_catalog.to_regclass('pgjobs_migrations._yoyo_migration')").fetchone() == (None,):
        return  # nothing migrated yet
    names = [c.name for c in plan()]
    rows = conn.execute(
        "SELECT DISTINCT migration_id FROM pgjobs_migrations._yoyo_migration"
        " WHERE migration_id OPERATOR(pg_catalog.<>) ALL (%s) ORDER BY 1",
        (names,),
    ).fetchall()
    if rows:
        raise PreReleaseDatabase([str(r[0]) for r in rows])


@contextmanager
def _backend(dsn: str, conn: psycopg.Connection[Any]) -> Iterator[Any]:
    """yoyo's backend on the bookkeeping schema, the previous layout's history carried over first; refused
    (:class:`PreReleaseDatabase`) when that history holds a change the plan does not know."""
    backend = get_backend(yoyo_uri(dsn))
    try:
        backend.ensure_internal_schema_updated()
        guard.carry_over_legacy_history(conn, [c.name for c in plan()])
        _refuse_unknown_changes(conn)
        yield backend
    finally:
        backend.connection.close()


def _validate_routines(conn: psycopg.Connection[Any], skip: list[str]) -> None:
    """Checks every pgjobs routine body with its language's validator, inside the installing transaction.

    The files are installed with ``check_function_bodies = off`` (a function may call one that a later file
    defines); checking afterwards makes a broken body fail the migration, not the first call that reaches
    it. Validators do not apply a routine's own ``SET search_path``, so the one every pgjobs routine pins
    is set here.
    """
    conn.execute("SET LOCAL check_function_bodies = on")
    conn.execute("SET LOCAL search_path = pg_catalog, pgjobs, pg_temp")
    rows = conn.execute(
        "SELECT p.oid, l.lanvalidator::regproc::text FROM pg_proc AS p JOIN pg_language AS l ON l.oid = p.prolang"
        " WHERE p.pronamespace = 'pgjobs'::regnamespace AND l.lanvalidator <> 0"
        " AND p.oid <> ALL (SELECT s::regprocedure FROM unnest(%s::text[]) AS s) ORDER BY p.oid",
        (skip,),
    ).fetchall()
    for oid, validator in rows:
        conn.execute(pgsql.SQL("SELECT pg_catalog.{}(%s)").format(pgsql.Identifier(validator)), (oid,))
    # (both settings are LOCAL: the transaction's end restores the session's own)


def _run_sql_files(conn: psycopg.Connection[Any], files: list[Path]) -> None:
    conn.execute("SET LOCAL check_function_bodies = off")
    # the files' own statements (signatures, defaults, DO blocks) resolve names in pg_catalog first,
    # never in a schema other roles can create in
    conn.execute("SET LOCAL search_path = pg_catalog, pgjobs")
    for f in files:
        conn.execute(f.read_text())


def _stale_routines(conn: psycopg.Connection[Any]) -> list[str]:
    """The signatures of pgjobs' routines this transaction did not (re)define: those whose pg_proc row was not
    written by one of its (sub)transaction ids. Read after the function files ran, before roles.sql (whose
    grants rewrite every row). Rendered with ``pg_catalog`` alone on the search path, so that they read
    ``pgjobs._name(...)``: with pgjobs on it, as the install has it, they would read ``_name(...)``, and
    :func:`_is_internal` would take every internal one for public and drop it at once, under a call still
    running its caller's old body."""
    shown = conn.execute("SELECT pg_catalog.current_setting('search_path')").fetchone()
    conn.execute("SET LOCAL search_path = pg_catalog")
    rows = conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.pronamespace = 'pgjobs'::regnamespace"
        " AND p.xmin NOT IN (SELECT l.transactionid FROM pg_locks AS l"
        "                     WHERE l.pid = pg_backend_pid() AND l.locktype = 'transactionid')"
    ).fetchall()
    conn.execute("SELECT pg_catalog.set_config('search_path', %s, true)", (shown[0] if shown else "pg_catalog",))
    return [str(r[0]) for r in rows]


def _all_routines(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.pronamespace = 'pgjobs'::regnamespace"
    ).fetchall()
    return [str(r[0]) for r in rows]


def _drop(conn: psycopg.Connection[Any], signatures: list[str]) -> None:
    for signature in signatures:
        conn.execute(pgsql.SQL("DROP ROUTINE IF EXISTS {} CASCADE").format(pgsql.SQL(signature)))


def _is_internal(signature: str) -> bool:
    """An internal routine (``pgjobs._name``): no client calls it by name, only other routines do."""
    return signature.startswith("pgjobs._")


def _wait_for_calls_before(conn: psycopg.Connection[Any], since: Any) -> None:
    """Waits until every transaction that was open in this database at ``since`` has ended (at most
    DRAIN_SECONDS). A call that started before the new routines committed may still run an old body that calls
    an old internal routine, and so may a later call in a transaction begun before: a statement that takes no
    lock before it looks up its function reads the catalog as of its transaction's start. Those routines are
    dropped only once no such transaction is left."""
    deadline = time.monotonic() + DRAIN_SECONDS
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT count(*) FROM pg_catalog.pg_stat_activity"
            " WHERE datname = pg_catalog.current_database() AND pid <> pg_catalog.pg_backend_pid()"
            " AND backend_type = 'client backend' AND state IN ('active', 'idle in transaction')"
            " AND xact_start < %s",
            (since,),
        ).fetchone()
        if row is None or row[0] == 0:
            return
        time.sleep(0.02)


def install_functions(conn: psycopg.Connection[Any], force: bool = False) -> bool:
    """Installs ``sql/`` unless the installed revision matches. Returns whether it installed."""
    digest = sql_digest()
    with conn.transaction():
        current = conn.execute("SELECT digest FROM pgjobs.sql_revision").fetchone()
        if current and current[0] == digest and not force:
            return False
        # In place first: CREATE OR REPLACE keeps each routine's oid, so a worker calling it while the
        # swap commits goes on with the new body. Dropping them all first made such a call fail with
        # "cache lookup failed for function" (XX000), or deadlock with the CASCADE's locks on the tables
        # whose trigger it dropped, under load (tests/ops/test_migrations.py). Routines the files no longer
        # define (a changed signature leaves its old overload) are stale: the public ones go at once (the
        # comments name functions by name alone), the internal ones once the transactions open at the commit
        # have ended (a call inside an old body, or a later call in such a transaction, may still reach them).
        # A change CREATE OR REPLACE refuses (result type, parameter names, defaults: 42P13) takes the old
        # way: everything dropped, then created. Either way one transaction, invisible until commit.
        files = sql_files()
        functions = [f for f in files if f.name not in _LAST_FILES]
        last = [f for f in files if f.name in _LAST_FILES]
        try:
            with conn.transaction():
                _run_sql_files(conn, functions)
                stale = _stale_routines(conn)
                _drop(conn, [s for s in stale if not _is_internal(s)])
                _run_sql_files(conn, last)
        except psycopg.errors.InvalidFunctionDefinition:
            stale = []
            _drop(conn, _all_routines(conn))
            _run_sql_files(conn, [*functions, *last])
        stale = [s for s in stale if _is_internal(s)]
        _validate_routines(conn, skip=stale)
        conn.execute(
            "INSERT INTO pgjobs.sql_revision (digest) VALUES (%s) "
            "ON CONFLICT (singleton) DO UPDATE SET digest = EXCLUDED.digest, applied_at = now()",
            (digest,),
        )
    if stale:
        row = conn.execute("SELECT pg_catalog.clock_timestamp()").fetchone()
        _wait_for_calls_before(conn, row[0] if row else None)
        with conn.transaction():
            _drop(conn, stale)
    return True


@dataclass(frozen=True)
class MigrateResult:
    applied: list[str]
    functions_installed: bool


def migrate(dsn: str) -> MigrateResult:
    """Applies pending migrations, then installs the SQL functions. Idempotent and concurrency-safe."""
    with _migration_lock(dsn) as conn:
        with _backend(dsn, conn) as backend:
            migrations = _yoyo_migrations()
            to_apply = backend.to_apply(migrations)
            if to_apply:
                with backend.lock():
                    backend.apply_migrations(to_apply)
        installed = install_functions(conn)
    return MigrateResult([m.id for m in to_apply], installed)


def rollback(dsn: str, to: str | None = None) -> list[str]:
    """Reverts deployed changes, newest first, down to (not including) ``to``; all when None."""
    with _migration_lock(dsn) as conn, _backend(dsn, conn) as backend:
        migrations = _yoyo_migrations()
        to_rollback = backend.to_rollback(migrations)
        if to is not None:
            names = [m.id for m in to_rollback]
            if to not in [c.name for c in plan()]:
                raise ValueError(f"unknown change {to!r}; the plan has {[c.name for c in plan()]}")
            to_rollback = MigrationList(to_rollback[: names.index(to)] if to in names else to_rollback)
        if to_rollback:
            with backend.lock():
                backend.rollback_migrations(to_rollback)
    return [m.id for m in to_rollback]


def verify(dsn: str) -> list[str]:
    """Runs the verify script of every deployed change; raises on the first that fails (and
    :class:`PreReleaseDatabase` before any, as :func:`status` does)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        guard.pin_search_path(conn)
        _refuse_unknown_changes(conn)
        deployed = _deployed(conn)
        checked = []
        for change in plan():
            if change.name in deployed:
                conn.execute(change.script("verify"))
                checked.append(change.name)
    return checked


def _deployed(conn: psycopg.Connection[Any]) -> set[str]:
    """The deployed changes, read from the bookkeeping schema, or from the previous layout's
    ``public._yoyo_migration`` while its history has not been carried over (read only: no migrate ran)."""
    names = [c.name for c in plan()]
    for table in ("pgjobs_migrations._yoyo_migration", "public._yoyo_migration"):
        if conn.execute("SELECT pg_catalog.to_regclass(%s)", (table,)).fetchone() == (None,):
            continue
        rows = conn.execute(
            pgsql.SQL("SELECT migration_id FROM {} WHERE migration_id OPERATOR(pg_catalog.=) ANY (%s)").format(
                pgsql.SQL(table)
            ),
            (names,),
        ).fetchall()
        if rows:
            return {str(r[0]) for r in rows}
    return set()


def status(dsn: str) -> dict[str, bool]:
    """Each change of the plan, and whether it is deployed."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        guard.pin_search_path(conn)
        _refuse_unknown_changes(conn)
        deployed = _deployed(conn)
    return {c.name: c.name in deployed for c in plan()}
