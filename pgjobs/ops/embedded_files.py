"""Where the embedded PostgreSQL's files live: the data directory, and, as root, a copy of the binaries.

Split from :mod:`pgjobs.ops.embedded` (which starts and stops the server); see its docstring for the traps of
the package that these functions work around (root, widened parent directories, binaries below /root).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import stat
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

_WORLD_RX = stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH


class EmbeddedUnavailable(RuntimeError):
    """The embedded PostgreSQL server cannot be used here: package missing or unsupported, unsafe, failing."""


# ---------------------------------------------------------------------------------------------------------
# where things live


def _resolve(data_dir: Path | str | None) -> Path:
    return Path(data_dir if data_dir is not None else default_data_dir()).expanduser().resolve()


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _root_base() -> Path:
    """A per-euid directory outside any home directory, for use when running as root."""
    tmp = Path("/var/tmp")
    parent = tmp if tmp.is_dir() else Path(tempfile.gettempdir())
    return parent / f"pgjobs-{os.geteuid()}"


def default_data_dir() -> Path:
    """The data directory used when none is given; nothing is created.

    Running as root it is ``/var/tmp/pgjobs-0/pgdata`` (never under ``/root``: the server runs as another
    user, and the package would open every parent directory to it). Otherwise it is
    ``$XDG_DATA_HOME/pgjobs/pgdata``, by default ``~/.local/share/pgjobs/pgdata``.
    """
    if _is_root():
        return _root_base() / "pgdata"
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return base / "pgjobs" / "pgdata"


def _ensure_private_base(path: Path) -> None:
    """Create ``path`` (a dir of ours directly below a world-writable one) or check that it is ours."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o755)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise EmbeddedUnavailable(
            f"{path} exists but is not a directory owned by uid {os.geteuid()}; remove it or pass another data dir"
        )
    path.chmod(0o755)  # the server's user must traverse it; nothing in it is secret


def _mkdirs(path: Path, mode: int) -> None:
    """``mkdir -p`` that gives the directories it creates ``mode`` whatever the umask."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir()
            d.chmod(mode)


def _widened_by_package(path: Path) -> list[Path]:
    """Parents of ``path`` that the package's ``chmod g+rx,o+rx`` on every parent would change."""
    return [p for p in path.parents if p.exists() and (p.stat().st_mode & _WORLD_RX) != _WORLD_RX]


def _bin_path_modules(pkg: Any) -> list[Any]:
    prefix = pkg.__name__ + "."
    return [
        m
        for name, m in list(sys.modules.items())
        if (name == pkg.__name__ or name.startswith(prefix)) and hasattr(m, "POSTGRES_BIN_PATH")
    ]


def _relocate_binaries(pkg: Any) -> None:
    """As root, run the binaries from a copy outside any private directory.

    The package chmods ``g+rx,o+rx`` every parent of its ``pginstall/bin`` so that its unprivileged server
    user can reach the binaries. Installed in a virtualenv under ``/root`` that would open ``/root``. We copy
    ``pginstall`` (and the vendored ``*.libs`` that ``initdb`` finds through ``$ORIGIN/../../../``) once to
    ``/var/tmp/pgjobs-0/pginstall-<version>-<id>/<package>/`` and point the package at the copy.
    """
    modules = _bin_path_modules(pkg)
    if not modules:
        return
    bin_path = Path(modules[0].POSTGRES_BIN_PATH)
    if not _widened_by_package(bin_path):
        return
    install = bin_path.parent  # .../site-packages/<package>/pginstall
    site = install.parent.parent
    try:
        version = importlib.metadata.version(pkg.__name__.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    st = install.stat()
    base = _root_base()
    _mkdirs(base.parent, 0o755)
    _ensure_private_base(base)
    target = base / f"pginstall-{version}-{st.st_dev:x}-{st.st_ino:x}"
    new_bin = target / install.parent.name / install.name / bin_path.name
    if not new_bin.is_dir():
        staging = base / f".staging-{uuid.uuid4().hex}"
        try:
            staging.mkdir(mode=0o755)
            shutil.copytree(
                install,
                staging / install.parent.name / install.name,
                symlinks=True,
                ignore=lambda d, names: ["include"] if Path(d) == install else [],  # headers: not needed
            )
            for libs in site.glob("*.libs"):
                if libs.is_dir() and any(libs.glob("libpq*")):
                    shutil.copytree(libs, staging / libs.name, symlinks=True)
            for d in [staging, *(p for p in staging.rglob("*") if p.is_dir())]:
                d.chmod(0o755)
            try:
                staging.rename(target)
            except OSError:
                if not new_bin.is_dir():  # not a concurrent winner: a real failure
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    for m in modules:
        m.POSTGRES_BIN_PATH = new_bin
