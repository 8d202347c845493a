"""The producer's fast paths: ``enqueue`` with tuple rows and prepared statements, and
``enqueue_copy`` (COPY into a session staging table read by ``pgjobs.enqueue_staged``). Each must store
exactly what the general path stores, keep its contract, and refuse what it refuses."""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgjobs import AsyncClient, Client, Enqueued, EnqueuedSpec, GraphError, InvalidArgument, JobState, QueueFull

COLUMNS = (
    "kind, queue, payload, meta, state, priority, max_attempts, unique_key, unique_live_only, group_key,"
    " batch_id IS NOT NULL, remaining_deps, attempt, has_dependents"
)
LATER = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)

SPECS: list[dict[str, Any]] = [
    {"kind": "email"},
    {"kind": "email", "payload": {"to": "a@example.com"}, "queue": "mail"},
    {"kind": "email", "payload": {"l": [1, "two", None]}, "priority": -3, "max_attempts": 4, "meta": {"trace": "t1"}},
    {"kind": "report", "run_at": LATER, "group_key": "tenant-1", "unique_key": "r-1", "unique_live_only": True},
    {"kind": "report", "payload": {"s": "just a string"}, "queue": "q2", "unique_key": "r-2"},
]


def _stored(conn: psycopg.Connection[Any], ids: list[int]) -> list[tuple[Any, ...]]:
    rows = conn.execute(
        f"SELECT {COLUMNS}, CASE WHEN run_at > now() + interval '1 day' THEN run_at END FROM pgjobs.jobs"
        " WHERE id = ANY (%s) ORDER BY array_position(%s, id)",
        (ids, ids),
    ).fetchall()
    assert len(rows) == len(ids)
    return rows


def _args(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k not in ("kind", "payload")}


def _general(conn: psycopg.Connection[Any], kind: str, payload: Any, **args: Any) -> Enqueued:
    """The reference: ``pgjobs.enqueue`` called by hand, every given argument named, the rest left to the
    SQL defaults (no client code involved)."""
    values = {"kind": kind, "payload": Jsonb({} if payload is None else payload), **args}
    if "meta" in values:
        values["meta"] = Jsonb(values["meta"])
    named = sql.SQL(", ").join(
        sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder(k))
        + (sql.SQL("::smallint") if k == "priority" else sql.SQL(""))
        for k in values
    )
    query = sql.SQL("SELECT id, created, state FROM pgjobs.enqueue({})").format(named)
    row = conn.execute(query, values).fetchone()
    assert row is not None
    return Enqueued(row[0], row[1], JobState(row[2]))


@pytest.fixture
def fresh_specs() -> Iterator[list[dict[str, Any]]]:
    yield [dict(s) for s in SPECS]


# ------------------------------------------------------------------------------------------------------
# enqueue: the fast path


@pytest.mark.smoke
@pytest.mark.parametrize("prepare", [True, False])
def test_fast_enqueue_stores_what_the_general_path_stores(
    dsn: str, conn: psycopg.Connection[Any], prepare: bool
) -> None:
    with Client(dsn, prepare=prepare, max_size=1) as client:
        fast, general = [], []
        for spec in SPECS:
            fast.append(client.enqueue(spec["kind"], spec.get("payload", {}), **_args(spec)))
            unique = {"unique_key": spec["unique_key"] + "-general"} if "unique_key" in spec else {}
            general.append(_general(conn, spec["kind"], spec.get("payload", {}), **{**_args(spec), **unique}))
        assert all(isinstance(e, Enqueued) and e.created for e in fast)
        assert [e.state for e in fast] == [e.state for e in general]
        strip = [
            (*r[:7], r[7] and r[7].removesuffix("-general"), *r[8:]) for r in _stored(conn, [e.id for e in general])
        ]
        assert _stored(conn, [e.id for e in fast]) == strip
        # idempotency answers through the fast path too
        again = client.enqueue("report", {}, queue="q2", unique_key="r-2")
        assert again == Enqueued(fast[4].id, False, JobState.PENDING)


@pytest.mark.parametrize("prepare", [True, False])
def test_async_fast_enqueue_stores_what_the_sync_one_stores(
    dsn: str, conn: psycopg.Connection[Any], prepare: bool
) -> None:
    async def go() -> list[Enqueued]:
        async with AsyncClient(dsn, prepare=prepare, max_size=1) as client:
            return [await client.enqueue(s["kind"], s.get("payload", {}), **_args(s)) for s in SPECS]

    made = asyncio.run(go())
    with Client(dsn, prepare=prepare) as client:
        again = [client.enqueue(s["kind"], s.get("payload", {}), **_args(s)) for s in SPECS]
    # the unique keys now answer with the async path's jobs: same rows
    assert [e.id for e in again[3:]] == [e.id for e in made[3:]] and not any(e.created for e in again[3:])
    assert _stored(conn, [e.id for e in made[:3]]) == _stored(conn, [e.id for e in again[:3]])


def _prepared(client: Client) -> int:
    with client.pool.connection() as c:
        row = c.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%%pgjobs.enqueue(%%'", prepare=False
        ).fetchone()
        assert row is not None
        return int(row[0])


def test_prepare_flag_decides_whether_the_server_keeps_a_prepared_statement(dsn: str) -> None:
    with Client(dsn, max_size=1) as client:
        client.enqueue("a")
        assert _prepared(client) == 1  # prepared on first use
        client.enqueue("a", priority=1)
        assert _prepared(client) == 2  # the full form is its own statement
    with Client(dsn, max_size=1, prepare=False) as client:
        for _ in range(8):  # past psycopg's own prepare threshold (5)
            client.enqueue("a")
            client.job_status(1)
        assert _prepared(client) == 0


def test_fast_enqueue_joins_the_callers_transaction_whatever_its_row_factory(
    dsn: str, connect: ConnectFactory, conn: psycopg.Connection[Any]
) -> None:
    own = connect(autocommit=False, row_factory=dict_row)
    with Client(dsn) as client:
        e = client.enqueue("in-tx", {"x": 1}, conn=own)
        assert isinstance(e, Enqueued) and e.state is JobState.PENDING
        own.rollback()
        assert conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone() == (0,)
        e = client.enqueue("in-tx", {"x": 1}, conn=own)
        own.commit()
        assert conn.execute("SELECT kind FROM pgjobs.jobs WHERE id = %s", [e.id]).fetchone() == ("in-tx",)


def test_fast_enqueue_raises_the_contracts_errors(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with Client(dsn) as client:
        with pytest.raises(InvalidArgument, match="kind must be a non-empty string"):
            client.enqueue("")
        with pytest.raises(InvalidArgument, match="max_attempts must be >= 1, got 0"):
            client.enqueue("a", max_attempts=0)
        client.configure_queue("tiny", max_length=1)
        client.enqueue("a", queue="tiny")
        with pytest.raises(QueueFull, match="tiny"):
            client.enqueue("a", queue="tiny")
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone() == (1,)


def test_fast_enqueue_sends_wake_and_logs_status_events(dsn: str, connect: ConnectFactory) -> None:
    listener = connect()
    listener.execute("LISTEN pgjobs_wake")
    with Client(dsn) as client:
        e = client.enqueue("n", queue="qn")
        later = client.enqueue("n", queue="qn", run_at=LATER)
        events = client.read_events()  # status events are in the durable log (sql/stream.sql)
    got = [(n.channel, n.payload) for n in listener.notifies(timeout=2, stop_after=1)]
    assert ("pgjobs_wake", "qn") in got
    assert {(ev.id, ev.state.value) for ev in events} == {(e.id, "pending"), (later.id, "scheduled")}


# ------------------------------------------------------------------------------------------------------
# enqueue_copy: COPY into the staging table, pgjobs.enqueue_staged


def _with_unique_suffix(specs: list[dict[str, Any]], suffix: str) -> list[dict[str, Any]]:
    return [{**s, "unique_key": s["unique_key"] + suffix} if "unique_key" in s else s for s in specs]


@pytest.mark.smoke
def test_copy_stores_what_enqueue_many_stores(dsn: str, conn: psycopg.Connection[Any]) -> None:
    plain = [
        {"kind": "a", "payload": {"i": 1}, "ref": "first"},
        {"kind": "b", "queue": "mail", "priority": 7, "max_attempts": 3, "meta": {"m": 1}, "ref": 5},
        {"kind": "c", "run_at": LATER, "group_key": "g", "unique_live_only": True},
        {"kind": "d", "run_at": "2031-01-02T03:04:05+00:00", "payload": {"n": None}},
        {"kind": "e", "payload": {"t": "text \\ with \t tabs \n and newlines"}},
    ]
    with Client(dsn) as client:
        for specs in (plain, SPECS):  # the set-based path, then the general one (unique keys)
            copied = client.enqueue_copy(_with_unique_suffix(specs, "-copy"))
            many = client.enqueue_many(_with_unique_suffix(specs, "-json"))
            assert [(s.ref, s.created, s.batch_id) for s in copied] == [(s.ref, s.created, s.batch_id) for s in many]
            assert all(isinstance(s, EnqueuedSpec) for s in copied)

            def norm(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
                return [(*r[:7], r[7] and r[7].rsplit("-", 1)[0], *r[8:]) for r in rows]

            assert norm(_stored(conn, [s.id for s in copied])) == norm(_stored(conn, [s.id for s in many]))
        assert client.enqueue_many(plain, method="copy")[0].ref == "first"


def test_copy_returns_specs_in_order_with_refs(dsn: str) -> None:
    specs = [{"kind": "k", "ref": f"r{i}", "payload": {"i": i}} for i in range(500)]
    with Client(dsn) as client:
        out = client.enqueue_copy(specs)
        assert [s.ref for s in out] == [f"r{i}" for i in range(500)]
        ids = [s.id for s in out]
        with client.pool.connection() as c:
            rows = c.execute("SELECT id, payload FROM pgjobs.jobs ORDER BY id").fetchall()
        assert dict(rows) == {i: {"i": n} for n, i in enumerate(ids)}


# A bad spec, and what its refusal must name (besides its index): the value, or what is missing.
BAD: list[tuple[dict[str, Any], str]] = [
    ({"kind": ""}, "kind"),
    ({"queue": "q"}, "kind"),
    ({"kind": "x", "queue": ""}, "queue"),
    ({"kind": "x", "payload": None}, "payload"),
    ({"kind": "x", "priority": 40000}, "40000"),
    ({"kind": "x", "max_attempts": 0}, "max_attempts"),
    ({"kind": "x", "run_at": "soon"}, "soon"),
    ({"kind": "x", "meta": [1]}, "[1]"),
    ({"kind": "x", "colour": "red"}, "colour"),
    ({"kind": 5}, "5"),
    ({"kind": "x", "priority": True}, "true"),
    ({"kind": "x", "ref": "r", "depends_on": [{"ref": "r", "on": "later"}]}, "later"),
]


@pytest.mark.parametrize(("bad", "named"), BAD)
def test_copy_refuses_a_bad_spec_as_enqueue_many_does_and_changes_nothing(
    dsn: str, conn: psycopg.Connection[Any], bad: dict[str, Any], named: str
) -> None:
    specs = [{"kind": "ok"}, {"kind": "ok", "payload": {"a": 1}}, bad, {"kind": "ok"}]
    with Client(dsn) as client:
        with pytest.raises((InvalidArgument, GraphError)) as general:
            client.enqueue_many(specs)
        with pytest.raises((InvalidArgument, GraphError)) as copied:
            client.enqueue_copy(specs)
    assert type(copied.value) is type(general.value) and str(copied.value) == str(general.value)
    assert "jobs[2]" in str(copied.value) and named in str(copied.value)
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone() == (0,)


@pytest.mark.parametrize("method", ["copy", "json"])
def test_copy_of_100k_is_all_or_nothing(dsn: str, conn: psycopg.Connection[Any], method: Any) -> None:
    """Both bulk paths (COPY into the staging table; JSON through enqueue_many's one-pass insert)."""
    specs = [{"kind": "bulk", "payload": {"n": i}} for i in range(100_000)]
    with Client(dsn) as client:
        with pytest.raises(InvalidArgument, match=r"jobs\[99999\]: max_attempts"):
            client.enqueue_many([*specs[:-1], {"kind": "bulk", "max_attempts": 0}], method=method)
        assert conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone() == (0,)
        out = client.enqueue_many(specs, method=method)
    assert len(out) == 100_000 and len({s.id for s in out}) == 100_000
    assert conn.execute("SELECT count(*), count(DISTINCT payload) FROM pgjobs.jobs").fetchone() == (100_000, 100_000)


def test_copy_honours_unique_keys_like_enqueue_many(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with Client(dsn) as client:
        held = client.enqueue("k", unique_key="u1")
        out = client.enqueue_copy([{"kind": "k", "unique_key": "u1"}, {"kind": "k", "unique_key": "u2"},
                                   {"kind": "k", "unique_key": "u2"}, {"kind": "k"}])  # fmt: skip
    assert [s.created for s in out] == [False, True, False, True]
    assert out[0].id == held.id and out[1].id == out[2].id
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone() == (3,)


def test_two_racing_copy_calls_make_one_job_per_key(dsn: str, conn: psycopg.Connection[Any]) -> None:
    keys = [f"key-{i}" for i in range(300)]
    barrier = threading.Barrier(2)
    results: list[list[EnqueuedSpec]] = []
    errors: list[BaseException] = []

    def racer(order: list[str]) -> None:
        try:
            with Client(dsn, max_size=1) as client:
                barrier.wait()
                results.append(client.enqueue_copy([{"kind": "race", "unique_key": k} for k in order]))
        except BaseException as exc:
            errors.append(exc)

    # The same batch sent twice at once (a producer's retry racing its first attempt). (Two batches holding
    # the same keys in opposite orders can deadlock, 40P01, on this path as on enqueue_many's.)
    threads = [threading.Thread(target=racer, args=(keys,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert conn.execute("SELECT count(*), count(DISTINCT unique_key) FROM pgjobs.jobs").fetchone() == (300, 300)
    a, b = ({s.id for s in r} for r in results)
    assert a == b  # both calls answer with the same 300 jobs
    assert sum(s.created for r in results for s in r) == 300


def test_copy_takes_dependencies_and_batches(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with Client(dsn) as client:
        out = client.enqueue_copy(
            [{"kind": "parent", "ref": "p"}, {"kind": "child", "ref": "c", "depends_on": [{"ref": "p"}]}]
        )
        states = dict(conn.execute("SELECT kind, state::text FROM pgjobs.jobs").fetchall())
        assert states == {"parent": "pending", "child": "waiting"} and [s.ref for s in out] == ["p", "c"]
        with pytest.raises(GraphError):
            client.enqueue_copy([{"kind": "x", "ref": "a", "depends_on": [{"ref": "b"}]},
                                 {"kind": "y", "ref": "b", "depends_on": [{"ref": "a"}]}])  # fmt: skip
        batch = client.enqueue_copy([{"kind": "m"}, {"kind": "m"}], as_batch=True)
        assert batch[0].batch_id is not None and batch[0].batch_id == batch[1].batch_id


def test_copy_sends_wake_and_status_events(dsn: str, connect: ConnectFactory) -> None:
    listener = connect()
    listener.execute("LISTEN pgjobs_wake")
    with Client(dsn) as client:
        out = client.enqueue_copy([{"kind": "ev", "queue": "qe", "payload": {"i": i}} for i in range(300)])
        logged = client.read_events()  # status events are in the durable log (sql/stream.sql)
    wakes = [n.payload for n in listener.notifies(timeout=2, stop_after=1)]
    assert wakes == ["qe"]
    assert all(ev.state.value == "pending" and ev.queue == "qe" and ev.kind == "ev" for ev in logged)
    assert [ev.id for ev in logged] == [s.id for s in out]


def test_copy_on_a_full_queue_raises_queue_full(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with Client(dsn) as client:
        client.configure_queue("small", max_length=3)
        with pytest.raises(QueueFull):
            client.enqueue_copy([{"kind": "x", "queue": "small"}] * 4)
        assert len(client.enqueue_copy([{"kind": "x", "queue": "small"}] * 3)) == 3
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone() == (3,)


def test_copy_in_the_callers_transaction(dsn: str, connect: ConnectFactory, conn: psycopg.Connection[Any]) -> None:
    own = connect(autocommit=False)
    with Client(dsn) as client:
        first = client.enqueue_copy([{"kind": "t", "ref": "1"}], conn=own)
        second = client.enqueue_copy([{"kind": "t", "ref": "2"}, {"kind": "t", "ref": "3"}], conn=own)
        assert [s.ref for s in second] == ["2", "3"]  # the first call's staged rows are not read again
        own.rollback()
        assert conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone() == (0,)
        client.enqueue_copy([{"kind": "t"}], conn=own)
        own.commit()
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone() == (1,)
    assert first[0].id not in {r[0] for r in conn.execute("SELECT id FROM pgjobs.jobs").fetchall()}


def test_async_copy(dsn: str, conn: psycopg.Connection[Any]) -> None:
    async def go() -> list[EnqueuedSpec]:
        async with AsyncClient(dsn) as client:
            await client.enqueue_many([{"kind": "a"}], method="copy")
            return await client.enqueue_copy([{"kind": "b", "ref": "r", "run_at": LATER - timedelta(days=1)}])

    out = asyncio.run(go())
    assert out[0].ref == "r" and out[0].created
    assert conn.execute("SELECT kind, state::text FROM pgjobs.jobs ORDER BY id").fetchall() == [
        ("a", "pending"),
        ("b", "scheduled"),
    ]


STAGING_COLUMNS = (
    "n bigint, kind text, queue text, payload jsonb, meta jsonb, run_at text, priority bigint, max_attempts bigint,"
    " unique_key text, unique_live_only boolean, group_key text, ref text, depends_on jsonb"
)


@pytest.mark.parametrize(
    ("ddl", "table", "message"),
    [
        (f"CREATE TABLE public.staged ({STAGING_COLUMNS})", "public.staged", "temporary table of this session"),
        ("CREATE TEMP VIEW staged AS SELECT 1::bigint AS n", "pg_temp.staged", "plain table"),
        (
            f"CREATE TEMP TABLE staged ({STAGING_COLUMNS});"
            " CREATE FUNCTION pg_temp.t() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END';"
            " CREATE TRIGGER t BEFORE INSERT ON pg_temp.staged FOR EACH ROW EXECUTE FUNCTION pg_temp.t()",
            "pg_temp.staged",
            "plain table",
        ),
        ("CREATE TEMP TABLE staged (n bigint, kind text)", "pg_temp.staged", "has columns (n bigint, kind text)"),
    ],
)
def test_enqueue_staged_refuses_a_table_it_must_not_read(
    conn: psycopg.Connection[Any], ddl: str, table: str, message: str
) -> None:
    conn.execute(ddl)
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT * FROM pgjobs.enqueue_staged(staging => %s)", [table])
    assert info.value.sqlstate == "PJ002" and message in str(info.value)


def test_enqueue_staged_pairs_ids_with_specs_whatever_the_stored_order(conn: psycopg.Connection[Any]) -> None:
    """enqueue_staged pairs the ids it drew with the specs by their order alone: the insert reads the specs
    ORDER BY n and draws each id (nextval, into jobs_live) in that order. Staged here in reverse and in
    three groups (kind, queue, state), each spec's id must be the job made from that spec."""
    conn.execute(
        "CREATE TEMP TABLE pgjobs_staging (n bigint, kind text, queue text, payload jsonb, meta jsonb, run_at text,"
        " priority bigint, max_attempts bigint, unique_key text, unique_live_only boolean, group_key text, ref text,"
        " depends_on jsonb) ON COMMIT DELETE ROWS"
    )
    with conn.transaction():  # the staged rows last until the commit
        conn.execute(
            "INSERT INTO pgjobs_staging (n, kind, queue, payload, run_at, ref)"
            " SELECT g, CASE WHEN g % 3 = 0 THEN 'a' ELSE 'b' END, CASE WHEN g % 5 = 0 THEN 'q5' END,"
            " jsonb_build_object('g', g), CASE WHEN g % 7 = 0 THEN '2031-01-01T00:00:00Z' END, 'r' || g"
            " FROM generate_series(299, 0, -1) AS g"
        )
        out = conn.execute("SELECT ref, id FROM pgjobs.enqueue_staged(staging => 'pg_temp.pgjobs_staging')").fetchall()
    assert [r[0] for r in out] == [f"r{g}" for g in range(300)]
    rows = conn.execute(
        "SELECT id, (payload ->> 'g')::int, kind, queue, state::text FROM pgjobs.jobs_live WHERE id = ANY (%s)",
        [[r[1] for r in out]],
    ).fetchall()
    made = {r[0]: r[1:] for r in rows}
    for ref, job_id in out:
        g = int(ref[1:])
        want = ("a" if g % 3 == 0 else "b", "q5" if g % 5 == 0 else "default", "scheduled" if g % 7 == 0 else "pending")
        assert made[job_id] == (g, *want)


def test_copy_recreates_a_staging_table_the_session_lost(dsn: str, conn: psycopg.Connection[Any]) -> None:
    """The client remembers which sessions hold the staging table; one that lost it (DISCARD TEMP, or a
    pooler that moved the client to another server) makes the call run once more, creating it."""
    with Client(dsn, max_size=1) as client:
        client.enqueue_copy([{"kind": "a"}])
        client.enqueue_copy([{"kind": "b"}])  # the session's table is known: no staging statement
        with client.pool.connection() as c:
            c.execute("DISCARD TEMP")
        assert [s.created for s in client.enqueue_copy([{"kind": "c"}, {"kind": "d"}])] == [True, True]

    async def go() -> None:
        async with AsyncClient(dsn, max_size=1) as aclient:
            await aclient.enqueue_copy([{"kind": "e"}])
            async with aclient.pool.connection() as c:
                await c.execute("DISCARD TEMP")
            await aclient.enqueue_copy([{"kind": "f"}])

    asyncio.run(go())
    assert [r[0] for r in conn.execute("SELECT kind FROM pgjobs.jobs ORDER BY id").fetchall()] == list("abcdef")


def test_a_producer_role_enqueues_through_copy(dsn: str, pg_server_dsn: str, conn: psycopg.Connection[Any]) -> None:
    """enqueue_staged runs as its owner (SECURITY DEFINER) and reads the caller's temporary table: a LOGIN
    role that is only in pgjobs_producer (no table privilege) enqueues through COPY; a role in no group
    may not call it."""
    token = secrets.token_hex(4)
    names = {"producer": f"pjt_{token}_copy_producer", "nobody": f"pjt_{token}_copy_nobody"}
    with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
        try:
            for name in names.values():
                admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
            admin.execute(sql.SQL("GRANT pgjobs_producer TO {}").format(sql.Identifier(names["producer"])))
            with Client(make_conninfo(dsn, user=names["producer"])) as client:
                plain = client.enqueue_copy([{"kind": "p", "payload": {"i": i}} for i in range(50)])
                keyed = client.enqueue_copy([{"kind": "p", "unique_key": "k"}, {"kind": "p", "unique_key": "k"}])
            assert len(plain) == 50 and [s.created for s in keyed] == [True, False]
            with Client(make_conninfo(dsn, user=names["nobody"])) as client, pytest.raises(psycopg.Error) as info:
                client.enqueue_copy([{"kind": "n"}])
            assert info.value.sqlstate == "42501"
            assert conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone() == (51,)
        finally:
            with psycopg.connect(dsn, autocommit=True) as db:
                db.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ANY(%s)",
                    (list(names.values()),),
                )
                for name in names.values():
                    db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            for name in names.values():
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
