"""A private primary and hot standby (streaming replication) on loopback, for the failover and standby-read tests.

``replicated_pair(synchronous=True, standbys=1)`` runs ``initdb`` for a primary, ``pg_basebackup -R`` for
its standby (named ``standby1``; with ``synchronous`` the primary lists it in ``synchronous_standby_names``; a
second one, ``standby2``, is asynchronous), starts them on free ports with their sockets in a temporary
directory of their own, and stops them (immediate) at exit, whatever state the test left them in.
``Node.kill9()`` kills a postmaster and every child of it with SIGKILL; ``Node.promote()`` promotes a standby.

The binaries are PostgreSQL 15's (``PGJOBS_PG_BIN`` or ``/usr/lib/postgresql/15/bin``); ``bin_dir()`` is None
when they are absent, and the tests skip. As root, the servers run as the ``postgres`` system user (initdb refuses
root). The servers run with ``fsync = off``: the tests kill processes, never the machine, and the page cache
outlives a process.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

DEFAULT_BIN = "/usr/lib/postgresql/15/bin"


def bin_dir() -> Path | None:
    """The directory of initdb, pg_ctl, pg_basebackup and postgres, or None when they are not installed (or when
    we are root and there is no ``postgres`` user to run them as)."""
    path = Path(os.environ.get("PGJOBS_PG_BIN", DEFAULT_BIN))
    needed = ("initdb", "pg_ctl", "pg_basebackup", "postgres")
    if os.geteuid() == 0 and _server_user() is None:
        return None
    return path if all((path / b).is_file() for b in needed) else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _server_user() -> str | None:
    """The user the servers run as: ``postgres`` when we are root, else ourselves (None)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return None
    return "postgres"


@dataclass
class Node:
    name: str
    data_dir: Path
    port: int
    bins: Path
    sock_dir: Path
    user: str | None

    def run(self, tool: str, *args: str, timeout: float = 60) -> str:
        proc = subprocess.run(
            [str(self.bins / tool), *args],
            user=self.user,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.sock_dir,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} failed ({proc.returncode}): {proc.stderr or proc.stdout}")
        return proc.stdout

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname} connect_timeout=3"

    def start(self) -> None:
        log = self.sock_dir / f"{self.name}.log"
        self.run("pg_ctl", "-D", str(self.data_dir), "-l", str(log), "-w", "-t", "60", "start")

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.run("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop", timeout=30)

    def postmaster_pid(self) -> int | None:
        pidfile = self.data_dir / "postmaster.pid"
        try:
            return int(pidfile.read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def kill9(self) -> list[int]:
        """SIGKILL the postmaster and all its children at once (no shutdown of any kind); returns the pids."""
        pid = self.postmaster_pid()
        assert pid is not None, f"{self.name} is not running"
        pids = [pid, *_children(pid)]
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        return pids

    def promote(self) -> None:
        self.run("pg_ctl", "-D", str(self.data_dir), "-w", "-t", "60", "promote")

    def in_recovery(self) -> bool:
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
            return bool(row and row[0])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _children(parent: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            out.append(int(entry.name))
    return out


@dataclass
class Pair:
    primary: Node
    standbys: list[Node]
    synchronous: bool

    @property
    def standby(self) -> Node:
        """The first standby (the synchronous one when ``synchronous``)."""
        return self.standbys[0]

    def multi_host_dsn(self, dbname: str, attrs: str = "read-write", **extra: Any) -> str:
        """``host=a,b port=p1,p2 target_session_attrs=...``: libpq tries the hosts in order for one that fits."""
        opts = " ".join(f"{k}={v}" for k, v in extra.items())
        return (
            f"host=127.0.0.1,127.0.0.1 port={self.primary.port},{self.standby.port} user=postgres dbname={dbname}"
            f" target_session_attrs={attrs} connect_timeout=2 {opts}"
        ).strip()

    def wait_replayed(self, timeout: float = 30.0) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        with psycopg.connect(self.primary.dsn(), autocommit=True) as p:
            row = p.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            assert row is not None
            target = row[0]
        deadline = time.monotonic() + timeout
        for node in self.standbys:
            with psycopg.connect(node.dsn(), autocommit=True) as s:
                while time.monotonic() < deadline:
                    r = s.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)).fetchone()
                    if r and r[0]:
                        break
                    time.sleep(0.02)
                else:
                    raise AssertionError(f"{node.name} did not replay up to {target} in {timeout} s")


_CONF = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{sock}'
max_connections = 60
shared_buffers = 32MB
fsync = off
full_page_writes = off
wal_level = replica
max_wal_senders = 4
wal_keep_size = 256MB
hot_standby = on
hot_standby_feedback = on
wal_receiver_status_interval = 1s
logging_collector = off
log_min_messages = warning
autovacuum_naptime = 5s
"""


@contextlib.contextmanager
def replicated_pair(synchronous: bool = True, standbys: int = 1) -> Iterator[Pair]:
    """A running primary and hot standby (see the module docstring); both stopped at exit. ``standbys=2`` adds
    ``standby2``, always asynchronous."""
    bins = bin_dir()
    assert bins is not None, "no PostgreSQL binaries"
    user = _server_user()
    # A directory of its own in the system's temp dir (pytest's are private to root, and as root the servers
    # run as postgres), removed at exit.
    base = Path(tempfile.mkdtemp(prefix="pgjobs-replicas-"))
    if user is not None:
        shutil.chown(base, user)
    primary = Node("primary", base / "primary", free_port(), bins, base, user)
    nodes = [Node(f"standby{i}", base / f"standby{i}", free_port(), bins, base, user) for i in range(1, standbys + 1)]
    try:
        primary.run("initdb", "-D", str(primary.data_dir), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        sync = "synchronous_standby_names = 'standby1'" if synchronous else ""
        with (primary.data_dir / "postgresql.conf").open("a") as f:
            f.write(_CONF.format(port=primary.port, sock=base) + sync + "\ncluster_name = 'primary'\n")
        primary.start()
        for standby in nodes:
            primary.run(
                "pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
                "-D", str(standby.data_dir), "-R", "-X", "stream", "-c", "fast", "--no-sync",
            )  # fmt: skip
            with (standby.data_dir / "postgresql.conf").open("a") as f:
                # cluster_name is the walreceiver's application_name: the name synchronous_standby_names lists.
                f.write(f"port = {standby.port}\ncluster_name = '{standby.name}'\nsynchronous_standby_names = ''\n")
            standby.start()
        pair = Pair(primary, nodes, synchronous)
        _wait_streaming(pair)
        yield pair
    finally:
        for node in nodes:
            node.stop()
        primary.stop()
        for node in (primary, *nodes):  # a kill9'd or crashed one: pg_ctl found nothing to stop
            pid = node.postmaster_pid()
            if pid is not None and _alive(pid):
                for p in [pid, *_children(pid)]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)


def _wait_streaming(pair: Pair, timeout: float = 30.0) -> None:
    want = {n.name: "sync" if pair.synchronous and n is pair.standby else "async" for n in pair.standbys}
    deadline = time.monotonic() + timeout
    with psycopg.connect(pair.primary.dsn(), autocommit=True) as conn:
        while time.monotonic() < deadline:
            rows = conn.execute(
                "SELECT application_name, sync_state FROM pg_stat_replication WHERE state = 'streaming'"
            ).fetchall()
            if dict(rows) == want:
                return
            time.sleep(0.05)
    raise AssertionError(f"the standbys are not streaming as {want} after {timeout} s")
