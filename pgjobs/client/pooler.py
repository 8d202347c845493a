"""A connection pooler that cannot keep server-side prepared statements, found by a probe and by the errors it causes.

PgBouncer before 1.21 in transaction mode (and other poolers that hand each transaction to whichever server
connection is free) cannot keep a session's prepared statements: psycopg prepares ``_pg3_0`` on one server
connection and the next statement lands on another, where it is missing (26000, "prepared statement does not
exist") or where another client prepared the same name (42P05, "already exists"). Both errors come from the
Parse or Bind message, before any Execute: the statement did not run, so the call can run again unprepared.
PgBouncer also refuses every startup parameter it does not know ("unsupported startup parameter: options").

Worse, psycopg names every connection's prepared statements ``_pg3_0``, ``_pg3_1``, ...: a Bind of ``_pg3_0``
that lands on a server connection where another client prepared a different statement under that name with the
same number of parameters runs that other statement, with no error. So the pooler is looked for before the first
statement that could be prepared: :func:`probe` / :func:`aprobe` open one short connection whose startup
``options`` carry a fresh random value in a custom setting (``-c pgjobs.probe=<nonce>``, merged with the DSN's own
options) and read it back. Refused ("unsupported startup parameter"), or not read back (the pooler dropped the
options, ``ignore_startup_parameters = options``, or the statement ran on a session that is not ours): something
between us and PostgreSQL does not keep session state, and nothing is prepared from the start. Read back: a
direct connection (or a pooler that passes session options); the errors above stay as the second line.

A client or worker that meets one of these switches to no server-side prepared statements and no startup options
for the rest of its life and logs it once (:func:`announce`); ``prepare=False`` asks for that from the start, and
then no probe is made.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from typing import Any

import psycopg
from psycopg import errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo

log = logging.getLogger("pgjobs.client")

# The errors of a prepared statement the pooler lost: raised at Parse (42P05) or Bind (26000), before Execute.
PREPARED_LOST = (errors.DuplicatePreparedStatement, errors.InvalidSqlStatementName)

_switch = threading.Lock()

# The custom setting the probe sends in its startup options and reads back.
PROBE_SETTING = "pgjobs.probe"
PROBE_QUERY = f"SELECT current_setting('{PROBE_SETTING}', true)"
PROBE_TIMEOUT = 10  # seconds: connect_timeout of the probe connection


class SessionNotKept(Exception):
    """The probe's finding: a startup option did not reach the session that ran the next statement."""


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


def probe_conninfo(dsn: str, options: str | None = None) -> tuple[str, str]:
    """``dsn`` with ``-c pgjobs.probe=<nonce>`` added to its startup options (the DSN's own, else ``PGOPTIONS``,
    then ``options``), and the nonce."""
    nonce = secrets.token_hex(16)
    params: dict[str, Any] = conninfo_to_dict(dsn)
    mine = params.get("options") or os.environ.get("PGOPTIONS")
    params["options"] = " ".join(o for o in (mine, options, f"-c {PROBE_SETTING}={nonce}") if o)
    return make_conninfo("", **params), nonce


def verdict(row: tuple[Any, ...] | None, nonce: str) -> SessionNotKept | None:
    value = row[0] if row else None
    if value == nonce:
        return None
    return SessionNotKept(
        f"startup option {PROBE_SETTING} did not come back (got {value!r}): the session is not kept between"
        " connection and statement"
    )


def probe(dsn: str, options: str | None = None, **kwargs: Any) -> BaseException | None:
    """One short connection to ``dsn`` that says whether session state reaches our statements (module docstring).
    None: it does; else the reason it does not or cannot be told (a server down at open: then nothing is
    prepared either, rather than risk another client's statement), for :func:`switch_after_probe`."""
    conninfo, nonce = probe_conninfo(dsn, options)
    try:
        with psycopg.connect(
            conninfo, autocommit=True, prepare_threshold=None, connect_timeout=PROBE_TIMEOUT, **kwargs
        ) as conn:
            return verdict(conn.execute(PROBE_QUERY, prepare=False).fetchone(), nonce)
    except psycopg.OperationalError as exc:
        return exc


async def aprobe(dsn: str, options: str | None = None, **kwargs: Any) -> BaseException | None:
    """:func:`probe` on an AsyncConnection (the event loop goes on while it connects)."""
    conninfo, nonce = probe_conninfo(dsn, options)
    try:
        async with await psycopg.AsyncConnection.connect(
            conninfo, autocommit=True, prepare_threshold=None, connect_timeout=PROBE_TIMEOUT, **kwargs
        ) as conn:
            cur = await conn.execute(PROBE_QUERY, prepare=False)
            return verdict(await cur.fetchone(), nonce)
    except psycopg.OperationalError as exc:
        return exc


def switch_after_probe(holder: object, who: str, finding: BaseException | None, attr: str = "_prepare") -> None:
    """Turns ``holder``'s prepare flag off when the probe found (or could not rule out) a pooler; logs it once."""
    if finding is None or not first_switch(holder, attr):
        return
    if isinstance(finding, SessionNotKept) or refused_options(finding):
        announce(who, finding)
        return
    first = str(finding).strip().splitlines()
    log.warning(
        "%s: could not probe the connection for a pooler that cannot keep prepared statements (%s): no server-side"
        " prepared statements for this client's life (prepare=False says so from the start)",
        who, first[0] if first else type(finding).__name__,
    )  # fmt: skip
