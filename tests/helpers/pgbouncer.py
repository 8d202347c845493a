"""A private PgBouncer for tests: config in a temp dir, a port from the OS, transaction pooling, trust auth.

``start_pgbouncer(server_dsn)`` returns a :class:`Bouncer` whose ``dsn(dbname)`` goes through it to the same
server; ``stop()`` ends the process (a context manager does both). The pool is small on purpose (2 server
connections per database/user): clients share server sessions all the time, so anything that leans on
session state (SET, session advisory locks, LISTEN, prepared statements) breaks visibly.

PgBouncer refuses to run as root; as root the process switches user with ``-u`` (see :func:`_run_as`).
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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def pgbouncer_binary() -> str | None:
    found = shutil.which("pgbouncer")
    if found:
        return found
    return next((c for c in CANDIDATES if os.access(c, os.X_OK)), None)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_as(server_dsn: str) -> str | None:
    """Who PgBouncer runs as when we are root: the owner of the server's socket directory when the server is
    reached by a unix socket (the embedded PostgreSQL: only its owner may connect), else postgres or nobody."""
    if os.geteuid() != 0:
        return None
    host = conninfo_to_dict(server_dsn).get("host") or ""
    if host.startswith("/"):
        owner = pwd.getpwuid(os.stat(host).st_uid).pw_name
        if owner != "root":
            return owner
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("pgbouncer will not run as root and neither 'postgres' nor 'nobody' exists")


@dataclass
class Bouncer:
    port: int
    server_dsn: str
    workdir: Path
    process: subprocess.Popen[bytes]

    def dsn(self, dbname: str) -> str:
        """A DSN through PgBouncer to ``dbname`` (user and password of the server DSN)."""
        params = conninfo_to_dict(self.server_dsn)
        keep = {k: v for k, v in params.items() if k in ("user", "password") and v}
        return make_conninfo("", host="127.0.0.1", port=str(self.port), dbname=dbname, **keep)

    def log(self) -> str:
        path = self.workdir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # immediate shutdown (SIGINT waits for clients)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _config(server_dsn: str, port: int, workdir: Path, pool_size: int, settings: Mapping[str, str]) -> str:
    params = conninfo_to_dict(server_dsn)
    host = params.get("host") or "127.0.0.1"
    server_port = params.get("port") or "5432"
    return "\n".join(
        [
            "[databases]",
            # every database of the test server, under its own name
            f"* = host={host} port={server_port}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {workdir / 'userlist.txt'}",
            "pool_mode = transaction",
            f"default_pool_size = {pool_size}",
            "max_client_conn = 200",
            "server_lifetime = 3600",
            f"logfile = {workdir / 'pgbouncer.log'}",
            f"pidfile = {workdir / 'pgbouncer.pid'}",
            "admin_users = postgres",
            *(f"{k} = {v}" for k, v in settings.items()),
            "",
        ]
    )


def start_pgbouncer(
    server_dsn: str,
    *,
    pool_size: int = 2,
    dbname: str = "postgres",
    port: int | None = None,
    settings: Mapping[str, str] | None = None,
) -> Bouncer:
    """Starts PgBouncer in transaction mode in front of ``server_dsn``'s server; waits until ``dbname`` answers
    through it. ``port``: that one (a restart after ``stop()``), else one from the OS. ``settings``: more lines
    of its ``[pgbouncer]`` section (``{"ignore_startup_parameters": "options"}``)."""
    binary = pgbouncer_binary()
    if binary is None:
        raise FileNotFoundError("pgbouncer is not installed (Debian: apt-get install -y pgbouncer)")
    user = conninfo_to_dict(server_dsn).get("user") or "postgres"
    last_error = ""
    for _ in range(3):  # the port can be taken between _free_port() and pgbouncer's bind
        workdir = Path(tempfile.mkdtemp(prefix="pgjobs-pgbouncer-"))
        port = port if port is not None else _free_port()
        (workdir / "userlist.txt").write_text(f'"{user}" ""\n')
        (workdir / "pgbouncer.ini").write_text(_config(server_dsn, port, workdir, pool_size, settings or {}))
        run_as = _run_as(server_dsn)
        if run_as is not None:
            entry = pwd.getpwnam(run_as)
            for path in (workdir, *workdir.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        cmd = [binary, *(["-u", run_as] if run_as else []), str(workdir / "pgbouncer.ini")]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        bouncer = Bouncer(port, server_dsn, workdir, proc)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with psycopg.connect(bouncer.dsn(dbname), connect_timeout=2, prepare_threshold=None) as conn:
                    conn.execute("SELECT 1")
                return bouncer
            except psycopg.OperationalError as exc:
                last_error = str(exc)
                time.sleep(0.05)
        stderr = proc.stderr.read().decode(errors="replace") if proc.poll() is not None and proc.stderr else ""
        last_error = f"{last_error} {stderr} {bouncer.log()[-2000:]}"
        bouncer.stop()
    raise RuntimeError(f"pgbouncer did not start: {last_error}")


@contextlib.contextmanager
def pgbouncer(server_dsn: str, **kwargs: object) -> Iterator[Bouncer]:
    bouncer = start_pgbouncer(server_dsn, **kwargs)  # type: ignore[arg-type]
    try:
        yield bouncer
    finally:
        bouncer.stop()
