"""Which database the CLI talks to.

The first that is set wins: ``--dsn``, then ``PGJOBS_DSN``, then ``DATABASE_URL``. With none of them,
the embedded PostgreSQL server (:mod:`pgjobs.ops.embedded`) is started on a per-user data directory
(``--data-dir``, else ``PGJOBS_DATA_DIR``, else :func:`pgjobs.ops.embedded.default_data_dir`, which is
never below ``/root``) and stopped again when the command ends, unless another process still uses it.

    with resolve(cli_dsn=args.dsn, data_dir=args.data_dir) as target:
        run(target.dsn)
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ENV_DSN = "PGJOBS_DSN"
ENV_DATABASE_URL = "DATABASE_URL"
ENV_DATA_DIR = "PGJOBS_DATA_DIR"

# SQLAlchemy-style URLs ("postgresql+psycopg://...", "postgres+asyncpg://...") are common in DATABASE_URL;
# libpq knows only "postgresql://" and "postgres://".
_DRIVER_SUFFIX = re.compile(r"^(postgres(?:ql)?)\+[A-Za-z0-9_]+://")


@dataclass(frozen=True)
class Target:
    """A resolved database: its DSN, where the DSN came from, and the embedded data dir if it is ours."""

    dsn: str
    source: str  # "--dsn" | "PGJOBS_DSN" | "DATABASE_URL" | "embedded"
    data_dir: Path | None = None

    @property
    def uses_embedded(self) -> bool:
        return self.source == "embedded"

    def describe(self) -> str:
        if self.data_dir is not None:
            return f"the embedded PostgreSQL server in {self.data_dir}"
        return f"{redact(self.dsn)} (from {self.source})"


class DsnError(Exception):
    """The DSN cannot be used: malformed, or the embedded server cannot start."""


def normalize(dsn: str, source: str = "--dsn") -> str:
    """``dsn`` with a SQLAlchemy driver suffix removed; validated by libpq's parser."""
    dsn = _DRIVER_SUFFIX.sub(r"\1://", dsn.strip())
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:  # the DSN itself is not echoed: it may hold a password
        raise DsnError(f"invalid DSN in {source}: {first_line(str(exc))}") from None
    return dsn


def configured(cli_dsn: str | None = None, environ: dict[str, str] | None = None) -> tuple[str, str] | None:
    """``(dsn, source)`` from ``--dsn`` or the environment, or None when the embedded server is wanted."""
    env = os.environ if environ is None else environ
    for source, value in (
        ("--dsn", cli_dsn),
        (ENV_DSN, env.get(ENV_DSN)),
        (ENV_DATABASE_URL, env.get(ENV_DATABASE_URL)),
    ):
        if value and value.strip():
            return normalize(value, source), source
    return None


def data_dir(cli_data_dir: str | Path | None = None) -> Path:
    """The embedded server's data directory: ``--data-dir``, ``PGJOBS_DATA_DIR`` or the per-user default."""
    from pgjobs.ops import embedded

    value = cli_data_dir or os.environ.get(ENV_DATA_DIR)
    return Path(value).expanduser().resolve() if value else embedded.default_data_dir()


@contextmanager
def resolve(cli_dsn: str | None = None, cli_data_dir: str | Path | None = None) -> Iterator[Target]:
    """The target database; the embedded server runs for the duration of the block when it is the one."""
    found = configured(cli_dsn)
    if found is not None:
        yield Target(found[0], found[1])
        return
    from pgjobs.ops import embedded

    pgdata = data_dir(cli_data_dir)
    try:
        dsn = embedded.start(pgdata)
    except embedded.EmbeddedUnavailable as exc:
        raise DsnError(
            f"no database configured (--dsn, {ENV_DSN} or {ENV_DATABASE_URL}) and the embedded server is "
            f"unavailable: {first_line(str(exc))}"
        ) from None
    try:
        yield Target(dsn, "embedded", pgdata)
    finally:
        embedded.stop(pgdata)


def with_database(dsn: str, dbname: str) -> str:
    """``dsn`` pointed at another database on the same server (URIs, key=value and sockets alike)."""
    return make_conninfo(dsn, dbname=dbname)


def redact(dsn: str) -> str:
    """``dsn`` without its password, for messages."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable DSN>"
    if params.get("password"):
        params["password"] = "***"
    return make_conninfo("", **{k: v for k, v in params.items() if v not in (None, "")})


def first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else text.strip()
