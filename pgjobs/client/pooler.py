"""A connection pooler that cannot keep server-side prepared statements, found by the errors it causes.

PgBouncer before 1.21 in transaction mode (and other poolers that hand each transaction to whichever server
connection is free) cannot keep a session's prepared statements: psycopg prepares ``_pg3_0`` on one server
connection and the next statement lands on another, where it is missing (26000, "prepared statement does not
exist") or where another client prepared the same name (42P05, "already exists"). Both errors come from the
Parse or Bind message, before any Execute: the statement did not run, so the call can run again unprepared.
PgBouncer also refuses every startup parameter it does not know ("unsupported startup parameter: options").

A client or worker that meets one of these switches to no server-side prepared statements and no startup options
for the rest of its life and logs it once (:func:`announce`); ``prepare=False`` asks for that from the start.
"""

from __future__ import annotations

import logging
import threading

import psycopg
from psycopg import errors

log = logging.getLogger("pgjobs.client")

# The errors of a prepared statement the pooler lost: raised at Parse (42P05) or Bind (26000), before Execute.
PREPARED_LOST = (errors.DuplicatePreparedStatement, errors.InvalidSqlStatementName)

_switch = threading.Lock()


def lost_prepared(exc: BaseException) -> bool:
    """A prepared statement the server connection does not have (or has from another client): a pooler's doing."""
    return isinstance(exc, PREPARED_LOST)


def refused_options(exc: BaseException) -> bool:
    """PgBouncer's answer to a connection with startup ``options`` (it passes only the parameters it knows)."""
    return isinstance(exc, psycopg.OperationalError) and "unsupported startup parameter" in str(exc)


def first_switch(holder: object, attr: str = "_prepare") -> bool:
    """Turns ``holder.<attr>`` (its prepare flag) off; True for the one caller that turned it off (so the switch
    is logged once even when several threads meet the pooler at the same moment)."""
    with _switch:
        if not getattr(holder, attr):
            return False
        setattr(holder, attr, False)
        return True


def announce(who: str, exc: BaseException) -> None:
    first = str(exc).strip().splitlines()
    log.warning(
        "%s: a connection pooler that cannot keep prepared statements or session options (PgBouncer in transaction"
        " mode before 1.21) is in front of the database (%s): no server-side prepared statements and no startup"
        " options from now on (prepare=False, --no-prepare, says so from the start)",
        who, first[0] if first else type(exc).__name__,
    )  # fmt: skip
