"""Durable execution in a handler: ``ctx.step``, ``ctx.sleep`` / ``ctx.sleep_until`` and ``ctx.wait_for``.

Every attempt runs the handler from its start. A step already recorded by an earlier attempt returns its
recorded result without running again; a sleep or wait already resolved returns at once. A sleep or wait that
has to last gives the job back (its slot, its lease and its attempt: ``sleep_until`` / ``await_signal`` in
sql/durable.sql) and raises :class:`Parked`, which ends the attempt; the job is claimed again when its time
comes or a signal wakes it, and replays to where it stopped.

Sleeps and waits without an explicit ``name`` are named by their order in the handler (``sleep#1``,
``wait#1``, ...), so a handler must reach them in the same order on every attempt (steps are named by the
caller). This module builds the calls; the context classes (:mod:`pgjobs.runtime.context`) run them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pgjobs.client.durable import WaitOutcome


class Parked(BaseException):
    """Raised by ``ctx.sleep``/``ctx.wait_for`` when the job was given back until later (``outcome`` 'parked'),
    ended cancelled because its cancellation was requested ('cancelled'), or is no longer this attempt's
    ('lost'). The worker ends the attempt there and reports nothing more. A BaseException, so that a
    handler's ``except Exception`` does not swallow it: let it through."""

    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome


@dataclass(frozen=True, slots=True)
class WaitResult:
    """What ``ctx.wait_for`` returns: the signal's ``payload``, or ``timed_out`` (payload None) when the
    timeout came first."""

    key: str
    payload: Any
    timed_out: bool


class DurableState:
    """One attempt's bookkeeping: the recorded steps (read once, on the first ``step``), the step names used
    so far, and the counters that name unnamed sleeps and waits."""

    __slots__ = ("sleeps", "steps", "used", "waits")

    def __init__(self) -> None:
        self.steps: dict[str, Any] | None = None
        self.used: set[str] = set()
        self.sleeps = 0
        self.waits = 0

    def use(self, job_id: int, name: str) -> None:
        """A step name may appear once per job."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a step name must be a non-empty string, got {name!r}")
        if name in self.used:
            raise ValueError(f"step {name!r} of job {job_id} is used twice: a step's name must be unique in its job")
        self.used.add(name)

    def sleep_name(self, name: str | None) -> str:
        self.sleeps += 1
        return name if name is not None else f"sleep#{self.sleeps}"

    def wait_name(self, name: str | None) -> str:
        self.waits += 1
        return name if name is not None else f"wait#{self.waits}"


def as_json(name: str, value: Any) -> Any:
    """The step's result as a later attempt will read it (a JSON round trip), or TypeError naming the step."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the result of step {name!r} is not JSON-serializable: {exc}") from exc


def recorded(ok: bool) -> None:
    """After ``record_step``: False means the token no longer holds the job (the attempt is over)."""
    if not ok:
        raise Parked("lost")


def slept(out: WaitOutcome) -> None:
    if out.parked:
        raise Parked(out.outcome)


def waited(key: str, out: WaitOutcome) -> WaitResult:
    if out.parked:
        raise Parked(out.outcome)
    return WaitResult(key, out.payload if out.outcome == "signal" else None, out.outcome == "timeout")
