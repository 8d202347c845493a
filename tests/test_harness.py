"""Tests of the test harness itself: fresh databases, and the server features pgjobs relies on."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory, db_dsn

pytestmark = pytest.mark.smoke


@pytest.mark.parametrize(
    ("server_dsn", "expected"),
    [
        (
            "postgresql://postgres:@/postgres?host=/tmp/pgjobs-test-x",
            {"user": "postgres", "dbname": "pgjobs_t_1", "host": "/tmp/pgjobs-test-x"},
        ),
        (
            "postgresql://postgres@127.0.0.1:5432/postgres",
            {"user": "postgres", "dbname": "pgjobs_t_1", "host": "127.0.0.1", "port": "5432"},
        ),
        ("host=/run/pg user=me dbname=x", {"user": "me", "dbname": "pgjobs_t_1", "host": "/run/pg"}),
    ],
)
def test_db_dsn_keeps_host_and_user_and_swaps_the_database(server_dsn: str, expected: dict[str, str]) -> None:
    params = psycopg.conninfo.conninfo_to_dict(db_dsn(server_dsn, "pgjobs_t_1"))
    assert {k: v for k, v in params.items() if v} == expected


@pytest.mark.parametrize("run", [1, 2])
def test_each_test_gets_a_fresh_migrated_database(conn: psycopg.Connection[Any], run: int) -> None:
    name = conn.execute("select current_database()").fetchone()
    assert name is not None and name[0].startswith("pgjobs_t_")
    # migrated from the template ...
    assert conn.execute("select 1 from pg_namespace where nspname = 'pgjobs'").fetchone() == (1,)
    # ... and private: what the other run wrote is not here
    assert conn.execute("select to_regclass('public.harness_probe')").fetchone() == (None,)
    conn.execute("create table harness_probe (run int)")
    conn.execute("insert into harness_probe values (%s)", [run])


def test_blank_database_has_no_schema(blank_dsn: str) -> None:
    with psycopg.connect(blank_dsn, autocommit=True) as c:
        assert c.execute("select 1 from pg_namespace where nspname = 'pgjobs'").fetchone() is None


def test_plpgsql_notify_reaches_a_listener_only_after_commit(connect: ConnectFactory) -> None:
    listener = connect()
    producer = connect()
    producer.execute(
        """
        create function harness_notify(n int) returns int language plpgsql as $$
        begin
            perform pg_notify('harness', (n + 1)::text);
            return n + 1;
        end $$
        """
    )
    listener.execute("listen harness")
    with producer.transaction():
        assert producer.execute("select harness_notify(41)").fetchone() == (42,)
        # not committed yet: nothing may arrive
        assert list(listener.notifies(timeout=0.3)) == []
    got = [(n.channel, n.payload) for n in listener.notifies(timeout=5, stop_after=1)]
    assert got == [("harness", "42")]
    # and a rolled-back NOTIFY never arrives
    with pytest.raises(RuntimeError), producer.transaction():
        producer.execute("select harness_notify(1)")
        raise RuntimeError("roll back")
    assert list(listener.notifies(timeout=0.3)) == []


def test_skip_locked_and_concurrent_connections(connect: ConnectFactory) -> None:
    setup = connect()
    setup.execute("create table harness_q (id int primary key)")
    setup.execute("insert into harness_q select generate_series(1, 40)")
    claimed: list[int] = []
    lock = threading.Lock()

    def claimer() -> None:
        c = connect(autocommit=False)
        while True:
            with c.transaction():
                row = c.execute(
                    "delete from harness_q where id = "
                    "(select id from harness_q order by id for update skip locked limit 1) returning id"
                ).fetchone()
            if row is None:
                return
            with lock:
                claimed.append(row[0])

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(claimed) == list(range(1, 41))
