"""A hostile probe of every public SQL function: only PJ errors escape, and a call
that raises changes nothing.

The functions and their argument types come from pg_proc, so a function added later is probed too. Each
example calls a few functions with hostile values drawn per argument type: NULLs, empty, huge (8,000+
bytes) and odd unicode strings, boundary and huge numbers, infinite and absurd timestamps, intervals of
100 million years, multidimensional arrays, deep or odd JSON, job specs full of such values. The database
starts with jobs in every state, a batch, a dependency, a schedule and a worker, and keeps whatever the
successful calls did. After each call:

* an error must be SQLSTATE class PJ with a message of bounded size, and the digest of every pgjobs table
  must be what it was before the call;
* after a success, the model's invariants (tests/helpers/invariants.py) must hold.

A deterministic sweep (the last test) adds what sampling may miss: every argument of every public function
at each extreme of its type in turn (the largest and smallest bigint, integer and smallint, intervals and
times at the ends of their ranges, empty, NULL-holding and two-dimensional arrays, JSON of the wrong shape).

``PGJOBS_FUZZ_EXAMPLES`` sets the number of examples (CI: the default below, well under a minute); the examples
are the same on every run unless ``PGJOBS_FUZZ_RANDOM`` is set.
"""

from __future__ import annotations

import json
import os
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from tests.helpers.foundation import call, claim, enqueue, module_conn
from tests.helpers.invariants import digest, violations

__all__ = ["module_conn"]  # the fixture, imported for pytest

STATES = ["waiting", "scheduled", "pending", "active", "succeeded", "failed", "cancelled"]
EXAMPLES = int(os.environ.get("PGJOBS_FUZZ_EXAMPLES", "1000"))
Conn = psycopg.Connection[Any]

# -------------------------------------------------------------------------------------------- values
_NAMEY = st.sampled_from(["default", "k", "q", "w1", "s1", "taken", "pending", "UTC", "* * * * *", "@hourly"])
_ODD = st.sampled_from(
    ["'; DROP TABLE pgjobs.jobs; --", "0 0 31 2 *", "61 * * * *", "Mars/Olympus", "America/New_York", "\\", '"', "%s"]
)
_HUGE = st.builds(
    lambda n, c: c * n, st.sampled_from([199, 200, 201, 1000, 1001, 2000, 2700, 3000, 8001, 20000]),
    st.sampled_from(["x", "é", "😀"]),
)  # fmt: skip
_TEXT = st.one_of(
    st.none(), st.just(""), _NAMEY, _ODD, _HUGE,
    st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=40),
)  # fmt: skip
_INT4 = st.one_of(
    st.none(), st.sampled_from([0, 1, 2, 3, -1, 100, 10_000, 10_001, 2**30, 536870662, 2**31 - 1, -(2**31)]),
    st.integers(-(2**31), 2**31 - 1),
)  # fmt: skip
_INT8 = st.one_of(_INT4, st.sampled_from([2**62, 2**63 - 1, 2**63 - 2, -(2**63)]), st.integers(1, 40))
_INT2 = st.one_of(st.none(), st.sampled_from([0, 1, -1, 32767, -32768]))
_BOOL = st.one_of(st.none(), st.booleans())
_REAL = st.one_of(st.none(), st.sampled_from(["0", "-1", "0.5", "1", "1.5", "NaN", "Infinity", "-Infinity", "3e38"]))
_TIMESTAMP = st.one_of(
    st.none(),
    st.sampled_from([
        "infinity", "-infinity", "now", "epoch", "294276-12-31 23:59:59+00", "4713-01-01 00:00:00+00 BC",
        "9999-12-31 23:59:59+00", "0001-01-01 00:00:00+00", "2026-12-01 12:00:00+00", "1969-12-31 23:59:59+00",
        "10000-01-01 00:00:00+00", "9999-12-31 23:59:59.999999+00",
    ]),
    st.datetimes(timezones=st.just(__import__("datetime").timezone.utc)).map(lambda d: d.isoformat()),
)  # fmt: skip
_INTERVAL = st.one_of(
    st.none(),
    st.sampled_from([
        "0", "-1 second", "1 microsecond", "30 seconds", "1 day", "100 years", "101 years", "100000000 years",
        "-100000000 years", "178000000 years", "2147483647 days", "-2147483648 days", "2562047788 hours",
        "1 month -30 days", "@ 1 minute ago", "36500 days", "2147483647 months", "-2147483648 months",
        "9223372036854775807 microseconds", "-9223372036854775808 microseconds",
    ]),
)  # fmt: skip


def _deep(depth: int, leaf: Any) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


_JSON_SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
    _TEXT.filter(lambda v: v is not None),
)  # fmt: skip
_JSON_ANY = st.recursive(
    _JSON_SCALAR,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_TEXT.filter(bool), inner, max_size=4)),
    max_leaves=12,
)


def _spec_values(ids: list[int]) -> st.SearchStrategy[dict[str, Any]]:
    field = {
        "queue": _JSON_SCALAR, "payload": _JSON_ANY, "meta": _JSON_ANY,
        "run_at": st.one_of(_TIMESTAMP, _JSON_SCALAR), "priority": _JSON_SCALAR, "max_attempts": _JSON_SCALAR,
        "unique_key": _JSON_SCALAR, "unique_live_only": _JSON_SCALAR, "group_key": _JSON_SCALAR,
        "ref": _JSON_SCALAR,
        "depends_on": st.one_of(_JSON_ANY, st.lists(st.fixed_dictionaries({
            "job": st.one_of(st.sampled_from(ids), _JSON_SCALAR),
            "on": st.one_of(st.sampled_from(["success", "failure", "complete"]), _JSON_SCALAR)}), max_size=3)),
    }  # fmt: skip
    kind = st.one_of(st.sampled_from(["k", "a", "c"]), _JSON_SCALAR)
    plain = st.fixed_dictionaries({"kind": kind}, optional=field)
    return plain


def _jsonb(ids: list[int]) -> st.SearchStrategy[str | None]:
    return st.one_of(
        st.none(),
        st.sampled_from(["{}", "[]", "null", "0", '""', json.dumps(_deep(300, 1)), json.dumps({"x" * 3000: 1})]),
        _JSON_ANY.map(json.dumps),
        st.lists(_spec_values(ids), max_size=4).map(json.dumps),
        _spec_values(ids).map(json.dumps),
        st.dictionaries(st.sampled_from(["k", "a", "kind", "c"]), _JSON_SCALAR, max_size=3).map(json.dumps),
    )


def _quote(v: str | None) -> str:
    if v is None:
        return "NULL"
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _array(elem: st.SearchStrategy[Any]) -> st.SearchStrategy[str | None]:
    as_text = elem.map(lambda v: None if v is None else str(v))
    one_d = st.lists(as_text, max_size=5).map(lambda xs: "{" + ",".join(_quote(x) for x in xs) + "}")
    two_d = st.lists(st.tuples(as_text, as_text), min_size=1, max_size=3).map(
        lambda rows: "{" + ",".join("{" + _quote(a) + "," + _quote(b) + "}" for a, b in rows) + "}"
    )
    return st.one_of(st.none(), st.just("{}"), one_d, two_d)


def strategies(ids: list[int], tokens: list[str], names: list[str]) -> dict[str, st.SearchStrategy[Any]]:
    known_ids = st.sampled_from(ids)
    uuids = st.one_of(st.none(), st.sampled_from(tokens), st.uuids().map(str))
    text = st.one_of(_TEXT, st.sampled_from(names))
    scalars: dict[str, st.SearchStrategy[Any]] = {
        "text": text,
        "bigint": st.one_of(_INT8, known_ids),
        "integer": _INT4,
        "smallint": _INT2,
        "boolean": _BOOL,
        "real": _REAL,
        "jsonb": _jsonb(ids),
        "timestamp with time zone": _TIMESTAMP,
        "interval": _INTERVAL,
        "uuid": uuids,
        "pgjobs.job_state": st.one_of(st.none(), st.sampled_from(STATES)),
        # enqueue_staged's staging table: relations that exist but are not the caller's temp staging table
        # (a name that does not exist fails the caller's own ::regclass cast, before any pgjobs code runs)
        "regclass": st.one_of(
            st.none(), st.sampled_from(["pgjobs.jobs", "pgjobs.queues", "pg_catalog.pg_class", "0", "1"])
        ),
    }
    out = dict(scalars)
    for name, elem in scalars.items():
        out[name + "[]"] = _array(elem.map(lambda v: v if not isinstance(v, str) or "\x00" not in v else None))
    return out


# ------------------------------------------------------------------------------------------- harness
def public_functions(conn: Conn) -> list[tuple[str, list[tuple[str, str]], int]]:
    rows = conn.execute(
        "SELECT p.proname::text, p.proargnames[1:p.pronargs],"
        " array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) AS t), p.pronargdefaults"
        " FROM pg_proc AS p WHERE p.pronamespace = 'pgjobs'::regnamespace AND p.proname NOT LIKE '\\_%'"
        " ORDER BY 1"
    ).fetchall()
    return [(r[0], list(zip(r[1] or [], r[2], strict=True)), r[3]) for r in rows]


def populate(conn: Conn) -> tuple[list[int], list[str], list[str]]:
    """Jobs in every state, a batch with a dependency, a unique key, a schedule, a worker."""
    ids = [enqueue(conn, "k", unique_key="taken")["id"]]
    ids += [enqueue(conn, "k", run_at="2999-01-01T00:00:00Z")["id"]]
    ids += [r["id"] for r in call(conn, "enqueue_many", jobs=[{"kind": "a", "ref": "a"},
            {"kind": "b", "ref": "b", "depends_on": [{"ref": "a", "on": "success"}]}], as_batch=True)]  # fmt: skip
    ids += [enqueue(conn, "k", queue="q")["id"] for _ in range(4)]
    tokens = [str(j["lease_token"]) for j in claim(conn, "w1", queues=["q"], max_jobs=3)]
    call(conn, "complete", id=ids[4], lease_token=tokens[0])
    call(conn, "dead_letter", id=ids[5], lease_token=tokens[1], error="boom")
    call(conn, "cancel", id=ids[7])
    call(conn, "configure_queue", queue="q", max_length=100, fair=True)
    call(conn, "upsert_schedule", name="s1", kind="k", cron="* * * * *", next_run_at="2026-01-01T00:00:00Z")
    call(conn, "worker_heartbeat", worker="w1", meta={"host": "h"})
    return [*ids, 10**6], tokens, ["s1", "w1", "q", "taken"]


def _call(conn: Conn, name: str, args: list[tuple[str, str, Any]]) -> None:
    parts = sql.SQL(", ").join(
        sql.SQL("{} => {}::{}").format(sql.Identifier(a), sql.Placeholder(), sql.SQL(t)) for a, t, _v in args
    )
    query = sql.SQL("SELECT * FROM pgjobs.{}({})").format(sql.Identifier(name), parts)
    with conn.transaction():
        conn.execute("SET LOCAL statement_timeout = '10s'")
        conn.execute(query, [None if v is None else (v if isinstance(v, str) else str(v)) for _a, _t, v in args])


@pytest.fixture(scope="module")
def probe(module_conn: Conn) -> tuple[Conn, list[Any], dict[str, st.SearchStrategy[Any]]]:
    ids, tokens, names = populate(module_conn)
    return module_conn, public_functions(module_conn), strategies(ids, tokens, names)


@pytest.mark.timeout(max(600, EXAMPLES // 10))
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=os.environ.get("PGJOBS_FUZZ_RANDOM") is None,
)
@given(data=st.data())
def test_hostile_arguments_raise_only_pj_errors_and_change_nothing(
    probe: tuple[Conn, list[Any], dict[str, st.SearchStrategy[Any]]], data: st.DataObject
) -> None:
    conn, functions, strats = probe
    for _ in range(data.draw(st.integers(1, 3), label="calls")):
        name, params, ndefaults = data.draw(st.sampled_from(functions), label="function")
        args: list[tuple[str, str, Any]] = []
        for i, (arg, typ) in enumerate(params):
            optional = i >= len(params) - ndefaults
            if optional and data.draw(st.booleans(), label=f"omit {arg}"):
                continue
            args.append((arg, typ, data.draw(strats[typ], label=arg)))
        before = digest(conn)
        try:
            _call(conn, name, args)
        except psycopg.Error as exc:
            shown = [(a, (v[:60] + "...") if isinstance(v, str) and len(v) > 60 else v) for a, _t, v in args]
            assert (exc.sqlstate or "").startswith("PJ"), f"{name}({shown}) raised {exc.sqlstate}: {exc}"
            message = exc.diag.message_primary or ""
            assert 0 < len(message) <= 2000, f"{name}: message of {len(message)} characters"
            assert digest(conn) == before, f"{name}({shown}) raised {exc.sqlstate} and changed rows"
        else:
            broken = violations(conn)
            assert broken == {}, f"after {name}({[(a, v) for a, _t, v in args]}): {broken}"


def test_the_probe_covers_every_public_function(
    probe: tuple[Conn, list[Any], dict[str, st.SearchStrategy[Any]]],
) -> None:
    _conn, functions, strats = probe
    assert len(functions) >= 40
    missing = {typ for _n, params, _d in functions for _a, typ in params} - set(strats)
    assert missing == set(), "give these argument types a strategy"


# ----------------------------------------------------------------------------------- boundary sweep
# Deterministic, where the random probe above only samples: every argument of every public function, in turn,
# at each extreme of its type (NULL, the type's smallest and largest values, empty and multidimensional arrays,
# intervals and times at the ends of their ranges, JSON that is not what is asked for), the other arguments
# left out when optional and plain otherwise. Each call must answer or raise PJ002-like PJ errors that change
# nothing, as above.
_BIG = "x" * 8001
EXTREMES: dict[str, list[str | None]] = {
    "bigint": [None, "0", "-1", str(2**63 - 1), str(-(2**63)), str(2**62), str(2**63 - 2)],
    "integer": [None, "0", "-1", str(2**31 - 1), str(-(2**31))],
    "smallint": [None, "0", "-1", "32767", "-32768"],
    "boolean": [None],
    "real": [None, "NaN", "Infinity", "-Infinity", "3e38", "-3e38", "0"],
    "text": [None, "", _BIG, " "],
    "jsonb": [None, "null", "[]", "{}", '""', "0", "[[]]", "[null]", '{"": null}'],
    "interval": [
        None, "0", "-1 microsecond", "1 microsecond", "100 years", "36525 days", "36526 days", "178000000 years",
        "-178000000 years", "2147483647 days", "-2147483648 days", "2147483647 months", "-2147483648 months",
        "9223372036854775807 microseconds", "-9223372036854775808 microseconds",
    ],
    "timestamp with time zone": [
        None, "infinity", "-infinity", "294276-12-31 23:59:59+00", "4713-01-01 00:00:00+00 BC", "epoch",
        "9999-12-31 23:59:59.999999+00", "10000-01-01 00:00:00+00", "0001-01-01 00:00:00+00",
    ],
    "uuid": [None, "00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff"],
    "pgjobs.job_state": [None, "waiting", "active", "cancelled"],
    "regclass": [None, "0", "pgjobs.jobs", "pg_catalog.pg_class"],
}  # fmt: skip
_ARRAY_EXTREMES: list[str | None] = [None, "{}", "{NULL}", "{NULL,NULL}"]


def _extremes(typ: str) -> list[str | None]:
    if typ.endswith("[]"):
        elem = typ[:-2]
        picks = [v for v in EXTREMES[elem] if v is not None and v != _BIG][:4]
        one_d = ["{" + ",".join(_quote(v) for v in picks) + "}"] if picks else []
        two_d = ["{{" + _quote(picks[0]) + "},{" + _quote(picks[-1]) + "}}"] if picks else []
        return [*_ARRAY_EXTREMES, *one_d, *two_d]
    return EXTREMES[typ]


def _plain(arg: str, typ: str, ids: list[int], tokens: list[str]) -> str | None:
    """A value the argument takes in an ordinary call (for the arguments not under test)."""
    by_name: dict[str, str] = {
        "cron": "* * * * *", "timezone": "UTC", "name": "s1", "worker": "w1", "queue": "default", "kind": "k",
        "jobs": '[{"kind": "k"}]', "job": '{"kind": "k"}', "kinds": "{k}", "queues": "{default}",
        "names": "{s1}", "error": "boom", "missed": "once", "status_events": "all", "staging": "pgjobs.jobs",
    }  # fmt: skip
    if arg in by_name:
        return by_name[arg]
    plain: dict[str, str] = {
        "bigint": str(ids[0]), "integer": "1", "smallint": "0", "boolean": "false", "real": "0.5", "text": "k",
        "jsonb": "{}", "interval": "30 seconds", "timestamp with time zone": "2026-12-01 12:00:00+00",
        "uuid": tokens[0], "pgjobs.job_state": "pending", "regclass": "pgjobs.jobs",
    }  # fmt: skip
    if typ.endswith("[]"):
        return "{" + _quote(plain[typ[:-2]]) + "}"
    return plain[typ]


def test_every_argument_at_its_extremes_gets_a_pj_error_or_an_answer(
    probe: tuple[Conn, list[Any], dict[str, st.SearchStrategy[Any]]],
) -> None:
    conn, functions, _strats = probe
    ids = [int(r[0]) for r in conn.execute("SELECT id FROM pgjobs.jobs ORDER BY id LIMIT 3").fetchall()] or [1]
    tokens = [str(r[0]) for r in conn.execute("SELECT lease_token FROM pgjobs.jobs WHERE lease_token IS NOT NULL")]
    tokens = tokens or ["00000000-0000-0000-0000-000000000001"]
    failures: list[str] = []
    calls = 0
    for name, params, ndefaults in functions:
        for i, (arg, typ) in enumerate(params):
            for value in _extremes(typ):
                args = [
                    (a, t, value if j == i else _plain(a, t, ids, tokens))
                    for j, (a, t) in enumerate(params)
                    if j == i or j < len(params) - ndefaults
                ]
                before = digest(conn)
                calls += 1
                try:
                    _call(conn, name, args)
                except psycopg.Error as exc:
                    shown = f"{name}({arg} => {value if value is None or len(value) < 60 else value[:60] + '...'})"
                    if not (exc.sqlstate or "").startswith("PJ"):
                        failures.append(f"{shown}: {exc.sqlstate} {exc.diag.message_primary}")
                    elif digest(conn) != before:
                        failures.append(f"{shown}: raised {exc.sqlstate} and changed rows")
                else:
                    broken = violations(conn)
                    if broken:
                        failures.append(f"{name}({arg} => {value!r}): {broken}")
    assert failures == [], "\n".join(failures)
    assert calls > 900  # every argument of some 90 functions, several values each
