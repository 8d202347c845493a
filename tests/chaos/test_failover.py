"""Failover: the primary is killed (SIGKILL, the postmaster and all its children) under load and its standby promoted.

A private primary and standby (``tests/helpers/replication.py``: PostgreSQL 15's initdb, ``pg_basebackup -R``,
``synchronous_standby_names``; skipped without the binaries). Everything connects with the multi-host DSN
``host=a,b port=p1,p2 target_session_attrs=read-write`` and finds the promoted server by itself:

* a producer (this process, a thread) enqueues jobs one call at a time, some as a parent and a child that depends
  on it, some on a fair queue in five groups, each with a unique key, and retries a call that failed (the key
  makes the retry idempotent); an id it got back is acknowledged;
* two worker processes (``tests/helpers/apps/failover_app.py``) run them, and both run the scheduler of a
  code-defined schedule that fires every second; each run is recorded in ``runs``;
* a status follower (``subscribe()``, a thread) reads every event of every queue.

A trigger on the succeeded partition tree writes ``completions`` in the completing transaction itself, so a job
that completed twice would show two rows. With the synchronous standby: every acknowledged job is found and
completes exactly once, the follower never sees an event id repeat or go back (and hears every completion), the
schedule fires once per due time and again after the promotion, the event-id block is reserved anew (the unlogged
copy is empty on a promoted standby) above everything handed out, every sequence is above the values its column
holds, and the job invariants hold. With an asynchronous standby whose replication is cut before the kill (and an
event-id block reserved after the cut, which the standby never gets) the jobs acknowledged after the cut are lost
(the test reports how many); everything that is there is consistent in the same ways, and the follower's ids
still never repeat or go back.

The measurements (jobs lost, jobs run twice, outage seconds) go to stderr as ``failover: {...}``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from psycopg_pool import ConnectionPool

from pgjobs import AsyncClient, Client
from pgjobs.ops.migrate import migrate
from tests.helpers.apps.procs import REPO, wait_for
from tests.helpers.invariants import violations
from tests.helpers.replication import Pair, bin_dir, free_port, replicated_pair

pytestmark = [
    pytest.mark.slow,
    pytest.mark.failover,
    pytest.mark.skipif(bin_dir() is None, reason="no PostgreSQL 15 binaries (initdb, pg_basebackup) to run a standby"),
]

APP = REPO / "tests" / "helpers" / "apps" / "failover_app.py"
JOBS = 2400  # acknowledged jobs the producer aims at (a fifth of them parent + child pairs)
WORKER = {"queues": {"default": 8, "fair": 4}, "lease": 5.0, "heartbeat_interval": 0.5, "reap_after": 5.0,
          "poll_interval": 0.5, "grace_period": 2.0, "scheduler": True}  # fmt: skip

SETUP_SQL = """
CREATE TABLE public.runs (job_id bigint NOT NULL, attempt int NOT NULL, worker text NOT NULL,
                          at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE public.completions (job_id bigint NOT NULL, attempt int NOT NULL, kind text NOT NULL,
                                 at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION public.note_completion() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.completions (job_id, attempt, kind) VALUES (NEW.id, NEW.attempt, NEW.kind);
    RETURN NULL;
END $$;
-- A terminal UPDATE moves the row into this tree: the trigger runs in the completing transaction.
CREATE TRIGGER note_completion AFTER INSERT ON pgjobs.jobs_succeeded
    FOR EACH ROW EXECUTE FUNCTION public.note_completion();
-- A fair queue too: its claims keep state of their own (the ring rows, the ledger) that must survive.
SELECT pgjobs.configure_queue('fair', fair => true);
"""

# Each sequence of the schema and a column that holds its values: identity and serial columns, columns whose
# default draws from it, and the fair queues' ring rows. (A sequence's WAL comes before any row that holds
# one of its values, so a standby never has the row without the sequence past it.)
SEQUENCES_SQL = r"""
SELECT s.relname, t.relname, a.attname
  FROM pg_depend AS d
  JOIN pg_class AS s ON s.oid = d.objid AND s.relkind = 'S'
  JOIN pg_class AS t ON t.oid = d.refobjid
  JOIN pg_attribute AS a ON a.attrelid = t.oid AND a.attnum = d.refobjsubid
 WHERE s.relnamespace = 'pgjobs'::regnamespace AND d.deptype IN ('a', 'i') AND NOT t.relispartition
UNION
SELECT substring(pg_get_expr(ad.adbin, ad.adrelid) FROM 'nextval\(''(?:pgjobs\.)?(\w+)'), t.relname, a.attname
  FROM pg_attrdef AS ad
  JOIN pg_class AS t ON t.oid = ad.adrelid
  JOIN pg_attribute AS a ON a.attrelid = t.oid AND a.attnum = ad.adnum
 WHERE t.relnamespace = 'pgjobs'::regnamespace AND NOT t.relispartition
   AND pg_get_expr(ad.adbin, ad.adrelid) LIKE 'nextval(%'
UNION
SELECT 'fair_rings_seq', 'fair_rings', 'seq'
"""


@dataclass
class Load:
    dsn: str
    acked: dict[str, int] = field(default_factory=dict)  # unique key -> job id, once its enqueue returned
    producer_errors: int = 0
    stats_ok: list[float] = field(default_factory=list)  # time.monotonic() of each stats() that answered
    stats_errors: int = 0
    # (event_id, job id, state, time.monotonic() at receipt) as followed
    events: list[tuple[int, int, str, float]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    produced: threading.Event = field(default_factory=threading.Event)
    failures: list[BaseException] = field(default_factory=list)

    def produce(self) -> None:
        # Its own small pool: a call waits at most 2 s for a connection, then fails and is retried here.
        pool: ConnectionPool[Any] = ConnectionPool(
            self.dsn, min_size=1, max_size=2, timeout=2.0, reconnect_timeout=2.0, kwargs={"autocommit": True},
            open=True, name="producer",
        )  # fmt: skip
        try:
            with Client(pool=pool) as client:
                i = 0
                while i < JOBS and not self.stop.is_set():
                    try:
                        if i % 10 == 0:
                            got = client.enqueue_many([
                                {"ref": "p", "kind": "effect", "unique_key": f"p{i}"},
                                {"ref": "c", "kind": "effect", "unique_key": f"c{i}", "depends_on": [{"ref": "p"}]},
                            ])  # fmt: skip
                            self.acked[f"p{i}"], self.acked[f"c{i}"] = got[0].id, got[1].id
                            i += 2
                        else:
                            fair = {"queue": "fair", "group_key": f"t{i % 5}"} if i % 3 == 0 else {}
                            self.acked[f"k{i}"] = client.enqueue("effect", {"i": i}, unique_key=f"k{i}", **fair).id
                            i += 1
                    except psycopg.OperationalError:
                        self.producer_errors += 1  # the server is failing over: the same call again
                        time.sleep(0.1)
        except BaseException as exc:
            self.failures.append(exc)
        finally:
            pool.close()
            self.produced.set()

    def follow(self) -> None:
        async def run() -> None:
            async with AsyncClient(self.dsn, min_size=1, max_size=2) as client, anyio.create_task_group() as tg:

                async def watch() -> None:
                    while not self.stop.is_set():
                        await anyio.sleep(0.05)
                    tg.cancel_scope.cancel()

                async def read_stats() -> None:
                    # An async reader of the same client: its pool finds the primary gone and the promoted one.
                    while True:
                        try:
                            await client.stats()
                            self.stats_ok.append(time.monotonic())
                        except psycopg.OperationalError:
                            self.stats_errors += 1
                        await anyio.sleep(0.2)

                tg.start_soon(watch)
                tg.start_soon(read_stats)
                async for ev in client.subscribe(after_id=0, poll_interval=0.5):
                    assert ev.event_id is not None
                    self.events.append((ev.event_id, ev.id, ev.state.value, time.monotonic()))

        try:
            anyio.run(run)
        except BaseException as exc:
            self.failures.append(exc)


@contextlib.contextmanager
def workers(dsn: str, log_dir: Path, n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        for i in range(n):
            with (log_dir / f"worker-{i}.log").open("wb") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, str(APP), dsn, json.dumps(WORKER)], cwd=REPO, env=env, stdout=out, stderr=out
                ))  # fmt: skip
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def one(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> Any:
    row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


@pytest.mark.parametrize("synchronous", [True, False], ids=["synchronous", "asynchronous"])
def test_failover_under_load(synchronous: bool, caplog: pytest.LogCaptureFixture) -> None:
    measured: dict[str, Any] = {"standby": "synchronous" if synchronous else "asynchronous"}
    with replicated_pair(synchronous=synchronous) as pair, tempfile.TemporaryDirectory() as logs:
        migrate(pair.primary.dsn())
        with psycopg.connect(pair.primary.dsn(), autocommit=True) as conn:
            conn.execute(SETUP_SQL)
        load = Load(pair.multi_host_dsn("postgres"))
        threads = [threading.Thread(target=f, daemon=True) for f in (load.produce, load.follow)]
        with workers(load.dsn, Path(logs), 2) as procs:
            for t in threads:
                t.start()
            try:
                times = _fail_over(pair, load, measured)
                wait_for(load.produced.is_set, 90, "the producer to finish")
                assert not load.failures, load.failures
                assert len(load.acked) == JOBS
                _settle(pair, load)
                assert all(p.poll() is None for p in procs), "a worker process exited"
            finally:
                load.stop.set()
                for t in threads:
                    t.join(30)
        assert not load.failures, load.failures
        log_text = {p.name: p.read_text(errors="replace") for p in sorted(Path(logs).iterdir())}
        with psycopg.connect(pair.standby.dsn(), autocommit=True) as conn:
            _check(conn, load, synchronous, times, measured)
        _check_logs(log_text, measured)
        # This process: the producer's pool and the follower's client pool said it once each (not once per failed
        # call), the follower's LISTEN once; the async reader got through again after the promotion.
        said = [(r.name, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
        pools = sorted(m.split()[2] for n, m in said if n == "pgjobs.client")
        assert pools == ["pgjobs", "producer"], said
        assert len([m for n, m in said if n == "pgjobs.listen"]) == 1, said
        assert load.stats_ok and load.stats_ok[-1] > times.promoted_mono
        measured["async_reader_errors"] = load.stats_errors
    sys.stderr.write(f"failover: {json.dumps(measured)}\n")


@dataclass(frozen=True)
class Times:
    killed_at: float  # time.time()
    promoted_at: float
    killed_mono: float  # time.monotonic(), as the follower's receipts
    promoted_mono: float


def _fail_over(pair: Pair, load: Load, measured: dict[str, Any]) -> Times:
    """Waits until a third of the jobs are acknowledged and some completed, kills the primary, promotes the standby."""
    with psycopg.connect(pair.primary.dsn(), autocommit=True) as conn:
        wait_for(lambda: len(load.acked) >= JOBS // 3 and one(conn, "SELECT count(*) FROM completions") > 50,
                 60, "load before the kill")  # fmt: skip
        # The logged end of the event-id block as the standby has it (the unlogged copy is the primary's alone).
        measured["block_end_before"] = one(conn, "SELECT hi FROM pgjobs.event_id_block")
    if not pair.synchronous:
        _cut_replication(pair, load, measured)
    measured["acked_at_kill"] = len(load.acked)
    killed_at, killed_mono = time.time(), time.monotonic()
    pair.primary.kill9()
    # Two seconds without a primary: every client finds it gone and retries with backoff, and the outage lasts
    # long enough for the worker's own one line about it (written after a second unreachable).
    time.sleep(2.0)
    pair.standby.promote()
    promoted_at, promoted_mono = time.time(), time.monotonic()
    wait_for(lambda: not pair.standby.in_recovery(), 30, "the promotion")
    measured["kill_to_promoted_s"] = round(promoted_at - killed_at, 2)
    return Times(killed_at, promoted_at, killed_mono, promoted_mono)


def _cut_replication(pair: Pair, load: Load, measured: dict[str, Any]) -> None:
    """An asynchronous standby that fell behind: its walreceiver is pointed at a port where nothing listens, so
    what the primary commits from now on (and acknowledges: it waits for no standby) never reaches it."""
    with psycopg.connect(pair.standby.dsn(), autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET primary_conninfo TO 'host=127.0.0.1 port={free_port()} user=postgres'")
        conn.execute("SELECT pg_reload_conf()")
    with psycopg.connect(pair.primary.dsn(), autocommit=True) as conn:
        wait_for(lambda: one(conn, "SELECT count(*) FROM pg_stat_replication") == 0, 30, "the standby to disconnect")
        # The next ticks pass the end of the reserved block: the primary reserves the next one, which the cut
        # standby never learns of, and the follower reads ids from it. (Without the timeline floor the promoted
        # standby would hand those ids out again, to events the follower's cursor has passed: lost to it.)
        conn.execute("SELECT setval('pgjobs.event_id_seq', (SELECT hi - 3 FROM pgjobs.event_id_block))")
        end = measured["block_end_before"]
        wait_for(lambda: one(conn, "SELECT hi FROM pgjobs.event_id_block") > end, 30, "a block the standby lacks")
    cut = len(load.acked)
    wait_for(lambda: len(load.acked) >= cut + 200, 60, "acknowledged jobs the standby will not have")
    wait_for(lambda: load.events and load.events[-1][0] > end, 30, "the follower to read ids of the new block")
    measured["acked_after_cut"] = len(load.acked) - cut


def _settle(pair: Pair, load: Load) -> None:
    """Until every job on the promoted server is finished and the follower has heard of every completion."""
    with psycopg.connect(pair.standby.dsn(), autocommit=True) as conn:

        def finished() -> bool:
            # (the schedule's own runs keep coming: not waited for)
            live = one(conn, "SELECT count(*) FROM pgjobs.jobs WHERE schedule_name IS NULL"
                             " AND state IN ('waiting', 'scheduled', 'pending', 'active')")  # fmt: skip
            return bool(live == 0)

        wait_for(finished, 90, "every job on the promoted server to finish")
        done = {r[0] for r in conn.execute("SELECT id FROM pgjobs.jobs WHERE state = 'succeeded' AND kind = 'effect'")}
        wait_for(lambda: done <= {i for _, i, s, _ in list(load.events) if s == "succeeded"}, 60,
                 "the follower to hear of every completion")  # fmt: skip


def _check(
    conn: psycopg.Connection[Any],
    load: Load,
    synchronous: bool,
    times: Times,
    measured: dict[str, Any],
) -> None:
    jobs = {r[0]: r[1] for r in conn.execute("SELECT id, state::text FROM pgjobs.jobs WHERE kind = 'effect'")}
    keys = dict(conn.execute("SELECT unique_key, id FROM pgjobs.jobs WHERE kind = 'effect'").fetchall())
    # By unique key: a job the failover lost may see its id handed out again (the identity sequence is where
    # the standby had it), to another job.
    lost = {k for k in load.acked if k not in keys}
    other = {k for k, i in load.acked.items() if k in keys and keys[k] != i}
    measured.update(jobs=len(jobs), acked=len(load.acked), acked_lost=len(lost), acked_other_id=len(other),
                    ids_reused=len({load.acked[k] for k in lost} & set(jobs)),
                    producer_retries=load.producer_errors)  # fmt: skip
    if synchronous:
        assert not lost and not other, f"acknowledged jobs missing after the failover: {sorted(lost)[:20]}"
    else:
        assert lost, "the cut standby lacks the jobs acknowledged after the cut"
    assert all(state == "succeeded" for state in jobs.values()), {s for s in jobs.values()}

    # Exactly one completion per succeeded job, written in the completing transaction (both kinds).
    dup = conn.execute("SELECT job_id, count(*) FROM completions GROUP BY 1 HAVING count(*) > 1").fetchall()
    assert dup == [], f"jobs completed twice: {dup[:20]}"
    missing = one(conn, "SELECT count(*) FROM pgjobs.jobs AS j WHERE j.state = 'succeeded'"
                        " AND NOT EXISTS (SELECT 1 FROM completions AS c WHERE c.job_id = j.id)")  # fmt: skip
    assert missing == 0
    # Runs (handler side effects, outside the completion): more than one for a job only if a claim was lost.
    measured["jobs_run_twice"] = one(conn, "SELECT count(*) FROM (SELECT job_id FROM runs GROUP BY 1"
                                           " HAVING count(*) > 1) AS r")  # fmt: skip

    # The follower: event ids strictly increasing (never repeated, never back), every completion heard.
    ids = [e for e, _, _, _ in load.events]
    assert all(b > a for a, b in itertools.pairwise(ids)), "an event id repeated or went back"
    measured["events_followed"] = len(ids)
    old = [e for e, _, _, t in load.events if t < times.killed_mono]  # from the old primary
    new = [e for e, _, _, t in load.events if t > times.promoted_mono]  # from the promoted standby
    assert old and new
    # Ids given after the promotion start above every id the old primary handed out, above the block end the
    # standby had (the new primary found the unlogged copy empty and reserved anew) and above the new timeline's
    # floor (timeline 2: 2^44), which the asynchronous run needs: the standby lacks the old primary's last block.
    live, logged = conn.execute(
        "SELECT (SELECT hi FROM pgjobs.event_id_block_live), (SELECT hi FROM pgjobs.event_id_block)"
    ).fetchone() or (None, None)
    assert live is not None and live == logged and logged > measured["block_end_before"]
    assert one(conn, "SELECT pgjobs._timeline_floor()") == 1 << 44
    assert min(new) > max(old) and min(new) > 1 << 44
    newest = one(conn, "SELECT max(last_id) FROM pgjobs.event_log")
    measured.update(old_ids_up_to=max(old), new_ids_from=min(new))

    # The schedule: once per due time, and firing again after the promotion.
    ticks = conn.execute(
        "SELECT (meta->>'scheduled_for')::timestamptz, count(*) FROM pgjobs.jobs WHERE schedule_name = 'tick'"
        " GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert ticks and all(n == 1 for _, n in ticks), [t for t in ticks if t[1] > 1]
    assert any(t.timestamp() > times.promoted_at for t, _ in ticks), "the schedule did not fire after the promotion"
    measured["schedule_runs"] = len(ticks)

    # Every sequence above its column's values; the event-id sequence above every id in the log.
    for seq, table, column in conn.execute(SEQUENCES_SQL).fetchall():
        top = one(conn, f'SELECT max("{column}") FROM pgjobs."{table}"')
        last = one(conn, "SELECT pg_sequence_last_value(%s::regclass)", (f"pgjobs.{seq}",))
        assert top is None or (last is not None and last >= top), (seq, table, column, last, top)
    assert one(conn, "SELECT pg_sequence_last_value('pgjobs.event_id_seq')") >= newest

    # Claim state and the job model's invariants; a new job is claimable and gets a new id.
    assert violations(conn) == {}
    top_id = one(conn, "SELECT max(id) FROM pgjobs.jobs")
    new_id = one(conn, "SELECT id FROM pgjobs.enqueue('after-failover', queue => 'after')")
    assert new_id > top_id
    claimed = conn.execute("SELECT id FROM pgjobs.claim('probe', '{after}')").fetchall()
    assert claimed == [(new_id,)]
    measured["outage_s"] = _outage(conn, times.killed_at)


def _outage(conn: psycopg.Connection[Any], killed_at: float) -> float:
    """Seconds from the kill to the first completion on the promoted server (none can commit in the two seconds
    between the kill and the promotion: the old primary's last ones, just before the kill, are not counted)."""
    first = one(
        conn, "SELECT min(extract(epoch FROM at)) FROM completions WHERE at > to_timestamp(%s)", (killed_at + 0.5,)
    )
    return round(float(first) - killed_at, 2) if first is not None else -1.0


def _check_logs(logs: dict[str, str], measured: dict[str, Any]) -> None:
    """No traceback; the failover costs each worker one WARNING line and one INFO line, not a line per call (and a
    line per job whose claim it lost)."""
    for name, text in logs.items():
        assert "Traceback" not in text, f"{name}:\n{text[-3000:]}"
        warnings = [line for line in text.splitlines() if re.search(r"\bWARNING\b|\bERROR\b", line)]
        # A job whose claim the failover lost ran on here while another worker took it on the new primary: one
        # line for that job (not for a call), as for any lease lost.
        lost = [line for line in warnings if re.search(r"lost in [\d.]+ s: lease lost", line)]
        warnings = [line for line in warnings if line not in lost]
        measured[f"{name}_warnings"] = len(warnings)
        measured[f"{name}_leases_lost"] = len(lost)
        sys.stderr.write(f"{name} warnings:\n" + "\n".join(warnings + lost) + "\n")
        # One line when the worker found the database gone (its claimers, completer, LISTEN and scheduler all
        # report to it), one when it came back.
        assert len(warnings) == 1 and re.search(r"WARNING\s+pgjobs\.worker: database unreachable", warnings[0]), (
            f"{name}: {len(warnings)} warnings for one outage:\n" + "\n".join(warnings)
        )
        assert len(re.findall(r"INFO\s+pgjobs\.worker: database reachable again", text)) == 1, text[-3000:]
