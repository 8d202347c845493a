"""Throwaway databases and a notification recorder, for :mod:`pgjobs.testing` (the SQL text lives here, in
the ops layer, like the migrator's).

* :func:`create_template` / :func:`clone` / :func:`drop`: one migrated template database per test session,
  and a ``CREATE DATABASE ... TEMPLATE`` copy of it per test (milliseconds, where migrating takes a second).
* :class:`Recorder`: a connection LISTENing on some channels that collects what arrives, so a test can say
  "nothing was notified" (a rolled-back transaction never notifies: NOTIFY is delivered on commit).
"""

from __future__ import annotations

import secrets
import time
from types import TracebackType
from typing import Any, Self

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgjobs.ops.migrate import migrate


def _admin(server_dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(server_dsn, autocommit=True, connect_timeout=10)


def new_name(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(5)}"


def create_template(server_dsn: str, prefix: str = "pgjobs_kit_tpl") -> str:
    """Creates and migrates a new database on ``server_dsn``'s server; returns its name."""
    name = new_name(prefix)
    with _admin(server_dsn) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    migrate(make_conninfo(server_dsn, dbname=name))
    return name


def clone(server_dsn: str, template: str, prefix: str = "pgjobs_kit") -> str:
    """A new database copied from ``template``; returns its DSN."""
    name = new_name(prefix)
    with _admin(server_dsn) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template)))
    return make_conninfo(server_dsn, dbname=name)


def drop(server_dsn: str, dbname: str) -> None:
    """Drops ``dbname``, disconnecting whoever is still in it (PostgreSQL 13+)."""
    with _admin(server_dsn) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))


class Recorder:
    """``with Recorder(dsn, ["pgjobs_wake"]) as heard: ...`` then ``heard.collect(0.2)``: every
    ``(channel, payload)`` delivered to a separate LISTENing connection so far (waiting up to ``timeout``
    seconds for late ones)."""

    def __init__(self, dsn: str, channels: list[str]) -> None:
        self.dsn = dsn
        self.channels = channels
        self.received: list[tuple[str, str]] = []
        self._conn: psycopg.Connection[Any] | None = None

    def __enter__(self) -> Self:
        self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
        for channel in self.channels:
            self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        return self

    def collect(self, timeout: float = 0.2) -> list[tuple[str, str]]:
        """What arrived so far, after waiting ``timeout`` seconds for more."""
        assert self._conn is not None, "use Recorder as a context manager"
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            for n in self._conn.notifies(timeout=left):
                self.received.append((n.channel, n.payload))
        return list(self.received)

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
