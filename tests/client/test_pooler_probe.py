"""The pooler probe's connection (client/pooler.py): its startup options keep the DSN's own, and straight to
PostgreSQL its value comes back."""

from __future__ import annotations

import anyio
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgjobs.client.pooler import PROBE_QUERY, SessionNotKept, aprobe, probe, probe_conninfo, verdict


def test_the_probe_keeps_the_dsns_options_and_reads_its_value_back(dsn: str) -> None:
    """A DSN with ``options`` of its own: the probe's connection has both settings, and its nonce is fresh."""
    own = make_conninfo(dsn, options="-c work_mem=7MB")
    conninfo, nonce = probe_conninfo(own, "-c jit=off")
    assert probe_conninfo(own)[1] != nonce
    assert conninfo_to_dict(conninfo)["options"] == f"-c work_mem=7MB -c jit=off -c pgjobs.probe={nonce}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(f"SELECT current_setting('work_mem'), current_setting('jit'), ({PROBE_QUERY})").fetchone()
    assert row == ("7MB", "off", nonce)
    assert probe(own) is None
    assert anyio.run(aprobe, own) is None


def test_a_session_without_the_value_is_not_kept(dsn: str) -> None:
    """A session that never got the startup option (as behind a pooler that drops it) reads NULL: not kept."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(PROBE_QUERY).fetchone()
    assert row == (None,)
    assert isinstance(verdict(row, "0" * 32), SessionNotKept)
    assert verdict(("0" * 32,), "0" * 32) is None
