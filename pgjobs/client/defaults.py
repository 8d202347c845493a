"""Per-kind enqueue defaults: ``pgjobs.Client(dsn, app=app)`` enqueues a declared kind with its handler's
``queue``, ``priority``, ``max_attempts`` and ``rate_key`` unless the call says otherwise (a declared
``rate_key`` may be a function of the payload).

The client layer does not import the runtime: ``app`` is anything with ``enqueue_defaults(kind) -> mapping``
(:class:`pgjobs.App` is one). A kind the app does not declare gets the SQL defaults (``default``, 0, 20).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

# the enqueue arguments a declaration may default; the others (unique_key, run_at ...) are per job
DEFAULTABLE = ("queue", "priority", "max_attempts")
SQL_DEFAULTS: dict[str, Any] = {"queue": "default", "priority": 0, "max_attempts": 20}


@runtime_checkable
class EnqueueDefaults(Protocol):
    """What ``Client(app=...)`` needs of an app: the declared enqueue options of ``kind`` ({} if none)."""

    def enqueue_defaults(self, kind: str) -> Mapping[str, Any]: ...


def resolve(defaults: EnqueueDefaults | None, kind: str, explicit: Mapping[str, Any]) -> dict[str, Any]:
    """``queue``/``priority``/``max_attempts`` for one enqueue: the explicit value when not None, else the
    declared one, else the SQL default."""
    declared = defaults.enqueue_defaults(kind) if defaults is not None else {}
    out: dict[str, Any] = {}
    for key in DEFAULTABLE:
        value = explicit.get(key)
        if value is None:
            value = declared.get(key)
        out[key] = SQL_DEFAULTS[key] if value is None else value
    return out


def fill_spec(defaults: EnqueueDefaults | None, spec: Mapping[str, Any]) -> dict[str, Any]:
    """An ``enqueue_many`` spec with the declared options of its kind added where the spec has none (a spec
    that sets a key, even to the SQL default, keeps it)."""
    out = dict(spec)
    kind = out.get("kind")
    if defaults is None or not isinstance(kind, str):
        return out
    declared = defaults.enqueue_defaults(kind)
    for key, value in declared.items():
        if key in DEFAULTABLE and out.get(key) is None and value is not None:
            out[key] = value
    if out.get("rate_key") is None and declared.get("rate_key") is not None:
        rate_key = rate_key_of(declared["rate_key"], out.get("payload", {}))
        if rate_key is not None:
            out["rate_key"] = rate_key
    return out


RateKey = str | Callable[[Any], "str | None"] | None


def rate_key_of(declared: RateKey, payload: Any) -> str | None:
    """A declared ``rate_key`` for one job: the string, or what the function gives for the job's payload."""
    if callable(declared):
        key = declared(payload)
        if key is not None and not isinstance(key, str):
            raise TypeError(f"a rate_key function must return a str or None, got {key!r}")
        return key
    return declared


def resolve_rate_key(defaults: EnqueueDefaults | None, kind: str, payload: Any, explicit: str | None) -> str | None:
    """``rate_key`` for one enqueue: the explicit one when not None, else the kind's declared one (a function
    of the payload, or a string), else None (no limit)."""
    if explicit is not None or defaults is None:
        return explicit
    return rate_key_of(defaults.enqueue_defaults(kind).get("rate_key"), payload)
