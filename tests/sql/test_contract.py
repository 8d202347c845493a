"""The SQL contract of DESIGN.md, read from the catalog.

Every listed function exists in schema ``pgjobs`` once (so named calls never hit an ambiguous overload), its
parameters start with exactly the listed names in the listed order and types, every listed default is there
with the listed value, extra parameters (welcome) all have defaults so contract calls still resolve, the
return type is the listed one, and every pgjobs routine pins ``search_path``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

NO_DEFAULT = object()  # the contract lists the parameter without a default
ANY_DEFAULT = object()  # the contract does not say (a default is allowed)

TS = "timestamp with time zone"
STATE = "pgjobs.job_state"


@dataclass(frozen=True)
class Fn:
    name: str
    params: list[tuple[str, str | None]]  # (name, type or None when the contract leaves it open)
    defaults: dict[str, Any] = field(default_factory=dict)  # name -> python value of the listed default
    returns: str | None = None  # "TABLE(a t, ...)", "SETOF t", "t", or None (unspecified)


CONTRACT = [
    Fn(
        "enqueue",
        [
            ("kind", "text"),
            ("payload", "jsonb"),
            ("queue", "text"),
            ("run_at", TS),
            ("priority", "smallint"),
            ("max_attempts", "integer"),
            ("unique_key", "text"),
            ("unique_live_only", "boolean"),
            ("group_key", "text"),
            ("meta", "jsonb"),
        ],
        {
            "payload": {},
            "queue": "default",
            "run_at": None,
            "priority": 0,
            "max_attempts": 20,
            "unique_key": None,
            "unique_live_only": False,
            "group_key": None,
            "meta": {},
        },
        f"TABLE(id bigint, created boolean, state {STATE})",
    ),
    Fn(
        "enqueue_many",
        [("jobs", "jsonb"), ("as_batch", "boolean")],
        {"as_batch": False},
        "TABLE(ref text, id bigint, created boolean, batch_id bigint)",
    ),
    Fn(
        "claim",
        [
            ("worker", "text"),
            ("queues", "text[]"),
            ("max_jobs", "integer"),
            ("lease", "interval"),
            ("kind_limits", "jsonb"),
        ],
        {"queues": ["default"], "max_jobs": 1, "lease": timedelta(seconds=30), "kind_limits": None},
        "SETOF pgjobs.claimed_job",
    ),
    Fn("renew_lease", [("id", "bigint"), ("lease_token", "uuid"), ("lease", "interval")], {}, "boolean"),
    Fn("checkpoint", [("id", "bigint"), ("lease_token", "uuid"), ("checkpoint", "jsonb")], {}, "boolean"),
    Fn("progress", [("id", "bigint"), ("lease_token", "uuid"), ("progress", "jsonb")], {}, "boolean"),
    Fn(
        "complete",
        [("id", "bigint"), ("lease_token", "uuid"), ("result", "jsonb"), ("continuations", "jsonb")],
        {"result": None, "continuations": None},
        "boolean",
    ),
    Fn("complete_many", [("ids", "bigint[]"), ("lease_tokens", "uuid[]")], {}, "integer"),
    Fn(
        "fail",
        [("id", "bigint"), ("lease_token", "uuid"), ("error", "text"), ("retry_at", TS)],
        {"retry_at": None},
        STATE,
    ),
    Fn("dead_letter", [("id", "bigint"), ("lease_token", "uuid"), ("error", "text")], {}, "boolean"),
    Fn("release", [("id", "bigint"), ("lease_token", "uuid"), ("run_at", TS)], {"run_at": None}, "boolean"),
    Fn("cancel", [("id", "bigint")], {}, "boolean"),
    Fn("retry", [("id", "bigint")]),
    Fn("delete", [("id", "bigint")]),
    Fn("purge", [("succeeded_before", "interval"), ("failed_before", "interval")], {}, "bigint"),
    Fn(
        "configure_queue",
        [
            ("queue", "text"),
            ("max_length", "integer"),
            ("paused", "boolean"),
            ("fair", "boolean"),
            ("noisy_share", "real"),
            ("noisy_min_active", "integer"),
            ("max_active_per_group", "integer"),
            ("max_active", "integer"),
            ("status_events", "text"),
        ],
        {
            "max_length": None,
            "paused": None,
            "fair": None,
            "noisy_share": None,
            "noisy_min_active": None,
            "max_active_per_group": None,
            "max_active": None,
            "status_events": None,
        },
    ),
    Fn("job_status", [("id", "bigint")], {}, "SETOF pgjobs.job_status"),
    Fn("explain", [("id", "bigint")], {}, "jsonb"),
    Fn("stats", [], {}, f"TABLE(queue text, state {STATE}, jobs bigint)"),
    Fn(
        "list_jobs",
        [
            ("state", STATE),
            ("queue", "text"),
            ("kind", "text"),
            ("search", "text"),
            ("max_rows", "integer"),
            ("skip_rows", "integer"),
        ],
        {"max_rows": 100, "skip_rows": 0},
    ),
    Fn("list_workers", [], {}, "TABLE(id text, last_seen timestamp with time zone, meta jsonb, ...)"),
    Fn("worker_heartbeat", [("worker", "text"), ("meta", "jsonb")]),
    Fn("reap_workers", [("stale_after", "interval")], {}, "integer"),
]

CLAIMED_JOB = [
    ("id", "bigint"),
    ("kind", "text"),
    ("queue", "text"),
    ("payload", "jsonb"),
    ("meta", "jsonb"),
    ("attempt", "integer"),
    ("max_attempts", "integer"),
    ("lease_token", "uuid"),
    ("lease_expires_at", TS),
    ("checkpoint", "jsonb"),
    ("group_key", "text"),
    ("batch_id", "bigint"),
    ("first_started_at", TS),
]

JOB_COLUMNS = [
    ("id", "bigint"),
    ("kind", "text"),
    ("queue", "text"),
    ("payload", "jsonb"),
    ("meta", "jsonb"),
    ("state", STATE),
    ("priority", "smallint"),
    ("run_at", TS),
    ("created_at", TS),
    ("attempt", "integer"),
    ("max_attempts", "integer"),
    ("lease_token", "uuid"),
    ("leased_by", "text"),
    ("lease_expires_at", TS),
    ("first_started_at", TS),
    ("completed_at", TS),
    ("last_error", "text"),
    ("errors", "jsonb"),
    ("checkpoint", "jsonb"),
    ("progress", "jsonb"),
    ("result", "jsonb"),
    ("unique_key", "text"),
    ("group_key", "text"),
    ("batch_id", "bigint"),
    ("remaining_deps", "integer"),
    ("failed_deps", "integer"),
    ("schedule_name", "text"),
    ("cancel_requested", "boolean"),
]


def _split_top_level(text: str) -> list[str]:
    """Splits pg_get_expr's comma-separated default list, minding quotes and parentheses."""
    parts: list[str] = []
    depth, quoted, start = 0, False, 0
    for i, ch in enumerate(text):
        if ch == "'":
            quoted = not quoted
        elif not quoted and ch in "([":
            depth += 1
        elif not quoted and ch in ")]":
            depth -= 1
        elif not quoted and depth == 0 and ch == ",":
            parts.append(text[start:i].strip())
            start = i + 1
    if text.strip():
        parts.append(text[start:].strip())
    return parts


def _procs(conn: psycopg.Connection[Any], name: str) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """
            SELECT p.oid, p.proname, p.proargnames, p.proargmodes, p.pronargdefaults, p.proretset, p.prokind,
                   format_type(p.prorettype, NULL) AS rettype,
                   pg_get_function_result(p.oid) AS result,
                   ARRAY(SELECT format_type(t, NULL)
                           FROM unnest(coalesce(p.proallargtypes, p.proargtypes::oid[])) WITH ORDINALITY AS a(t, n)
                          ORDER BY a.n) AS argtypes,
                   pg_get_expr(p.proargdefaults, 0) AS defaults
              FROM pg_proc AS p
             WHERE p.pronamespace = 'pgjobs'::regnamespace AND p.proname = %s
            """,
            [name],
        ).fetchall()


def _inputs(proc: dict[str, Any]) -> list[tuple[str, str]]:
    names = proc["proargnames"] or [""] * len(proc["argtypes"])
    modes = proc["proargmodes"] or ["i"] * len(proc["argtypes"])
    return [(n, t) for n, t, m in zip(names, proc["argtypes"], modes, strict=True) if m in ("i", "b", "v")]


@pytest.fixture(scope="module")
def catalog(pg_template: str, pg_server_dsn: str) -> dict[str, list[dict[str, Any]]]:
    """pg_proc rows of every contract function, read once from a fresh database."""
    from conftest import db_dsn

    # the template refuses connections; read a database cloned from it
    scratch = f"{pg_template}_contract"
    with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{scratch}" TEMPLATE "{pg_template}"')
    try:
        with psycopg.connect(db_dsn(pg_server_dsn, scratch), autocommit=True) as conn:
            out = {fn.name: _procs(conn, fn.name) for fn in CONTRACT}
            for fn in CONTRACT:
                for proc in out[fn.name]:
                    parts = _split_top_level(proc["defaults"] or "")
                    proc["default_values"] = [conn.execute(f"SELECT {p}").fetchone()[0] for p in parts]  # type: ignore[index]
            out["__routines__"] = list(
                conn.cursor(row_factory=dict_row).execute(
                    "SELECT p.oid::regprocedure::text AS signature, p.proconfig FROM pg_proc AS p"
                    " WHERE p.pronamespace = 'pgjobs'::regnamespace ORDER BY 1"
                )
            )
            return out
    finally:
        with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')


@pytest.mark.smoke
@pytest.mark.parametrize("fn", CONTRACT, ids=[f.name for f in CONTRACT])
def test_function_exists_once_with_the_listed_parameters(catalog: dict[str, Any], fn: Fn) -> None:
    procs = catalog[fn.name]
    assert len(procs) == 1, (
        f"pgjobs.{fn.name}: expected exactly one function, found {len(procs)} (named calls would be ambiguous)"
    )
    proc = procs[0]
    assert proc["prokind"] == "f"
    inputs = _inputs(proc)
    listed = [n for n, _ in fn.params]
    assert [n for n, _ in inputs[: len(listed)]] == listed, f"{fn.name}: parameters {inputs}"
    for (name, expected), (_, actual) in zip(fn.params, inputs, strict=False):
        if expected is not None:
            assert actual == expected, f"{fn.name}.{name}: type {actual}, contract says {expected}"

    # defaults: the last pronargdefaults inputs carry them
    n_defaults = proc["pronargdefaults"]
    values = proc["default_values"]
    assert len(values) == n_defaults
    defaulted = dict(zip([n for n, _ in inputs[len(inputs) - n_defaults :]], values, strict=True))
    for name, value in fn.defaults.items():
        assert name in defaulted, f"{fn.name}.{name} has no default; the contract gives {value!r}"
        assert defaulted[name] == value, f"{fn.name}.{name} defaults to {defaulted[name]!r}, contract says {value!r}"
    # extra parameters are welcome, but only with defaults: a call written against the contract must resolve
    for name, _ in inputs[len(listed) :]:
        assert name in defaulted, f"{fn.name}: extra parameter {name} has no default"


@pytest.mark.parametrize("fn", [f for f in CONTRACT if f.returns], ids=[f.name for f in CONTRACT if f.returns])
def test_function_returns_the_listed_type(catalog: dict[str, Any], fn: Fn) -> None:
    proc = catalog[fn.name][0]
    result: str = proc["result"]
    assert fn.returns is not None
    if fn.returns.endswith(", ...)"):  # listed columns first, extra columns allowed
        assert result.startswith(fn.returns[: -len(", ...)")]), result
    else:
        assert result == fn.returns, f"{fn.name} returns {result}, contract says {fn.returns}"


def test_every_pgjobs_routine_pins_search_path(catalog: dict[str, Any]) -> None:
    routines = catalog["__routines__"]
    assert len(routines) >= len(CONTRACT)
    unpinned = [
        r["signature"]
        for r in routines
        if not any(c.replace(" ", "") == "search_path=pg_catalog,pgjobs,pg_temp" for c in (r["proconfig"] or []))
    ]
    assert unpinned == [], f"routines without SET search_path = pg_catalog, pgjobs, pg_temp: {unpinned}"


def _composite(conn: psycopg.Connection[Any], typname: str) -> list[tuple[str, str]]:
    return [
        (r[0], r[1])
        for r in conn.execute(
            """
            SELECT a.attname, format_type(a.atttypid, a.atttypmod)
              FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid
             WHERE c.relnamespace = 'pgjobs'::regnamespace AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
             ORDER BY a.attnum
            """,
            [typname],
        ).fetchall()
    ]


@pytest.mark.smoke
def test_claimed_job_type_has_the_listed_fields_in_order(conn: psycopg.Connection[Any]) -> None:
    assert _composite(conn, "claimed_job") == CLAIMED_JOB


def test_job_status_type_is_the_job_row_plus_depends_on(conn: psycopg.Connection[Any]) -> None:
    fields = _composite(conn, "job_status")
    for column in JOB_COLUMNS:
        assert column in fields, f"job_status lacks {column}"
    assert fields[-1] == ("depends_on", "jsonb")


def test_jobs_table_has_the_data_model_columns(conn: psycopg.Connection[Any]) -> None:
    columns = _composite(conn, "jobs")
    for column in JOB_COLUMNS:
        assert column in columns, f"pgjobs.jobs lacks {column}"
    defaults = dict(
        conn.execute(
            "SELECT column_name, column_default FROM information_schema.columns"
            " WHERE table_schema = 'pgjobs' AND table_name = 'jobs'"
        ).fetchall()
    )
    assert defaults["priority"] == "0"
    assert defaults["max_attempts"] == "20"
    assert conn.execute(
        "SELECT is_identity FROM information_schema.columns"
        " WHERE table_schema = 'pgjobs' AND table_name = 'jobs' AND column_name = 'id'"
    ).fetchone() == ("YES",)


def test_job_state_enum_lists_the_seven_states_in_order(conn: psycopg.Connection[Any]) -> None:
    labels = [r[0] for r in conn.execute("SELECT unnest(enum_range(NULL::pgjobs.job_state))::text").fetchall()]
    assert labels == ["waiting", "scheduled", "pending", "active", "succeeded", "failed", "cancelled"]


@pytest.mark.parametrize(
    ("table", "columns"),
    [
        ("edges", ["child_id", "parent_job_id", "parent_batch_id", "trigger"]),
        (
            "batches",
            [
                "id",
                "total",
                "pending",
                "succeeded",
                "failed",
                "cancelled",
                "state",
                "created_at",
                "started_at",
                "completed_at",
            ],
        ),
        (
            "queues",
            [
                "queue",
                "max_length",
                "paused",
                "fair",
                "noisy_share",
                "noisy_min_active",
                "max_active_per_group",
                "max_active",
                "status_events",
            ],
        ),
        (
            "schedules",
            [
                "name",
                "kind",
                "cron",
                "timezone",
                "payload",
                "queue",
                "code_defined",
                "paused",
                "next_run_at",
                "last_run_at",
            ],
        ),
        ("workers", ["id", "last_seen", "meta"]),
    ],
)
def test_other_tables_have_the_data_model_columns(
    conn: psycopg.Connection[Any], table: str, columns: list[str]
) -> None:
    present = [name for name, _ in _composite(conn, table)]
    assert [c for c in columns if c not in present] == []


def test_queue_setting_defaults(conn: psycopg.Connection[Any]) -> None:
    conn.execute("INSERT INTO pgjobs.queues (queue) VALUES ('q')")
    row = conn.execute(
        "SELECT max_length, paused, fair, noisy_share, noisy_min_active, max_active_per_group, max_active,"
        " status_events FROM pgjobs.queues WHERE queue = 'q'"
    ).fetchone()
    assert row == (None, False, False, 0.5, 2, None, None, "all")


def test_contract_functions_are_callable_by_name_with_only_required_arguments(conn: psycopg.Connection[Any]) -> None:
    """Calls written exactly as the contract shows them resolve (no ambiguity, defaults fill the rest)."""
    row = conn.execute("SELECT id, created, state FROM pgjobs.enqueue(kind => 'k')").fetchone()
    assert row is not None and row[1] is True and row[2] == "pending"
    assert conn.execute('SELECT count(*) FROM pgjobs.enqueue_many(jobs => \'[{"kind": "k"}]\')').fetchone() == (1,)
    claimed = conn.execute("SELECT id, lease_token FROM pgjobs.claim(worker => 'w')").fetchone()
    assert claimed is not None
    jid, token = claimed
    assert conn.execute(
        "SELECT pgjobs.renew_lease(id => %s, lease_token => %s, lease => '1 minute')", [jid, token]
    ).fetchone() == (True,)
    assert conn.execute(
        "SELECT pgjobs.checkpoint(id => %s, lease_token => %s, checkpoint => '{}')", [jid, token]
    ).fetchone() == (True,)
    assert conn.execute(
        "SELECT pgjobs.progress(id => %s, lease_token => %s, progress => '{}')", [jid, token]
    ).fetchone() == (True,)
    assert conn.execute("SELECT pgjobs.complete(id => %s, lease_token => %s)", [jid, token]).fetchone() == (True,)
    assert conn.execute("SELECT pgjobs.complete_many(ids => '{}', lease_tokens => '{}')").fetchone() == (0,)
    assert conn.execute("SELECT pgjobs.purge(succeeded_before => '1 day', failed_before => '1 day')").fetchone() == (0,)
    conn.execute("SELECT pgjobs.configure_queue(queue => 'q')")
    assert conn.execute("SELECT count(*) FROM pgjobs.job_status(id => %s)", [jid]).fetchone() == (1,)
    assert conn.execute("SELECT count(*) FROM pgjobs.stats()").fetchone() == (2,)  # default: succeeded, pending
    assert conn.execute("SELECT count(*) FROM pgjobs.list_jobs()").fetchone() == (2,)
    conn.execute("SELECT pgjobs.worker_heartbeat(worker => 'w', meta => '{}')")
    assert conn.execute("SELECT count(*) FROM pgjobs.list_workers()").fetchone() == (1,)
    assert conn.execute("SELECT pgjobs.reap_workers(stale_after => '1 hour')").fetchone() == (0,)
