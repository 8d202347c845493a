"""``pgjobs.enqueue_arrays`` (sql/enqueue.sql): enqueue_many's contract for jobs given as columns (kind,
payload, queue), the bulk path the client takes for plain specs (tests/client/test_enqueue_columns.py).

Each test holds the arrays path to what the JSON path does with the same specs: the rows stored, the ids'
order, the refusals (PJ002 naming the element, PJ001 on a bounded queue; nothing changed), the status events
and wake-ups, and capacity under racing callers."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from tests.helpers.foundation import drain, listen, raises_pj, run_threads, snapshot

Conn = psycopg.Connection[Any]
STORED = "kind, queue, payload, meta, state::text, priority, max_attempts, unique_key, group_key, attempt"


def arrays(conn: Conn, kinds: Any, payloads: Any = None, queues: Any = None) -> list[int]:
    rows = conn.execute(
        "SELECT id FROM pgjobs.enqueue_arrays(kinds => %s, payloads => %s, queues => %s)",
        (kinds, None if payloads is None else Jsonb(payloads), queues),
    ).fetchall()
    return [r[0] for r in rows]


def stored(conn: Conn, ids: list[int]) -> list[tuple[Any, ...]]:
    return conn.execute(
        f"SELECT {STORED}, run_at = created_at FROM pgjobs.jobs WHERE id = ANY (%s) ORDER BY array_position(%s, id)",
        (ids, ids),
    ).fetchall()


def test_arrays_store_what_enqueue_many_stores_in_the_arrays_order(conn: Conn) -> None:
    kinds = ["a", "b", "a", "c"]
    payloads = [{"n": 1}, {"list": [1, "two"]}, {"s": "text"}, {}]
    queues = ["q1", "q2", "q1", "default"]
    ids = arrays(conn, kinds, payloads, queues)
    specs = [{"kind": k, "payload": p, "queue": q} for k, p, q in zip(kinds, payloads, queues, strict=True)]
    many = [r[0] for r in conn.execute("SELECT id FROM pgjobs.enqueue_many(%s)", (Jsonb(specs),)).fetchall()]
    assert ids == sorted(ids) and len(set(ids)) == 4
    assert stored(conn, ids) == stored(conn, many)
    assert [r[:3] for r in stored(conn, ids)] == [(k, q, p) for k, p, q in zip(kinds, payloads, queues, strict=True)]
    assert all(r[4] == "pending" and r[-1] for r in stored(conn, ids))  # pending now, run_at = created_at


def test_null_payloads_and_queues_take_the_defaults(conn: Conn) -> None:
    ids = arrays(conn, ["x", "y"])
    assert [(r[0], r[1], r[2]) for r in stored(conn, ids)] == [("x", "default", {}), ("y", "default", {})]
    assert arrays(conn, []) == []


@pytest.mark.parametrize(
    ("kinds", "payloads", "queues", "fragments"),
    [
        (None, None, None, ["kinds must not be NULL"]),
        ([["a", "b"]], None, None, ["kinds must be a one-dimensional array"]),
        (["a", ""], None, None, ["jobs[1]: kind must be a non-empty string"]),
        (["a", None], None, None, ["jobs[1]: kind must be a non-empty string", "NULL"]),
        (["a", "k" * 1001], None, None, ["jobs[1]: kind must be at most 1000 bytes"]),
        (["a", "b"], None, ["q", ""], ["jobs[1]: queue must be a non-empty string"]),
        (["a", "b"], None, ["q", None], ["jobs[1]: queue must be a non-empty string", "NULL"]),
        (["a", "b"], None, ["q", "é" * 501], ["jobs[1]: queue must be at most 1000 bytes"]),
        (["a", "b"], [{}, None], None, ["jobs[1]: payload must not be null"]),
        (["a", "b"], [{}], None, ["payloads must be a JSON array with one payload per kind (2)"]),
        (["a", "b"], {"a": 1}, None, ["payloads must be a JSON array"]),
        (["a", "b"], None, ["q"], ["queues must have one element per kind (2), got 1"]),
    ],
)
def test_a_bad_element_is_refused_by_name_and_changes_nothing(
    conn: Conn, kinds: Any, payloads: Any, queues: Any, fragments: list[str]
) -> None:
    arrays(conn, ["before"])
    was = snapshot(conn)
    with raises_pj("PJ002", *fragments):
        arrays(conn, kinds, payloads, queues)
    assert snapshot(conn) == was


def test_more_than_100000_jobs_are_refused(conn: Conn) -> None:
    with raises_pj("PJ002", "kinds must have at most 100000 elements"):
        arrays(conn, ["k"] * 100_001)


def test_a_bounded_queue_refuses_what_does_not_fit_and_changes_nothing(conn: Conn) -> None:
    conn.execute("SELECT pgjobs.configure_queue('small', max_length => 3)")
    assert len(arrays(conn, ["k", "k"], None, ["small", "other"])) == 2
    was = snapshot(conn)
    with raises_pj("PJ001", "'small' is full"):
        arrays(conn, ["k", "k", "k", "k"], None, ["other", "small", "small", "small"])  # 1 + 3 > 3
    assert snapshot(conn) == was
    conn.execute("SELECT pgjobs.configure_queue('default', max_length => 1)")
    with raises_pj("PJ001", "'default' is full"):
        arrays(conn, ["k", "k"])  # no queues: every job in 'default'


def test_racing_callers_never_overfill_a_bounded_queue(connect: ConnectFactory, conn: Conn) -> None:
    conn.execute("SELECT pgjobs.configure_queue('race', max_length => 25)")

    def fill(i: int) -> int:
        c = connect()
        made = 0
        for _ in range(6):
            try:
                made += len(arrays(c, ["k"] * 2, None, ["race", "race"]))
            except psycopg.Error as exc:
                assert exc.sqlstate == "PJ001", exc
        return made

    made = run_threads(4, fill)
    live = conn.execute("SELECT count(*) FROM pgjobs.jobs WHERE queue = 'race'").fetchone()
    assert live == (sum(made),) and sum(made) == 24  # 12 pairs fit in 25; a 13th pair would not


def test_callers_filling_two_bounded_queues_in_opposite_orders_never_deadlock(
    connect: ConnectFactory, conn: Conn
) -> None:
    """Capacity is reserved queue by queue under each queue's lock, in name order on both bulk paths: columns
    listing the queues either way round, and enqueue_many's JSON, race without a deadlock (40P01)."""
    for q in ("qa", "qb"):
        conn.execute("SELECT pgjobs.configure_queue(%s, max_length => 100)", (q,))

    def fill(i: int) -> int:
        c = connect()
        queues = ["qb", "qa"] if i % 2 else ["qa", "qb"]
        for _ in range(10):
            if i == 3:
                c.execute("SELECT pgjobs.enqueue_many(%s)", (Jsonb([{"kind": "k", "queue": q} for q in queues]),))
            else:
                arrays(c, ["k", "k"], None, queues)
        return 20

    made = run_threads(4, fill)
    counts = conn.execute("SELECT queue, count(*) FROM pgjobs.jobs GROUP BY queue ORDER BY queue").fetchall()
    assert counts == [("qa", sum(made) // 2), ("qb", sum(made) // 2)] and sum(made) == 80


def test_events_and_one_wake_per_queue(connect: ConnectFactory, conn: Conn) -> None:
    listener = connect()
    listen(listener, "pgjobs_wake")
    conn.execute("SELECT pgjobs.configure_queue('quiet', status_events => 'none')")
    ids = arrays(conn, ["e"] * 4, [{"i": i} for i in range(4)], ["qa", "qb", "qa", "quiet"])
    wakes = sorted(p for c, p in drain(listener) if c == "pgjobs_wake")
    assert wakes == ["qa", "qb", "quiet"]
    events = conn.execute("SELECT id, state::text, queue, kind, attempt FROM pgjobs.read_events()").fetchall()
    assert events == [(i, "pending", q, "e", 0) for i, q in zip(ids[:3], ["qa", "qb", "qa"], strict=True)]


def test_rolled_back_arrays_leave_no_job_and_no_event(connect: ConnectFactory, conn: Conn) -> None:
    own = connect(autocommit=False)
    arrays(own, ["k"] * 3)
    own.rollback()
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM pgjobs.read_events()").fetchone() == (0,)


@st.composite
def _columns(draw: st.DrawFn) -> tuple[list[Any], list[Any], list[Any]]:
    n = draw(st.integers(1, 4))
    names = st.sampled_from(["k", "other", "", None, "x" * 1001])
    kinds = draw(st.lists(names, min_size=n, max_size=n))
    queues = draw(st.lists(names, min_size=n, max_size=n))
    payloads = draw(st.lists(st.sampled_from([{}, {"a": 1}, [1], "s", None]), min_size=n, max_size=n))
    return kinds, payloads, queues


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cols=_columns())
def test_arrays_accept_exactly_what_enqueue_many_accepts(conn: Conn, cols: tuple[list[Any], ...]) -> None:
    kinds, payloads, queues = cols
    specs = [{"kind": k, "payload": p, "queue": q} for k, p, q in zip(kinds, payloads, queues, strict=True)]
    json_error = arrays_error = None
    try:
        with conn.transaction(force_rollback=True):
            conn.execute("SELECT pgjobs.enqueue_many(%s::jsonb)", (json.dumps(specs),))
    except psycopg.Error as exc:
        json_error = exc
    try:
        with conn.transaction(force_rollback=True):
            arrays(conn, kinds, payloads, queues)
    except psycopg.Error as exc:
        arrays_error = exc
    assert (json_error is None) == (arrays_error is None), (specs, json_error, arrays_error)
    if json_error is not None and arrays_error is not None:
        assert arrays_error.sqlstate == json_error.sqlstate == "PJ002"
        where = (json_error.diag.message_primary or "").split(":")[0]  # jobs[i]: the same element
        assert (arrays_error.diag.message_primary or "").startswith(where + ":"), (json_error, arrays_error)
