"""Why a job is not running: ``explain(id)`` (sql/explain.sql) as a typed record with a human sentence."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pgjobs.client._call import AsyncConn, AsyncRunner, Call, SyncConn, SyncRunner, scalar


class Reason(enum.StrEnum):
    RUNNING = "running"
    TERMINAL = "terminal"
    WAITING_DEPENDENCIES = "waiting_dependencies"
    SCHEDULED = "scheduled"
    PAUSED = "paused"
    QUEUE_CAP = "queue_cap"
    GROUP_CAP = "group_cap"
    RATE_LIMITED = "rate_limited"
    NO_WORKER = "no_worker"
    BEHIND_OTHERS = "behind_others"
    CLAIMABLE = "claimable"


@dataclass(frozen=True, slots=True)
class Explanation:
    """What ``explain`` found: the ``reason``, its ``details`` (the JSON object's other keys, times as
    ISO 8601 strings), and the other gates that would hold the job back too (``also``)."""

    job_id: int
    reason: Reason
    details: dict[str, Any] = field(default_factory=dict)
    also: tuple[Reason, ...] = ()

    @classmethod
    def from_json(cls, job_id: int, value: dict[str, Any]) -> Explanation:
        details = {k: v for k, v in value.items() if k not in ("reason", "also")}
        return cls(job_id, Reason(value["reason"]), details, tuple(Reason(r) for r in value.get("also") or ()))

    def to_json(self) -> dict[str, Any]:
        """The object ``explain`` returned."""
        out: dict[str, Any] = {"reason": self.reason.value, **self.details}
        if self.also:
            out["also"] = [r.value for r in self.also]
        return out

    @property
    def blocked(self) -> bool:
        """True when something holds a live job back (not running, not terminal, not claimable)."""
        return self.reason not in (Reason.RUNNING, Reason.TERMINAL, Reason.CLAIMABLE)

    def describe(self) -> str:
        """One line for people, e.g. ``queue 'mail' is at its cap: 5 of 5 active``."""
        text = _SENTENCES[self.reason](self.details)
        if self.also:
            text += f" (also: {', '.join(r.value for r in self.also)})"
        if self.details.get("lease_lapsed_at"):
            text += f"; the lease of {self.details.get('last_worker')} lapsed at {_at(self.details['lease_lapsed_at'])}"
            if self.details.get("settles_as"):
                text += f": the next claim ends it as {self.details['settles_as']}"
        return text


def _at(value: Any) -> str:
    """An ISO time from the JSON as ``YYYY-MM-DD HH:MM:SS+0000``."""
    try:
        return f"{datetime.fromisoformat(str(value)):%Y-%m-%d %H:%M:%S%z}"
    except ValueError:
        return str(value)


def _plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {words or word + 's'}"


def _running(d: dict[str, Any]) -> str:
    text = f"running on worker {d.get('worker')}, lease until {_at(d.get('lease_expires_at'))}"
    text += f" (attempt {d.get('attempt')} of {d.get('max_attempts')})"
    if d.get("worker_live") is False:
        text += "; that worker no longer heartbeats: the job is taken over when its lease lapses"
    return text + ("; cancellation requested" if d.get("cancel_requested") else "")


def _terminal(d: dict[str, Any]) -> str:
    text = f"{d.get('state')} at {_at(d.get('completed_at'))} (attempt {d.get('attempt')} of {d.get('max_attempts')})"
    return text + (f": {d['last_error']}" if d.get("last_error") else "")


def _parent(p: dict[str, Any]) -> str:
    if "batch" in p:
        counts = f"{p.get('pending')} of {p.get('total')} pending"
        return f"batch {p['batch']} ({p.get('state')}, {counts}, on {p.get('on')})"
    return f"job {p.get('job')} ({p.get('state')}, on {p.get('on')})"


def _parked(d: dict[str, Any]) -> str | None:
    """A durable sleep or signal wait (docs/durable-execution.md), or None."""
    p = d.get("parked")
    if not p:
        return None
    if p.get("kind") == "sleep":
        return f"sleeping ({p.get('name')!r}) until {_at(p.get('until'))}"
    text = f"waiting for signal {p.get('key')!r} since {_at(p.get('since'))}"
    return text + (f", timeout at {_at(p['until'])}" if p.get("until") else "")


def _waiting(d: dict[str, Any]) -> str:
    if (parked := _parked(d)) and not d.get("waiting_on"):
        return parked
    parents = d.get("waiting_on") or []
    text = f"waiting on {_plural(int(d.get('remaining') or len(parents)), 'dependency', 'dependencies')}"
    if parents:
        text += ": " + ", ".join(_parent(p) for p in parents[:5])
        more = len(parents) - 5 + int(d.get("more") or 0)
        text += f" and {more} more" if more > 0 else ""
    return text


def _scheduled(d: dict[str, Any]) -> str:
    if parked := _parked(d):
        return parked
    if d.get("retry"):
        text = f"retry scheduled for {_at(d.get('run_at'))} after attempt {d.get('attempt')} of {d.get('max_attempts')}"
        return text + (f": {d['last_error']}" if d.get("last_error") else "")
    return f"scheduled for {_at(d.get('run_at'))}"


def _no_worker(d: dict[str, Any]) -> str:
    if d.get("queue_workers"):
        text = f"no live worker handles kind {d.get('kind')!r} on queue {d.get('queue')!r}"
        n = int(d["queue_workers"])
        text += f" ({_plural(n, 'live worker')} {'serves' if n == 1 else 'serve'} the queue)"
    else:
        text = f"no live worker serves queue {d.get('queue')!r}"
    return text + (f"; the last one was seen at {_at(d['last_seen'])}" if d.get("last_seen") else "")


def _behind(d: dict[str, Any]) -> str:
    n = ("at least " if d.get("at_least") else "") + _plural(int(d.get("ahead") or 0), "job")
    if d.get("fair"):
        group = f"group {d['group_key']!r}" if d.get("group_key") is not None else "the ungrouped jobs"
        return f"behind {n} of {group} in fair queue {d.get('queue')!r} (groups take turns)"
    return f"behind {n} ahead of it in claim order (priority, run_at, id) in queue {d.get('queue')!r}"


def _rate(d: dict[str, Any]) -> str:
    """The limit (a key's or the queue's), its next token, and the time a claim held the job back to."""
    if d.get("scope") == "queue":
        text = f"queue {d.get('queue')!r} is at its rate limit"
    elif d.get("rate_key") is not None:
        text = f"rate key {d.get('rate_key')!r} is at its rate limit"
    else:
        text = "rate limited"
    if d.get("next_token_at"):
        text += f"; the next start token is due at {_at(d['next_token_at'])}"
    if d.get("held_until"):
        text += f"; held back until {_at(d['held_until'])}"
    return text


_SENTENCES: dict[Reason, Callable[[dict[str, Any]], str]] = {
    Reason.RUNNING: _running,
    Reason.TERMINAL: _terminal,
    Reason.WAITING_DEPENDENCIES: _waiting,
    Reason.SCHEDULED: _scheduled,
    Reason.PAUSED: lambda d: f"queue {d.get('queue')!r} is paused",
    Reason.QUEUE_CAP: lambda d: (
        f"queue {d.get('queue')!r} is at its cap: {d.get('active')} of {d.get('max_active')} active"
    ),
    Reason.GROUP_CAP: lambda d: (
        f"group {d.get('group_key')!r} of queue {d.get('queue')!r} is at its cap:"
        f" {d.get('active')} of {d.get('max_active_per_group')} active"
    ),
    Reason.RATE_LIMITED: _rate,
    Reason.NO_WORKER: _no_worker,
    Reason.BEHIND_OTHERS: _behind,
    Reason.CLAIMABLE: lambda d: "claimable: nothing holds it back; a worker with a free slot takes it next",
}


def explain_call(id: int) -> Call[Explanation | None]:
    return Call(
        "SELECT pgjobs.explain(id => %(id)s)",
        {"id": id},
        lambda rows: None if (value := scalar(rows)) is None else Explanation.from_json(id, value),
        read=True,
    )


class ExplainOps(SyncRunner):
    def explain(self, id: int, *, conn: SyncConn | None = None) -> Explanation | None:
        """Why the job is not running (or that it is, or has ended); None when there is no such job."""
        return self._run(explain_call(id), conn)


class AsyncExplainOps(AsyncRunner):
    async def explain(self, id: int, *, conn: AsyncConn | None = None) -> Explanation | None:
        return await self._run(explain_call(id), conn)
