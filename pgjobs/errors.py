"""Exceptions, mapped one-to-one from the SQLSTATEs of class ``PJ`` raised by the SQL functions."""

from __future__ import annotations

import re

import psycopg


class PgJobsError(Exception):
    """Base of every error pgjobs raises. ``sqlstate`` is the SQLSTATE that caused it, if any."""

    sqlstate: str | None = None

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        if sqlstate is not None:
            self.sqlstate = sqlstate


class QueueFull(PgJobsError):
    """PJ001: the queue is at its ``max_length``."""

    sqlstate = "PJ001"


class InvalidArgument(PgJobsError):
    """PJ002: an argument is invalid; the message names it and its value."""

    sqlstate = "PJ002"


class JobNotFound(PgJobsError):
    """PJ003: no job (or batch, or schedule) with that id or name."""

    sqlstate = "PJ003"


class InvalidState(PgJobsError):
    """PJ004: the operation is not allowed in the job's current state."""

    sqlstate = "PJ004"


class GraphError(PgJobsError):
    """PJ005: invalid dependency graph (cycle, unknown reference, missing parent)."""

    sqlstate = "PJ005"


class SchemaMissing(PgJobsError):
    """The database has no pgjobs schema: run ``pgjobs migrate``."""


class NeedsPrimary(PgJobsError):
    """The call writes, and the server it reached is a read-only hot standby (or the session is read-only):
    send it to the primary (a DSN with ``target_session_attrs=read-write``), not to a ``read_dsn``."""

    sqlstate = "25006"


def _call_name(query: str | None) -> str:
    m = re.search(r"pgjobs\.(\w+)", query or "")
    return f"pgjobs.{m.group(1)}" if m else "this call"


BY_SQLSTATE: dict[str, type[PgJobsError]] = {
    cls.sqlstate: cls for cls in (QueueFull, InvalidArgument, JobNotFound, InvalidState, GraphError) if cls.sqlstate
}


def translate(exc: psycopg.Error, query: str | None = None) -> Exception:
    """The pgjobs exception for a database error, or the error itself when it is not ours. ``query``: the
    statement that failed (its pgjobs function is named in the message of a write refused by a standby)."""
    state = exc.sqlstate or ""
    if state == NeedsPrimary.sqlstate:
        detail = exc.diag.message_primary or str(exc)
        return NeedsPrimary(
            f"{_call_name(query)} writes, so it needs the primary: the server is read-only ({detail});"
            " connect with target_session_attrs=read-write, not a read DSN",
            state,
        )
    cls = BY_SQLSTATE.get(state)
    if cls is not None:
        message = exc.diag.message_primary or str(exc)
        return cls(message, state)
    if state == "3F000" or (state == "42883" and "pgjobs." in str(exc)):
        return SchemaMissing(f"the pgjobs schema is missing or outdated; run `pgjobs migrate` ({exc})", state)
    return exc
