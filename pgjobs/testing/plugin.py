"""pytest fixtures for applications that use pgjobs: a migrated throwaway database per test.

Off by default; enable it with ``pytest -p pgjobs.testing.plugin`` or, in your top-level ``conftest.py``,
``pytest_plugins = ["pgjobs.testing.plugin"]``. Which server: ``--pgjobs-server DSN``, else
``$PGJOBS_TEST_DSN``, else ``$PGJOBS_DSN`` / ``$DATABASE_URL``, else the embedded PostgreSQL (with the
``embedded`` extra). The plugin only creates and drops its own databases (``pgjobs_kit_*``) there.

Fixtures:

* ``pgjobs_server_dsn`` (session): the server's DSN as configured.
* ``pgjobs_dsn``: a fresh database with the pgjobs schema, copied from a template migrated once per
  session, dropped after the test.
* ``pgjobs_conn``: a connection to it inside a transaction that is rolled back after the test (so
  ``assert_enqueued(pgjobs_conn, ...)`` sees what your code enqueued on it, and nothing is committed).
* ``pgjobs_client``: a :class:`pgjobs.Client` on ``pgjobs_dsn``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from pgjobs.client import Client
from pgjobs.ops import dsn as dsnmod
from pgjobs.ops import scratch


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pgjobs")
    group.addoption(
        "--pgjobs-server",
        default=None,
        metavar="DSN",
        help="PostgreSQL server for the pgjobs fixtures (default: $PGJOBS_TEST_DSN, $PGJOBS_DSN, $DATABASE_URL, "
        "else the embedded server)",
    )


@pytest.fixture(scope="session")
def pgjobs_server_dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    given = request.config.getoption("--pgjobs-server") or os.environ.get("PGJOBS_TEST_DSN")
    with dsnmod.resolve(given) as target:
        yield target.dsn


@pytest.fixture(scope="session")
def _pgjobs_template(pgjobs_server_dsn: str) -> Iterator[str]:
    name = scratch.create_template(pgjobs_server_dsn)
    try:
        yield name
    finally:
        scratch.drop(pgjobs_server_dsn, name)


@pytest.fixture
def pgjobs_dsn(pgjobs_server_dsn: str, _pgjobs_template: str) -> Iterator[str]:
    dsn = scratch.clone(pgjobs_server_dsn, _pgjobs_template)
    try:
        yield dsn
    finally:
        scratch.drop(pgjobs_server_dsn, str(conninfo_to_dict(dsn)["dbname"]))


@pytest.fixture
def pgjobs_conn(pgjobs_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    conn = psycopg.connect(pgjobs_dsn)  # not autocommit: one transaction, rolled back at teardown
    try:
        yield conn
    finally:
        with contextlib.suppress(psycopg.Error):
            conn.rollback()
        conn.close()


@pytest.fixture
def pgjobs_client(pgjobs_dsn: str) -> Iterator[Client]:
    with Client(pgjobs_dsn) as client:
        yield client
