"""Bulk enqueue through COPY: specs go (binary) into a temporary staging table of the session, and one
call of ``pgjobs.enqueue_staged`` validates and inserts them set-based (sql/enqueue.sql).

The staging table is created once per session with ``ON COMMIT DELETE ROWS``: its rows vanish at every
commit, as with ``ON COMMIT DROP``, without creating and dropping a 13-column table (catalog rows, and
1.4 ms) on every call. Anything the table's typed columns cannot carry faithfully (a spec that is not
a dict, an unknown key, a value of an unexpected Python type) sends the whole call to enqueue_many's
JSON path instead, which refuses it with the same PJ002 as ever (or, for a float like 5.0, accepts it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, LiteralString

from psycopg import sql
from psycopg.types.json import Jsonb

from pgjobs.client.arguments import run_at_time

# The columns enqueue_staged expects, in order, with the COPY types of the values the client sends.
COLUMNS: dict[str, str] = {
    "n": "int8",
    "kind": "text",
    "queue": "text",
    "payload": "jsonb",
    "meta": "jsonb",
    "run_at": "text",
    "priority": "int8",
    "max_attempts": "int8",
    "unique_key": "text",
    "unique_live_only": "bool",
    "group_key": "text",
    "ref": "text",
    "depends_on": "jsonb",
}

# Created on the first call of a session, emptied when an earlier call of the same transaction left rows.
# GRANT SELECT to PUBLIC: enqueue_staged reads it as its owner (SECURITY DEFINER); no other session can
# read a temporary table, whatever its grants.
STAGE: LiteralString = (
    "DO $pgjobs$BEGIN"
    " IF to_regclass('pg_temp.pgjobs_staging') IS NULL THEN"
    " CREATE TEMP TABLE pgjobs_staging (n bigint, kind text, queue text, payload jsonb, meta jsonb, run_at text,"
    " priority bigint, max_attempts bigint, unique_key text, unique_live_only boolean, group_key text, ref text,"
    " depends_on jsonb) ON COMMIT DELETE ROWS;"
    " GRANT SELECT ON pg_temp.pgjobs_staging TO PUBLIC;"
    " ELSE DELETE FROM pg_temp.pgjobs_staging; END IF; END$pgjobs$"
)
ENQUEUE_STAGED: LiteralString = (
    "SELECT ref, id, created, batch_id FROM pgjobs.enqueue_staged(staging => 'pg_temp.pgjobs_staging', as_batch => %s)"
)

_INT8 = range(-(2**63), 2**63)


class _Unfit(Exception):
    """A value the staging table's column cannot carry as the JSON path would read it."""


def _text(v: Any) -> str | None:
    if v is None or type(v) is str:
        return v
    raise _Unfit


def _json(v: Any) -> Jsonb:
    return Jsonb(v)  # None stays JSON null: refused where enqueue_many refuses it


def _run_at(v: Any) -> str | None:
    if isinstance(v, datetime):
        return v.isoformat()
    return _text(v)


def _int(v: Any) -> int:
    # JSON null, a bool or a float take the JSON path (which refuses the first two, accepts 5.0).
    if type(v) is int and v in _INT8:
        return v
    raise _Unfit


def _bool(v: Any) -> bool | None:
    if v is None or type(v) is bool:
        return v
    raise _Unfit


def _ref(v: Any) -> str | None:
    if type(v) is int:
        return str(v)  # enqueue_many reads a number ref as its text (`->> 'ref'`)
    return _text(v)


_CONVERT: dict[str, Callable[[Any], Any]] = {
    "kind": _text,
    "queue": _text,
    "payload": _json,
    "meta": _json,
    "run_at": _run_at,
    "priority": _int,
    "max_attempts": _int,
    "unique_key": _text,
    "unique_live_only": _bool,
    "group_key": _text,
    "ref": _ref,
    "depends_on": _json,
}
_PLAIN = frozenset(("kind", "queue", "payload"))


def stage(jobs: Iterable[Mapping[str, Any]]) -> tuple[list[str], list[tuple[Any, ...]]] | None:
    """(columns, rows) to COPY, or None when the specs must take enqueue_many's JSON path."""
    specs = jobs if isinstance(jobs, list) else list(jobs)
    if not specs:
        return None
    keys: set[str] = set()
    for spec in specs:
        if not isinstance(spec, Mapping):
            return None
        keys.update(spec)
    if not keys <= _CONVERT.keys():
        return None
    rows: list[tuple[Any, ...]]
    try:
        if keys <= _PLAIN:
            # Most bulk loads: kind, queue and payload only.
            rows = [
                (
                    i,
                    _text(s.get("kind")),
                    _text(s.get("queue")),
                    Jsonb(s["payload"]) if "payload" in s else None,
                )
                for i, s in enumerate(specs)
            ]
            return ["n", "kind", "queue", "payload"], rows
        if "run_at" in keys:  # an ISO 8601 string, not whatever PostgreSQL's date parser reads
            for i, s in enumerate(specs):
                if type(s.get("run_at")) is str:
                    run_at_time(s["run_at"], f"jobs[{i}]")
        columns = [c for c in COLUMNS if c in keys]
        convert = [_CONVERT[c] for c in columns]
        rows = [
            (i, *(f(s[c]) if c in s else None for c, f in zip(columns, convert, strict=True)))
            for i, s in enumerate(specs)
        ]
    except _Unfit:
        return None
    return ["n", *columns], rows


def copy_statement(columns: Sequence[str]) -> sql.Composed:
    return sql.SQL("COPY pg_temp.pgjobs_staging ({}) FROM STDIN (FORMAT BINARY)").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    )


def copy_types(columns: Sequence[str]) -> list[str]:
    return [COLUMNS[c] for c in columns]
