"""enqueue_many's one-pass path (plain specs: no batch, dependency, unique key or bounded queue) checks
each spec inside its INSERT instead of in a pass of its own. These tests hold it to the same rules as
``_check_specs`` (the wording pass every other path uses): for random specs built from valid and invalid
values of every key, the call fails with exactly the PJ002 message ``_check_specs`` gives and changes
nothing, or succeeds and stores exactly what the spec says (defaults where a key is absent or null)."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ABSENT = object()

# Each key's candidate values: valid ones and ones _check_specs refuses (ABSENT: the key is left out).
VALUES: dict[str, list[Any]] = {
    "kind": ["k", "other.kind", "", 5, None, ["k"], {"a": 1}],
    "queue": [ABSENT, "q", "default", "", 5, None, True],
    "payload": [ABSENT, {"a": 1}, [1, 2], "text", 3, None],
    "meta": [ABSENT, {"m": 1}, {}, None, [], "x"],
    "priority": [ABSENT, 0, 5, 5.0, -32768, 32767, 5.5, 32768, "5", None, True],
    "max_attempts": [ABSENT, 1, 3, 2.0, 0, 2.5, "3", None, 2147483648],
    "run_at": [ABSENT, None, "2099-01-01T00:00:00Z", "2001-02-03 04:05:06+00", "not a date", "2030-13-45", 5],
    "unique_key": [ABSENT, None, 5, {"a": 1}],
    "unique_live_only": [ABSENT, True, False, None, "true", 1],
    "group_key": [ABSENT, "g", None, 5],
    "ref": [ABSENT, "r", 7, None, {"x": 1}, [1]],
    "bogus": [ABSENT, ABSENT, ABSENT, 1],
}
# a spec is usually mostly valid, so that each run meets the rules one at a time
COMMON = {"kind": "k", "queue": ABSENT, "payload": {"a": 1}}


def spec_strategy() -> st.SearchStrategy[Any]:
    def build(choices: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in choices.items() if v is not ABSENT}

    keyed = st.fixed_dictionaries(
        {
            key: st.one_of(st.just(COMMON[key]), st.sampled_from(values)) if key in COMMON else st.sampled_from(values)
            for key, values in VALUES.items()
        }
    ).map(build)
    plain = st.sampled_from([{"kind": "k"}, {"kind": "k", "queue": "q", "payload": {"n": 1}}])
    scalar = st.sampled_from([5, "x", None, [1]])
    return st.one_of(plain, plain, keyed, keyed, keyed, scalar)


def _check_specs_error(conn: psycopg.Connection[Any], jobs: list[Any]) -> str | None:
    try:
        conn.execute("SELECT pgjobs._check_specs(%s::jsonb, 'jobs')", (json.dumps(jobs),))
    except psycopg.Error as exc:
        assert exc.sqlstate == "PJ002", exc
        return str(exc.diag.message_primary)
    return None


def _expected_row(spec: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    def get(key: str, default: Any) -> Any:
        value = spec.get(key)
        return default if value is None else value

    run_at = spec.get("run_at")
    run_at_value = dt.datetime.fromisoformat(run_at.replace("Z", "+00:00")) if isinstance(run_at, str) else None
    return {
        "kind": spec["kind"],
        "queue": get("queue", "default"),
        "payload": spec.get("payload", {}),
        "meta": spec.get("meta", {}),
        "priority": int(Decimal(str(get("priority", 0)))),
        "max_attempts": int(Decimal(str(get("max_attempts", 20)))),
        "state": "scheduled" if run_at_value is not None and run_at_value > now else "pending",
        "run_at": run_at_value,
        "unique_key": None,
        "unique_live_only": get("unique_live_only", False),
        "group_key": spec.get("group_key"),
    }


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=st.lists(spec_strategy(), min_size=1, max_size=4))
def test_one_pass_path_follows_check_specs(conn: psycopg.Connection[Any], jobs: list[Any]) -> None:
    before = conn.execute("SELECT count(*), coalesce(max(id), 0) FROM pgjobs.jobs").fetchone()
    refused = _check_specs_error(conn, jobs)
    try:
        rows = conn.execute(
            "SELECT ref, id, created, batch_id FROM pgjobs.enqueue_many(jobs => %s::jsonb)", (json.dumps(jobs),)
        ).fetchall()
    except psycopg.Error as exc:
        assert refused is not None, f"refused specs _check_specs accepts: {jobs}: {exc}"
        assert exc.sqlstate == "PJ002"
        assert exc.diag.message_primary == refused
        after = conn.execute("SELECT count(*), coalesce(max(id), 0) FROM pgjobs.jobs").fetchone()
        assert after == before, "a refused call changed the jobs table"
        return
    assert refused is None, f"accepted specs _check_specs refuses ({refused}): {jobs}"
    now = conn.execute("SELECT now()").fetchone()[0]
    assert [r[2] for r in rows] == [True] * len(jobs) and all(r[3] is None for r in rows)
    assert [r[0] for r in rows] == [None if s.get("ref") is None else str(s["ref"]) for s in jobs]
    ids = [r[1] for r in rows]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for spec, job_id in zip(jobs, ids, strict=True):
        got = conn.execute(
            "SELECT kind, queue, payload, meta, priority, max_attempts, state::text, run_at, created_at,"
            " unique_key, unique_live_only, group_key FROM pgjobs.jobs WHERE id = %s",
            (job_id,),
        ).fetchone()
        assert got is not None
        want = _expected_row(spec, now)
        actual = dict(
            zip(
                [
                    "kind",
                    "queue",
                    "payload",
                    "meta",
                    "priority",
                    "max_attempts",
                    "state",
                    "run_at",
                    "created_at",
                    "unique_key",
                    "unique_live_only",
                    "group_key",
                ],
                got,
                strict=True,
            )
        )
        if want["run_at"] is None:
            want["run_at"] = actual["created_at"]  # an absent run_at means now
        actual.pop("created_at")
        assert actual == want, spec


def test_a_bad_timestamp_is_refused_by_name_and_changes_nothing(conn: psycopg.Connection[Any]) -> None:
    jobs = [{"kind": "k", "run_at": "2099-01-01T00:00:00Z"}, {"kind": "k", "ref": "b", "run_at": "tomorrowish"}]
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT * FROM pgjobs.enqueue_many(jobs => %s::jsonb)", (json.dumps(jobs),))
    assert info.value.sqlstate == "PJ002"
    assert "jobs[1] (ref b)" in str(info.value) and "tomorrowish" in str(info.value)
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone() == (0,)


def test_specs_routed_to_the_general_path_keep_their_rules(conn: psycopg.Connection[Any]) -> None:
    """A unique key or a bounded queue takes the general path; both paths return rows alike."""
    conn.execute("SELECT pgjobs.configure_queue('bounded', max_length => 10)")
    rows = conn.execute(
        "SELECT ref, created FROM pgjobs.enqueue_many(jobs => %s::jsonb)",
        (
            json.dumps(
                [
                    {"kind": "k", "ref": "a"},
                    {"kind": "k", "unique_key": "u", "ref": "b"},
                    {"kind": "k", "queue": "bounded", "ref": "c"},
                ]
            ),
        ),
    ).fetchall()
    assert rows == [("a", True), ("b", True), ("c", True)]
    with pytest.raises(psycopg.Error) as info:
        conn.execute(
            "SELECT * FROM pgjobs.enqueue_many(jobs => %s::jsonb)",
            (json.dumps([{"kind": "k", "queue": "bounded"}] * 10),),
        )
    assert info.value.sqlstate == "PJ001"
    # the default queue, when bounded, is reached by specs that name no queue
    conn.execute("SELECT pgjobs.configure_queue('default', max_length => 2)")
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT * FROM pgjobs.enqueue_many(jobs => %s::jsonb)", (json.dumps([{"kind": "k"}] * 2),))
    assert info.value.sqlstate == "PJ001"


# Keys only the general path takes (a string unique key, dependencies): _check_specs_fast meets them there.
GENERAL_VALUES: dict[str, list[Any]] = {
    "unique_key": [ABSENT, "u1", "u2"],
    "depends_on": [ABSENT, ABSENT, [], [{"ref": "r"}], "x", None],
}


def general_spec_strategy() -> st.SearchStrategy[Any]:
    extra = st.fixed_dictionaries({k: st.sampled_from(v) for k, v in GENERAL_VALUES.items()})

    def merge(pair: tuple[Any, dict[str, Any]]) -> Any:
        spec, more = pair
        if not isinstance(spec, dict):
            return spec
        return {**spec, **{k: v for k, v in more.items() if v is not ABSENT}}

    return st.tuples(spec_strategy(), extra).map(merge)


def _error(conn: psycopg.Connection[Any], query: str, jobs: Any) -> str | None:
    """The PJ002 message of ``query`` on ``jobs``, or None; whatever it did is rolled back."""
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(query, (json.dumps(jobs),)).fetchall()
    except psycopg.Error as exc:
        assert exc.sqlstate == "PJ002", exc
        return str(exc.diag.message_primary)
    return None


def _one_pass_takes(jobs: Any) -> bool:
    """Whether enqueue_many would send ``jobs`` down _insert_plain_specs (no bounded queue exists here)."""
    return isinstance(jobs, list) and not any(
        isinstance(s, dict) and ("depends_on" in s or isinstance(s.get("unique_key"), str)) for s in jobs
    )


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    jobs=st.one_of(
        st.lists(general_spec_strategy(), min_size=1, max_size=4),
        st.sampled_from([[], {}, 5, "x", None, {"kind": "k"}]),
    )
)
def test_the_three_spec_checks_agree(conn: psycopg.Connection[Any], jobs: Any) -> None:
    """_check_specs (the wording pass), _check_specs_fast (the general path's pre-filter, which calls
    _check_specs only when some spec might be bad) and the check inside _insert_plain_specs' one pass are
    three copies of one set of rules: on any input they refuse alike, with the same message, or accept
    alike."""
    slow = _error(conn, "SELECT pgjobs._check_specs(%s::jsonb, 'jobs')", jobs)
    fast = _error(conn, "SELECT pgjobs._check_specs_fast(%s::jsonb, 'jobs')", jobs)
    assert fast == slow, f"_check_specs_fast: {fast!r}, _check_specs: {slow!r}, specs {jobs}"
    if _one_pass_takes(jobs):
        one_pass = _error(conn, "SELECT * FROM pgjobs._insert_plain_specs(%s::jsonb)", jobs)
        assert one_pass == slow, f"_insert_plain_specs: {one_pass!r}, _check_specs: {slow!r}, specs {jobs}"
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone() == (0,)
