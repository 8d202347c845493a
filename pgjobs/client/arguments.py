"""The client's own checks of ``enqueue``'s arguments, made before anything is sent.

The server refuses the same values with PJ002 (sql/enqueue.sql); these checks exist where the value would
otherwise reach PostgreSQL as something else first: a ``priority`` beyond smallint fails the parameter's
cast (22003, not PJ002), a ``run_at`` string meets PostgreSQL's date parser (which reads ``"tomorrow"``
and ``"now"`` as times), and a payload of ``None`` would have to be guessed into ``{}``.

``run_at`` takes a :class:`~datetime.datetime` or an ISO 8601 string (``datetime.fromisoformat``: ``Z`` and
offsets allowed); anything else is refused. A payload is a JSON object (a mapping); leaving it out means
``{}``, passing ``None`` is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from pgjobs.errors import InvalidArgument

SMALLINT_MIN: Final = -32768
SMALLINT_MAX: Final = 32767


class _NoPayload:
    """The default of ``payload``: no payload given (stored as ``{}``), unlike an explicit ``None``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_PAYLOAD"


NO_PAYLOAD: Final = _NoPayload()


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 100 else f"{text[:100]}... ({len(text)} characters)"


def payload_object(payload: Any, label: str = "job") -> Mapping[str, Any]:
    """``payload`` when it is a mapping (a JSON object), ``{}`` when it was left out; else InvalidArgument."""
    if isinstance(payload, Mapping):
        return payload
    if payload is NO_PAYLOAD:
        return {}
    if payload is None:
        raise InvalidArgument(f"{label}: payload must not be None (leave it out, or pass {{}} for none)")
    raise InvalidArgument(f"{label}: payload must be a JSON object (a dict), got {_shown(payload)}")


def check_priority(priority: Any, label: str = "job") -> None:
    """A priority must be a whole number in smallint's range (None: the default)."""
    if priority is None:
        return
    if isinstance(priority, bool) or not isinstance(priority, int) or not SMALLINT_MIN <= priority <= SMALLINT_MAX:
        raise InvalidArgument(
            f"{label}: priority must be an integer between {SMALLINT_MIN} and {SMALLINT_MAX}, got {_shown(priority)}"
        )


def run_at_time(run_at: Any, label: str = "job") -> datetime | None:
    """``run_at`` as a datetime: a datetime as it is, an ISO 8601 string parsed here; else InvalidArgument."""
    if run_at is None or isinstance(run_at, datetime):
        return run_at
    if isinstance(run_at, str):
        try:
            return datetime.fromisoformat(run_at)
        except ValueError:
            pass
    raise InvalidArgument(
        f"{label}: run_at must be a datetime or an ISO 8601 string such as '2030-01-01T09:00:00+00:00',"
        f" got {_shown(run_at)}"
    )
