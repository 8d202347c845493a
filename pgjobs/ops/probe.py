"""What the CLI asks a server before it runs a command: is the pgjobs schema there, with its functions, and at
which revision; the server's version; and the throwaway databases of ``pgjobs demo``."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql


def schema_state(dsn: str, **connect: Any) -> tuple[bool, bool]:
    """(the ``pgjobs`` schema exists, its functions are installed). Raises psycopg.OperationalError when the
    server does not answer."""
    with psycopg.connect(dsn, **connect) as conn:
        row = conn.execute(
            "SELECT n.oid IS NOT NULL,"
            " EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS p"
            "         WHERE p.pronamespace = n.oid AND p.proname = 'job_status')"
            " FROM (SELECT to_regnamespace('pgjobs')::oid AS oid) AS n"
        ).fetchone()
    return (bool(row[0]), bool(row[1])) if row is not None else (False, False)


def installed_digest(dsn: str, **connect: Any) -> str | None:
    """The digest of the installed functions (``pgjobs.sql_revision``), None when there is none."""
    with psycopg.connect(dsn, **connect) as conn:
        if conn.execute("SELECT to_regclass('pgjobs.sql_revision')").fetchone() == (None,):
            return None
        row = conn.execute("SELECT digest FROM pgjobs.sql_revision").fetchone()
    return None if row is None else str(row[0])


def server_version(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('server_version')").fetchone()
    return str(row[0]).split()[0] if row else "?"


def databases_named(admin_dsn: str, exact: str, pattern: str) -> list[str]:
    """Databases called ``exact`` or matching the regular expression ``pattern``."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = %s OR datname ~ %s", [exact, pattern]
        ).fetchall()
    return [str(r[0]) for r in rows]


def create_database(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
