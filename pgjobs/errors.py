"""Exceptions, mapped one-to-one from the SQLSTATEs of class ``PJ`` raised by the SQL functions."""

from __future__ import annotations

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


BY_SQLSTATE: dict[str, type[PgJobsError]] = {
    cls.sqlstate: cls for cls in (QueueFull, InvalidArgument, JobNotFound, InvalidState, GraphError) if cls.sqlstate
}


def translate(exc: psycopg.Error) -> Exception:
    """The pgjobs exception for a database error, or the error itself when it is not ours."""
    state = exc.sqlstate or ""
    cls = BY_SQLSTATE.get(state)
    if cls is not None:
        message = exc.diag.message_primary or str(exc)
        return cls(message, state)
    if state == "3F000" or (state == "42883" and "pgjobs." in str(exc)):
        return SchemaMissing(f"the pgjobs schema is missing or outdated; run `pgjobs migrate` ({exc})", state)
    return exc
