"""Per-kind enqueue defaults: ``pgjobs.Client(dsn, app=app)`` enqueues a declared kind with its handler's
``queue``, ``priority`` and ``max_attempts`` unless the call says otherwise.

The client layer does not import the runtime: ``app`` is anything with ``enqueue_defaults(kind) -> mapping``
(:class:`pgjobs.App` is one). A kind the app does not declare gets the SQL defaults (``default``, 0, 20).
"""

from __future__ import annotations

from collections.abc import Mapping
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
    for key, value in defaults.enqueue_defaults(kind).items():
        if key in DEFAULTABLE and out.get(key) is None and value is not None:
            out[key] = value
    return out
