"""What ``pgjobs status`` shows of a job's durable execution (``durable_status``): the steps it recorded with
their results' size, and what it is parked on now (sleeping until, waiting for a signal since)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pgjobs.cli.common import ago


def size(n: int) -> str:
    """A result's size: bytes, kB or MB (1,000-based, as a person reads it)."""
    if n < 1000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1000:.1f} kB"
    return f"{n / 1_000_000:.1f} MB"


def _when(text: str, now: datetime) -> str:
    t = datetime.fromisoformat(text)
    return f"{t:%Y-%m-%d %H:%M:%S%z} ({ago(t, now)})"


def durable_rows(status: dict[str, Any] | None, now: datetime) -> list[tuple[str, str]]:
    """(label, text) rows for the job table; none for a job that recorded no step, sleep or wait."""
    if not status:
        return []
    rows: list[tuple[str, str]] = []
    steps = status.get("steps") or []
    if steps:
        rows.append(("steps done", ", ".join(f"{s['name']} ({size(int(s['bytes']))})" for s in steps)))
    if status.get("sleeping_until"):
        rows.append(("sleeping until", _when(status["sleeping_until"], now)))
    waiting = status.get("waiting_for")
    if waiting:
        text = f"signal {waiting['key']!r} since {_when(waiting['since'], now)}"
        if waiting.get("timeout_at"):
            text += f", times out {_when(waiting['timeout_at'], now)}"
        rows.append(("waiting for", text))
    return rows
