"""Event ids from durably reserved blocks (sql/stream.sql, "IDS AND CRASHES").

A tick may commit without waiting for its WAL flush (a session with synchronous_commit off, as subscribe()
uses) only while its ids lie in a block whose end is already on disk: the tick that reserves a block raises
its own transaction's synchronous_commit (never lowers it). A crash empties the unlogged copy of the block's
end; the next tick then starts above the logged end, so no id a reader may have seen before the crash names
another event after it. The crash is simulated here by what it leaves behind: the unlogged row gone, and
event_id_seq back below ids that were handed out (its WAL was never flushed).
"""

from __future__ import annotations

from typing import Any

import psycopg
from conftest import ConnectFactory

from tests.helpers.foundation import call, enqueue, enqueue_n

Conn = psycopg.Connection[Any]


def _one(conn: Conn, sql: str) -> Any:
    row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0]


def _blocks(conn: Conn) -> tuple[int, int | None]:
    """(logged end, unlogged end or None)."""
    return int(_one(conn, "SELECT hi FROM pgjobs.event_id_block")), _one(
        conn, "SELECT (SELECT hi FROM pgjobs.event_id_block_live)"
    )


def _read_in_transaction(conn: Conn) -> tuple[list[int], str]:
    """read_events as the first statement of a transaction (so it ticks), then that transaction's
    synchronous_commit as the commit will use it."""
    with conn.transaction():
        ids = [r["event_id"] for r in call(conn, "read_events", after_id=0, max_rows=100000)]
        setting = str(_one(conn, "SELECT current_setting('synchronous_commit')"))
    return ids, setting


def test_a_tick_that_reserves_a_block_commits_with_a_flush_and_the_others_do_not(connect: ConnectFactory) -> None:
    conn = connect(autocommit=True)
    conn.execute("SET synchronous_commit = off")
    conn.execute("TRUNCATE pgjobs.event_id_block_live")  # no live block: the next tick with events reserves one
    enqueue_n(conn, 3)
    ids, setting = _read_in_transaction(conn)
    assert len(ids) == 3
    assert setting == "on"  # raised for the reserving tick's own transaction only
    hi, live = _blocks(conn)
    assert live == hi and hi >= max(ids) + 1_000_000 - 1
    assert _one(conn, "SELECT current_setting('synchronous_commit')") == "off"  # the session's own, again

    enqueue_n(conn, 2)
    more, setting = _read_in_transaction(conn)
    assert len(more) == 5 and setting == "off"  # inside the block: the session's setting stands
    assert _blocks(conn) == (hi, hi)  # nothing written for it

    # the block runs out: the tick whose ids pass its end reserves the next one, with a flush
    conn.execute("UPDATE pgjobs.event_id_block_live SET hi = %s", [max(more) + 1])
    conn.execute("UPDATE pgjobs.event_id_block SET hi = %s", [max(more) + 1])
    enqueue_n(conn, 2)
    last, setting = _read_in_transaction(conn)
    assert setting == "on"
    hi2, live2 = _blocks(conn)
    assert live2 == hi2 and hi2 >= max(last) + 1_000_000 - 1


def test_a_reserving_tick_never_weakens_the_callers_setting(connect: ConnectFactory) -> None:
    conn = connect(autocommit=True)
    conn.execute("SET synchronous_commit = remote_apply")
    conn.execute("TRUNCATE pgjobs.event_id_block_live")
    enqueue(conn)
    ids, setting = _read_in_transaction(conn)
    assert ids and setting == "remote_apply"


def test_after_a_crash_ids_start_above_the_reserved_end(connect: ConnectFactory) -> None:
    conn = connect(autocommit=True)
    conn.execute("SET synchronous_commit = off")
    enqueue_n(conn, 4)
    seen = [r["event_id"] for r in call(conn, "read_events", after_id=0, max_rows=100000)]
    hi, live = _blocks(conn)
    assert live == hi and max(seen) <= hi
    # What a crash leaves: the unlogged row emptied, the sequence back where its last flushed WAL record put it
    # (here: below every id a reader saw), the log rows of the lost (asynchronously committed) ticks gone.
    conn.execute("TRUNCATE pgjobs.event_id_block_live")
    conn.execute("SELECT setval('pgjobs.event_id_seq', 1)")
    enqueue_n(conn, 2)
    after = call(conn, "read_events", after_id=max(seen), max_rows=100000)
    assert len(after) == 2  # a reader resuming at its cursor gets them
    assert min(r["event_id"] for r in after) > hi  # above every id handed out before the crash
    hi2, live2 = _blocks(conn)
    assert live2 == hi2 and hi2 > hi


def test_a_crash_with_nothing_to_tick_changes_no_id(connect: ConnectFactory) -> None:
    """The empty reads after a crash move the sequence up once (no WAL per read), and hand out nothing."""
    conn = connect(autocommit=True)
    enqueue(conn)
    call(conn, "read_events", after_id=0)
    hi, _ = _blocks(conn)
    conn.execute("TRUNCATE pgjobs.event_id_block_live")
    for _ in range(3):
        assert call(conn, "read_events", after_id=2**62) == []
    assert int(_one(conn, "SELECT last_value FROM pgjobs.event_id_seq")) == hi
    assert _blocks(conn) == (hi, None)  # nothing reserved until a tick hands out ids
