"""The status stream's SQL contract: read_events over the durable, rotated event log (sql/stream.sql).

Shape and order, filters, status_events, commit-only events (rollback, savepoint), the long transaction whose
events come after higher ids were read, rotation and retention, the hint sent only while someone follows, and
no NOTIFY at all on claim/complete_many when nobody does.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.foundation import (
    call,
    claim,
    claim_one,
    drain,
    enqueue,
    enqueue_n,
    listen,
    payloads,
    raises_pj,
    run_threads,
    scalar,
)
from tests.helpers.graph import one

Conn = psycopg.Connection[Any]
COLUMNS = ["event_id", "at", "id", "state", "queue", "kind", "attempt", "batch_id", "progress"]


def events(conn: Conn, after: int = 0, **filters: Any) -> list[dict[str, Any]]:
    return call(conn, "read_events", after_id=after, **filters)


def short(rows: list[dict[str, Any]]) -> list[tuple[int, str, int]]:
    return [(r["id"], r["state"], r["attempt"]) for r in rows]


def follow(conn: Conn) -> None:
    """Marks the stream followed (any read_events call in autocommit does)."""
    events(conn, after=2**62)


def unfollow(conn: Conn) -> None:
    conn.execute("TRUNCATE pgjobs.stream_followers")


def inbox_rows(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM pgjobs.event_inbox").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.smoke
def test_every_transition_is_an_event_of_the_contract_shape_in_order(conn: Conn) -> None:
    jid = enqueue(conn, "k", max_attempts=3)["id"]
    c = claim_one(conn)
    scalar(conn, "progress", id=jid, lease_token=c["lease_token"], progress={"pct": 50})
    scalar(conn, "fail", id=jid, lease_token=c["lease_token"], error="e", retry_at=datetime.now(UTC))
    c = claim_one(conn)
    scalar(conn, "release", id=jid, lease_token=c["lease_token"])
    c = claim_one(conn)
    scalar(conn, "complete", id=jid, lease_token=c["lease_token"])
    rows = events(conn)
    assert rows and list(rows[0]) == COLUMNS
    assert short(rows) == [
        (jid, "pending", 0),
        (jid, "active", 1),
        (jid, "active", 1),  # the progress report, carrying its value
        (jid, "pending", 1),
        (jid, "active", 2),
        (jid, "pending", 1),  # release gave the attempt back
        (jid, "active", 2),
        (jid, "succeeded", 2),
    ]
    assert [r["progress"] for r in rows] == [None, None, {"pct": 50}, None, None, None, None, None]
    assert all(r["queue"] == "default" and r["kind"] == "k" and r["batch_id"] is None for r in rows)
    ids = [r["event_id"] for r in rows]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # a cursor resumes after the event it names; max_rows pages
    assert [r["event_id"] for r in events(conn, after=ids[2], max_rows=3)] == ids[3:6]
    assert events(conn, after=ids[-1]) == []


def test_terminal_transitions_and_admin_calls_are_logged(conn: Conn) -> None:
    a = enqueue(conn)["id"]
    b = enqueue(conn, run_at=datetime(2100, 1, 1, tzinfo=UTC))["id"]
    c = claim_one(conn)
    scalar(conn, "dead_letter", id=a, lease_token=c["lease_token"], error="x")
    scalar(conn, "cancel", id=b)
    scalar(conn, "retry", id=a)
    assert short(events(conn)) == [
        (a, "pending", 0),
        (b, "scheduled", 0),
        (a, "active", 1),
        (a, "failed", 1),
        (b, "cancelled", 0),
        (a, "pending", 1),
    ]


def test_one_log_row_per_transition_call(conn: Conn) -> None:
    """Write amplification: a claim of 5 and a complete_many of 5 append one inbox row each, not five."""
    enqueue_n(conn, 5)
    assert inbox_rows(conn) == 1
    got = claim(conn, max_jobs=5)
    assert inbox_rows(conn) == 2
    scalar(conn, "complete_many", ids=[g["id"] for g in got], lease_tokens=[g["lease_token"] for g in got])
    assert inbox_rows(conn) == 3
    rows = events(conn)
    assert [r["state"] for r in rows] == ["pending"] * 5 + ["active"] * 5 + ["succeeded"] * 5
    assert sorted(r["id"] for r in rows[5:10]) == sorted(g["id"] for g in got)


def test_a_bulk_calls_event_arrays_are_stored_with_lz4_where_the_server_has_it(conn: Conn) -> None:
    """1,000 events in one inbox row put its arrays past the TOAST threshold: compressed with lz4
    (migrations/deploy/event_log.sql), in the inbox and in the log the ticker copies them to, and read back whole."""
    if not one(conn, "SELECT 'lz4' = ANY (enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"):
        pytest.skip("this server is built without lz4")
    assert len(call(conn, "enqueue_many", jobs=[{"kind": "bulk", "queue": "lz"}] * 1000)) == 1000
    inbox = conn.execute(
        "SELECT pg_column_compression(ids), pg_column_compression(queues) FROM pgjobs.event_inbox"
    ).fetchall()
    assert inbox == [("lz4", "lz4")]
    rows = events(conn, queue="lz")
    assert len(rows) == 1000 and {r["state"] for r in rows} == {"pending"}
    logged = conn.execute("SELECT pg_column_compression(ids) FROM pgjobs.event_log WHERE cardinality(ids) = 1000")
    assert logged.fetchall() == [("lz4",)]


def test_the_logs_gin_pending_lists_stay_short_so_no_tick_merges_a_big_one(conn: Conn) -> None:
    """A tick's insert into event_log merges the GIN pending list once it passes its limit; with the default
    4 MB that merge stalled a follower's read ~200 ms (migrations/deploy/event_log.sql). 40,000 events ticked: the
    pending list of the log's ids index never holds more than the 128 kB limit (16 pages and the one being
    filled), where it grew to 120 pages without it."""
    if not one(conn, "SELECT count(*) > 0 FROM pg_available_extensions WHERE name = 'pgstattuple'"):
        pytest.skip("pgstattuple is not installed on this server")
    conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    # The ids index of the partition the ticker writes now.
    index = one(
        conn,
        "SELECT format('pgjobs.event_log_%s_ids_idx', lpad(r.slot::text, 2, '0'))"
        " FROM pgjobs.event_rotations AS r ORDER BY r.rotation_id DESC LIMIT 1",
    )
    most = 0
    for _ in range(40):
        call(conn, "enqueue_many", jobs=[{"kind": "gin", "queue": "g"}] * 1000)
        events(conn, after=2**62)  # autocommit: the read ticks, inserting the call's events into the log
        most = max(most, int(one(conn, "SELECT pending_pages FROM pgstatginindex(%s::regclass)", [index])))
    assert 0 < most <= 17, most


def test_filters_by_queue_jobs_and_batch(conn: Conn) -> None:
    a = enqueue(conn, queue="qa")["id"]
    b = enqueue(conn, queue="qb")["id"]
    members = call(
        conn, "enqueue_many", jobs=[{"kind": "m", "queue": "qa"}, {"kind": "m", "queue": "qb"}], as_batch=True
    )
    batch = members[0]["batch_id"]
    c = claim_one(conn, queues=["qa"])
    scalar(conn, "complete", id=c["id"], lease_token=c["lease_token"])
    assert c["id"] == a
    assert [r["id"] for r in events(conn, queue="qa")] == [a, members[0]["id"], a, a]
    assert [r["id"] for r in events(conn, job_ids=[b, a])] == [a, b, a, a]
    assert [r["id"] for r in events(conn, batch_id=batch)] == [m["id"] for m in members]
    # job_ids and batch_id select jobs (either matches); queue narrows
    assert [r["id"] for r in events(conn, job_ids=[b], batch_id=batch)] == [b] + [m["id"] for m in members]
    assert [r["id"] for r in events(conn, job_ids=[a, b], queue="qb")] == [b]
    assert events(conn, job_ids=[10**12]) == [] and events(conn, batch_id=10**12) == []


def test_a_filtered_read_pages_past_other_jobs(conn: Conn) -> None:
    """max_rows counts matching events: a watched job's events come back even behind many others'."""
    enqueue_n(conn, 50)
    mine = enqueue(conn, queue="rare")["id"]
    enqueue_n(conn, 50)
    assert [r["id"] for r in events(conn, max_rows=1, queue="rare")] == [mine]
    assert [r["id"] for r in events(conn, max_rows=1, job_ids=[mine])] == [mine]


def test_status_events_terminal_and_none(conn: Conn) -> None:
    call(conn, "configure_queue", queue="t", status_events="terminal")
    call(conn, "configure_queue", queue="n", status_events="none")
    for q in ("t", "n", "all"):
        jid = enqueue(conn, queue=q)["id"]
        c = claim_one(conn, queues=[q])
        scalar(conn, "progress", id=jid, lease_token=c["lease_token"], progress={})
        scalar(conn, "complete", id=jid, lease_token=c["lease_token"])
    call(conn, "enqueue_many", jobs=[{"kind": "k", "queue": q} for q in ("t", "all", "n")])
    by_queue: dict[str, list[str]] = {}
    for r in events(conn):
        by_queue.setdefault(r["queue"], []).append(r["state"])
    assert by_queue == {"t": ["succeeded"], "all": ["pending", "active", "active", "succeeded", "pending"]}


def test_an_event_exists_only_if_its_transaction_committed(connect: ConnectFactory) -> None:
    reader = connect()
    tx = connect(autocommit=False)
    enqueue(tx, "rolled-back")
    assert events(reader) == []  # not committed yet
    tx.rollback()
    assert events(reader) == []
    # a savepoint rolled back takes its events with it; the rest of the transaction keeps its own
    kept = enqueue(tx, "kept")["id"]
    tx.execute("SAVEPOINT s")
    enqueue(tx, "undone")
    tx.execute("ROLLBACK TO SAVEPOINT s")
    tx.commit()
    assert [(r["id"], r["kind"]) for r in events(reader)] == [(kept, "kept")]
    call(reader, "maintain")
    assert [r["kind"] for r in events(reader)] == ["kept"]


@pytest.mark.smoke
def test_a_long_transaction_committing_later_is_delivered_after_higher_ids_were_read(
    connect: ConnectFactory,
) -> None:
    """The hard case: the long transaction appends first (lower sequence position), others commit and are
    read, then it commits: a follower whose cursor is past the others still gets it."""
    reader, other = connect(), connect()
    long_tx = connect(autocommit=False)
    held = enqueue(long_tx, "held")["id"]  # appended first, left open
    flowing = [enqueue(other, "flowing")["id"] for _ in range(5)]
    first = events(reader)
    assert [r["id"] for r in first] == flowing  # others are not stalled by the open transaction
    cursor = first[-1]["event_id"]
    call(reader, "maintain")  # a maintenance pass while it is open loses nothing either
    assert events(reader, after=cursor) == []
    long_tx.commit()
    later = events(reader, after=cursor)
    assert [(r["id"], r["kind"]) for r in later] == [(held, "held")]
    assert later[0]["event_id"] > cursor


def test_a_tick_inside_a_writing_transaction_leaves_its_own_events_for_after_commit(connect: ConnectFactory) -> None:
    """maintain() runs inside worker_heartbeat's transaction: a transaction's own uncommitted events are
    not taken by its tick, and are delivered after it commits."""
    reader = connect()
    tx = connect(autocommit=False)
    own = enqueue(tx, "own")["id"]
    call(tx, "maintain")
    enqueue(tx, "own-after-tick")
    tx.commit()
    assert [(r["id"], r["kind"]) for r in events(reader)][:1] == [(own, "own")]
    assert [r["kind"] for r in events(reader)] == ["own", "own-after-tick"]


@pytest.mark.parametrize("rotating", [False, True], ids=["steady", "rotating"])
def test_concurrent_writers_and_readers_lose_nothing_and_duplicate_nothing(
    connect: ConnectFactory, dsn: str, rotating: bool
) -> None:
    """Four writers, two followers; with ``rotating``, a third session moves the log on to its next partition
    as fast as maintain lets it meanwhile, so the followers' reads switch between reading the current
    partition alone (cursor in it) and all of them (cursor behind a rotation) while rows land."""
    stop = threading.Event()
    written = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []
    rotations: list[int] = []

    def rotator() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                call(c, "configure_stream", rotate_every="1 second")
                while not written.is_set():
                    c.execute("UPDATE pgjobs.event_rotations SET started_at = started_at - interval '10 seconds'")
                    acts = [r["action"] for r in call(c, "maintain")]  # 'busy' while a follower ticks
                    rotations.extend(1 for a in acts if a == "rotate")
                    time.sleep(0 if acts == ["busy"] else 0.05)
        except BaseException as exc:
            errors.append(exc)

    spinner = threading.Thread(target=rotator)
    if rotating:
        spinner.start()

    def follower() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                cursor = 0
                while True:
                    done = stop.is_set()
                    rows = events(c, after=cursor)
                    seen.extend(r["id"] for r in rows)
                    ids = [r["event_id"] for r in rows]
                    assert ids == sorted(ids) and all(i > cursor for i in ids)
                    if rows:
                        cursor = ids[-1]
                    elif done:
                        return
        except BaseException as exc:
            errors.append(exc)

    readers = [threading.Thread(target=follower) for _ in range(2)]
    for t in readers:
        t.start()

    def writer(i: int) -> list[int]:
        with psycopg.connect(dsn, autocommit=False) as c:
            made = []
            for n in range(40):
                made.append(enqueue(c, f"w{i}")["id"])
                if n % 3 == 0:
                    c.commit()
                    if rotating:
                        time.sleep(0.05)  # writes spread over the rotations
            c.commit()
            return made

    made = [j for batch in run_threads(4, writer) for j in batch]
    written.set()
    if rotating:
        spinner.join(60)
        assert len(rotations) >= 3, rotations  # the reads really crossed rotations
    # one last tick that surely runs (a follower's own may have been skipped while another ticked)
    while call(conn_main := connect(), "maintain")[0]["action"] == "busy":
        conn_main.close()
    stop.set()
    for t in readers:
        t.join(60)
    assert not errors, errors
    # each of the two followers saw every job's event exactly once
    assert sorted(seen) == sorted(made * 2)


def test_bad_arguments_raise_pj002(conn: Conn) -> None:
    with raises_pj("PJ002", "max_rows", "0"):
        events(conn, max_rows=0)
    with raises_pj("PJ002", "after_id", "-1"):
        events(conn, after=-1)
    with raises_pj("PJ002", "queue"):
        events(conn, queue="")
    with raises_pj("PJ002", "retention", "00:00:10"):
        call(conn, "configure_stream", retention="10 seconds")


def test_rotation_truncates_only_what_retention_lets_go(conn: Conn) -> None:
    call(conn, "configure_stream", retention="1 hour", rotate_every="1 second")
    old = enqueue(conn, "old")["id"]
    before = events(conn)
    # every inbox partition that the log has taken in is emptied
    conn.execute("UPDATE pgjobs.event_rotations SET started_at = started_at - interval '10 seconds'")
    done = {(r["action"], r["target"].split(" ")[0]) for r in call(conn, "maintain")}
    assert ("tick", "event_log") in done
    # the ring moved on (the next partition was never used), and the event is still retained
    assert any(a == "rotate" for a, _ in done)
    assert [r["id"] for r in events(conn)] == [old]
    # go around the ring: a partition whose events are younger than the retention is not truncated
    for _ in range(20):
        conn.execute("UPDATE pgjobs.event_rotations SET started_at = started_at - interval '10 seconds'")
        call(conn, "maintain")
    assert [r["event_id"] for r in events(conn)] == [before[0]["event_id"]]
    actions = [r["action"] for r in call(conn, "maintain")]
    conn.execute("UPDATE pgjobs.event_rotations SET started_at = started_at - interval '10 seconds'")
    actions += [r["action"] for r in call(conn, "maintain")]
    assert "wait" in actions  # the ring is full of retained events: rotation waits rather than drop them
    # once they are past retention, rotation truncates them; a cursor older than the log reads from its start
    conn.execute("UPDATE pgjobs.event_rotations SET started_at = started_at - interval '2 hours'")
    for _ in range(20):
        call(conn, "maintain")
    assert events(conn) == []
    new = enqueue(conn, "new")["id"]
    assert [r["id"] for r in events(conn, after=0)] == [new]
    bounds = call(conn, "stream_bounds")[0]
    assert bounds["oldest_id"] == bounds["newest_id"] > before[0]["event_id"]


NONCURRENT = "mod(floor(extract(epoch FROM now()) / 15)::bigint + 2, 4)"


def append_raw(conn: Conn, kind: str) -> None:
    """An inbox row in a partition that is not the current one (as time moving on leaves it)."""
    conn.execute(
        "INSERT INTO pgjobs.event_inbox (slot, xid, at, ids, states, queues, kinds, attempts, batch_ids)"
        f" VALUES ({NONCURRENT}, pg_current_xact_id(), now(), '{{7}}', '{{pending}}', '{{default}}', %s, '{{0}}',"
        " '{NULL}')",
        [[kind]],
    )


def test_maintain_empties_the_inbox_by_truncate(conn: Conn) -> None:
    append_raw(conn, "aged")
    assert inbox_rows(conn) == 1
    result = call(conn, "maintain")
    assert [r["rows"] for r in result if r["action"] == "tick"] == [1]
    assert [r["action"] for r in result].count("truncate") == 1
    assert inbox_rows(conn) == 0
    assert [r["kind"] for r in events(conn)] == ["aged"]


def test_maintain_skips_an_inbox_partition_a_writer_still_holds(connect: ConnectFactory) -> None:
    conn = connect()
    tx = connect(autocommit=False)
    append_raw(conn, "committed")
    append_raw(tx, "held")
    result = call(conn, "maintain")
    # the open transaction's lock keeps the partition (NOWAIT: maintenance does not queue behind it) ...
    assert [r["action"] for r in result if r["target"].startswith("event_inbox")] == ["skip"]
    assert [r["kind"] for r in events(conn)] == ["committed"]  # ... but what committed is in the log
    assert inbox_rows(conn) == 1
    tx.commit()
    result = call(conn, "maintain")
    assert [r["action"] for r in result if r["target"].startswith("event_inbox")] == ["truncate"]
    assert [r["kind"] for r in events(conn)] == ["committed", "held"]
    assert inbox_rows(conn) == 0


def test_the_hint_is_sent_only_while_someone_follows(connect: ConnectFactory) -> None:
    conn, listener = connect(), connect()
    listen(listener, "pgjobs_status", "pgjobs_wake")
    unfollow(conn)
    enqueue(conn)
    notes = drain(listener)
    assert payloads(notes, "pgjobs_status") == [] and payloads(notes, "pgjobs_wake") == ["default"]
    follow(conn)
    drain(listener)
    jid = enqueue(conn)["id"]
    hints = payloads(drain(listener), "pgjobs_status")
    assert len(hints) == 1 and '"event_id"' in hints[0] and len(hints[0]) < 100
    assert f'"id": {jid}' not in hints[0]  # nothing about jobs
    rows = events(conn)
    newest = rows[-1]["event_id"]
    # a reader that gave ids tells the other followers the newest one
    assert any(p == f'{{"event_id": {newest}}}' for p in payloads(drain(listener), "pgjobs_status"))


def test_no_hint_while_the_follower_reads_by_itself(connect: ConnectFactory) -> None:
    """A follower whose last read found events reads again by itself: writers send no hint meanwhile (each
    notifying commit would serialise with all others). Its next empty read asks for hints again."""
    conn, listener = connect(), connect()
    listen(listener, "pgjobs_status")
    enqueue(conn)
    first = events(conn)
    assert len(first) == 1  # found events: busy
    drain(listener)
    enqueue(conn)
    enqueue_n(conn, 3)
    assert payloads(drain(listener), "pgjobs_status") == []
    got = events(conn, after=first[0]["event_id"])
    assert len(got) == 4
    assert events(conn, after=got[-1]["event_id"]) == []  # caught up: idle, waiting for a hint
    drain(listener)
    enqueue(conn)
    assert len(payloads(drain(listener), "pgjobs_status")) == 1


def test_no_notify_on_claim_and_complete_many_when_nobody_follows(connect: ConnectFactory) -> None:
    """NOTIFY's commit lock is taken only by a transaction that notified: with nobody following, the hot
    paths send nothing at all (the queue usage stays 0 and a LISTENer hears nothing)."""
    conn, listener = connect(), connect()
    enqueue_n(conn, 5)
    unfollow(conn)
    listen(listener, "pgjobs_status", "pgjobs_wake", "pgjobs_cancel")
    drain(listener)
    got = claim(conn, max_jobs=5)
    scalar(conn, "complete_many", ids=[g["id"] for g in got], lease_tokens=[g["lease_token"] for g in got])
    c = enqueue(conn, run_at=datetime(2100, 1, 1, tzinfo=UTC))
    assert c["state"] == "scheduled"
    assert drain(listener) == []
    assert len(events(conn)) == 16  # logged all the same


def test_log_keeps_long_names_exactly(conn: Conn) -> None:
    """No NOTIFY payload limit applies to the log: the longest kind there is (1,000 bytes) is logged whole."""
    huge = "k" * 1000
    jid = enqueue(conn, huge)["id"]
    rows = events(conn)
    assert [(r["id"], r["kind"]) for r in rows] == [(jid, huge)]


def test_a_bulk_enqueue_logs_each_job_once_in_spec_order(conn: Conn) -> None:
    specs = [{"kind": f"k{i % 3}", "queue": f"q{i % 2}"} for i in range(1500)]
    rows = call(conn, "enqueue_many", jobs=specs)
    logged = events(conn, max_rows=5000)
    assert [r["id"] for r in logged] == [r["id"] for r in rows]
    assert [(r["kind"], r["queue"]) for r in logged] == [(s["kind"], s["queue"]) for s in specs]


def test_at_most_one_hint_per_writing_transaction(connect: ConnectFactory) -> None:
    """A writer hints once per transaction however many transition calls it makes: a tick between two of
    them (which changes the hint's text, so NOTIFY would not fold them) does not make a second, and a hint
    taken back with a rolled-back savepoint is sent again by the next call."""
    writer, other, listener = connect(autocommit=False), connect(), connect()
    listen(listener, "pgjobs_status")
    follow(other)
    drain(listener)
    writer.execute("SAVEPOINT s")
    enqueue(writer)
    writer.execute("ROLLBACK TO SAVEPOINT s")  # its hint goes with it
    enqueue(writer)  # armed: hints again
    enqueue(other)  # another writer, and a reader that ticks: the sequence moves on ...
    assert len(events(other)) == 1
    follow(other)  # ... and the follower waits for a hint again
    enqueue(writer)
    enqueue_n(writer, 3)
    drain(listener)
    writer.commit()
    hints = payloads(drain(listener), "pgjobs_status")
    assert len(hints) == 1 and '"pending": true' in hints[0], hints
    assert len(events(other)) == 1 + 5  # the other writer's, and the writer's but the rolled-back one


def test_stream_bounds_after_a_rotation_with_nothing_ticked_since(conn: Conn) -> None:
    """The newest id is looked up in the partition the ticker writes now; right after a rotation that one
    is empty, and the newest id is still found (in the partition before)."""
    call(conn, "configure_stream", rotate_every="1 second")
    enqueue_n(conn, 3)
    newest = events(conn)[-1]["event_id"]
    conn.execute("UPDATE pgjobs.event_rotations SET started_at = started_at - interval '10 seconds'")
    assert "rotate" in [r["action"] for r in call(conn, "maintain")]
    oldest = events(conn)[0]["event_id"]
    assert call(conn, "stream_bounds")[0] == {"oldest_id": oldest, "newest_id": newest}
    enqueue(conn)
    later = events(conn, after=newest)
    assert len(later) == 1
    assert call(conn, "stream_bounds")[0] == {"oldest_id": oldest, "newest_id": later[0]["event_id"]}


def test_a_read_from_any_cursor_across_rotations_returns_exactly_the_rest_of_the_log(conn: Conn) -> None:
    """A read whose cursor is in the partition the ticker writes now reads that partition alone (the others
    pruned); one further back reads them all. From every cursor, over two rotations (one of them followed by
    nothing ticked), each read must be exactly the log after the cursor, filtered or not."""
    call(conn, "configure_stream", rotate_every="1 second")

    def rotate() -> None:
        conn.execute("UPDATE pgjobs.event_rotations SET started_at = started_at - interval '10 seconds'")
        assert "rotate" in [r["action"] for r in call(conn, "maintain")]

    watched = enqueue_n(conn, 3, queue="a") + enqueue_n(conn, 2, queue="b")
    rotate()
    enqueue_n(conn, 4, queue="b")
    watched += enqueue_n(conn, 2, queue="a")
    rotate()  # and nothing ticked after it: the current partition is empty
    log = events(conn)
    first = log[0]["event_id"]
    slots = {r[0] for r in conn.execute("SELECT DISTINCT slot FROM pgjobs.event_log WHERE last_id >= %s", (first,))}
    assert len(slots) == 2 and len(log) == 11, (slots, short(log))
    assert call(conn, "stream_head")[0]["newest_id"] == log[-1]["event_id"]
    enqueue_n(conn, 3, queue="a")  # into the third partition
    log = events(conn)
    assert len(log) == 14 and call(conn, "stream_head")[0]["newest_id"] == log[-1]["event_id"]
    ids = [r["event_id"] for r in log]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for cursor in range(0, ids[-1] + 2):
        rest = [r for r in log if r["event_id"] > cursor]
        assert events(conn, after=cursor) == rest, cursor
        assert events(conn, after=cursor, max_rows=2) == rest[:2], cursor
        assert events(conn, after=cursor, queue="a") == [r for r in rest if r["queue"] == "a"], cursor
        assert events(conn, after=cursor, job_ids=watched) == [r for r in rest if r["id"] in watched], cursor


_LOG_ROWS_READ = """
SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(i.inhrelid) + pg_stat_get_xact_tuples_fetched(i.inhrelid)), 0)
  FROM pg_inherits AS i
 WHERE i.inhparent = 'pgjobs.event_log'::regclass
"""


def test_a_page_reads_the_log_rows_it_returns_not_the_whole_backlog(conn: Conn) -> None:
    """A follower catching up pages through a backlog: each page reads the log rows it needs, in event_id
    order, not every row after its cursor (a log partition is never analysed: the generic plan read them
    all by a sequential scan, unnested every event and sorted them for one page, O(backlog) a page)."""
    for _ in range(200):  # 200 log rows of 5 events each
        call(conn, "enqueue_many", jobs=[{"kind": "k"} for _ in range(5)])
    conn.execute("SELECT count(*) FROM pgjobs.maintain()")
    everything = events(conn, max_rows=1000)
    assert len(everything) == 1000
    with conn.transaction():
        before = int(conn.execute(_LOG_ROWS_READ).fetchone()[0])  # type: ignore[index]
        page = events(conn, after=everything[100]["event_id"], max_rows=20)
        rows_read = int(conn.execute(_LOG_ROWS_READ).fetchone()[0]) - before  # type: ignore[index]
    assert [e["event_id"] for e in page] == [e["event_id"] for e in everything[101:121]]
    assert rows_read <= 10, rows_read  # 4 or 5 rows hold those 20 events; before: all 200
