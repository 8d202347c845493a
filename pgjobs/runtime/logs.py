"""The worker's logs: setup (``pgjobs worker --log-level --log-format``) and the outage tracker.

Lines, all under the ``pgjobs`` loggers:

* one per attempt at its end, INFO: ``job 12 (send_email) attempt 1 succeeded in 0.013 s`` with
  ``job_id, kind, queue, attempt, outcome, duration_s`` as fields (JSON keys). The start is DEBUG: the end
  line carries the start (its time minus the duration), and a start line at INFO would double the volume of
  a busy worker's logs for what only a hang investigation needs;
* one per change of the database connection's state (``database unreachable ...`` WARNING, ``database
  reachable again after 12.3 s ...`` INFO), however many calls fail and retry in between (those retries
  are DEBUG, and so is a blip shorter than a second: a connection that died while idle and reconnects at once);
* the stop sequence (INFO): stop requested, N job(s) finishing, N released, deregistered, stopped.

``configure_logging`` is for programs (the CLI); a library user's own logging setup is left alone.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import UTC, datetime
from typing import IO, Any

# The structured fields a pgjobs log record may carry (``extra=``); the JSON format emits them as keys.
FIELDS = ("event", "worker", "job_id", "kind", "queue", "attempt", "outcome", "duration_s", "jobs", "source", "error")
FORMATS = ("text", "json")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _timestamp(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TextFormatter(logging.Formatter):
    """``2026-12-01T14:05:00.123Z INFO  pgjobs.worker: message`` (UTC), tracebacks on the lines after."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts, level, logger, message``, the record's pgjobs fields, ``exc``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in FIELDS:
            value = record.__dict__.get(key)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str = "INFO", fmt: str = "text", stream: IO[str] | None = None) -> logging.Handler:
    """Sends every log record at ``level`` or above (the root logger, so handlers' own logs too) to ``stream``
    (stderr) as ``fmt`` lines. Replaces a handler installed by an earlier call; returns the handler."""
    name = level.upper()
    if name not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.set_name("pgjobs")
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == "pgjobs":
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(name)
    # psycopg_pool logs every failed reconnect of every pooled connection (a line per second or so through an
    # outage); the worker's own one-line-per-change says the same. Shown again at DEBUG.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR if name != "DEBUG" else logging.NOTSET)
    return handler


def _oneline(exc: BaseException | str) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class Outage:
    """The worker's view of its database connection, logged once per change of state.

    Every part of the worker that fails to reach the database calls :meth:`lost`; any part that gets through
    again calls :meth:`restored` (hot paths test :attr:`down` first: one attribute read). The WARNING comes
    from the first failure that finds the database unreachable for ``blip`` seconds or more (a connection that
    died while idle fails once and reconnects at once: a DEBUG line, not an outage), the retries meanwhile
    are DEBUG, and the INFO line when it is back says how long it lasted and how many calls failed.
    """

    __slots__ = ("_failures", "_since", "_warned", "blip", "down", "log")

    def __init__(self, log: logging.Logger, blip: float = 1.0) -> None:
        self.log = log
        self.blip = blip
        self.down = False
        self._warned = False
        self._since = 0.0
        self._failures = 0

    def lost(self, source: str, exc: BaseException | str, retry_in: float | None = None) -> None:
        self._failures += 1
        detail = _oneline(exc)
        now = time.monotonic()
        if not self.down:
            self.down = True
            self._since = now
        if not self._warned and now - self._since >= self.blip:
            self._warned = True
            self.log.warning(
                "database unreachable for %.1f s (%s: %s); retrying until it is back, one line when it is",
                now - self._since, source, detail, extra={"event": "db.lost", "source": source, "error": detail},
            )  # fmt: skip
        elif self.log.isEnabledFor(logging.DEBUG):
            after = "" if retry_in is None else f"; retrying in {retry_in:.2f} s"
            self.log.debug("%s failed (%s)%s", source, detail, after, extra={"source": source})

    def restored(self, source: str) -> None:
        if not self.down:
            return
        self.down = False
        took = time.monotonic() - self._since
        failures, self._failures = self._failures, 0
        warned, self._warned = self._warned, False
        level = logging.INFO if warned else logging.DEBUG
        self.log.log(
            level, "database reachable again after %.1f s (%d failed call(s) meanwhile; back first: %s)",
            took, failures, source, extra={"event": "db.restored", "source": source, "duration_s": round(took, 3)},
        )  # fmt: skip
