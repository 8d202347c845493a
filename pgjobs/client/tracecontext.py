"""The enqueuer's side of tracing (extra ``pgjobs-queue[otel]``): W3C trace context into the job's ``meta``.

When a span is active at enqueue, ``enqueue`` / ``enqueue_many`` run inside a PRODUCER span ``create
{queue}`` (OpenTelemetry messaging conventions: ``messaging.system = "pgjobs"``, ``messaging.operation.type
= "create"``, ``messaging.destination.name``, ``messaging.message.id`` once the id is known) and store that
span's context in each job's ``meta`` as ``traceparent`` (and ``tracestate`` when there is one). Keys the
caller put in ``meta`` win. The worker's span for each attempt links to it (``pgjobs/runtime/tracing.py``).

Without opentelemetry installed nothing is imported and :func:`active` is one ``is None`` test; with it but no
span active, one ``get_current_span()`` lookup.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

SYSTEM = "pgjobs"
TRACE_KEYS = ("traceparent", "tracestate")

_trace: Any = None
_propagator: Any = None
if importlib.util.find_spec("opentelemetry") is not None:  # pragma: no branch - the dev extra has it
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _propagator = TraceContextTextMapPropagator()


def available() -> bool:
    """Whether opentelemetry-api is installed."""
    return _trace is not None


def active() -> bool:
    """Whether an enqueue now should be traced: opentelemetry is installed and a recording span is current."""
    if _trace is None:
        return False
    return bool(_trace.get_current_span().get_span_context().is_valid)


def with_trace(meta: Mapping[str, Any] | None, trace: Mapping[str, str] | None) -> dict[str, Any]:
    """``meta`` with the trace context added (the caller's own keys win)."""
    if not trace:
        return dict(meta) if meta else {}
    return {**trace, **meta} if meta else dict(trace)


def _attributes(queue: str | None, count: int) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "create",
        "messaging.operation.name": "enqueue" if count == 1 else "enqueue_many",
    }
    if queue is not None:
        attrs["messaging.destination.name"] = queue
    if count != 1:
        attrs["messaging.batch.message_count"] = count
    return attrs


@contextlib.contextmanager
def create_span(queue: str | None, count: int = 1) -> Iterator[tuple[Any, dict[str, str]]]:
    """A PRODUCER span around an enqueue; yields ``(span, carrier)``, the carrier holding its W3C context."""
    tracer = _trace.get_tracer("pgjobs")
    name = f"create {queue}" if queue is not None else "create"
    with tracer.start_as_current_span(
        name, kind=_trace.SpanKind.PRODUCER, attributes=_attributes(queue, count)
    ) as span:
        carrier: dict[str, str] = {}
        _propagator.inject(carrier)
        yield span, {k: v for k, v in carrier.items() if k in TRACE_KEYS}


def _set_ids(span: Any, ids: list[int]) -> None:
    if len(ids) == 1:
        span.set_attribute("messaging.message.id", str(ids[0]))


def traced(
    run: Callable[[Mapping[str, str]], T], queue: str | None, ids: Callable[[T], list[int]], count: int = 1
) -> T:
    """``run(carrier)`` inside a create span; ``ids(result)`` names the jobs it made."""
    with create_span(queue, count) as (span, carrier):
        result = run(carrier)
        _set_ids(span, ids(result))
        return result


async def traced_async(
    run: Callable[[Mapping[str, str]], Awaitable[T]], queue: str | None, ids: Callable[[T], list[int]], count: int = 1
) -> T:
    with create_span(queue, count) as (span, carrier):
        result = await run(carrier)
        _set_ids(span, ids(result))
        return result


def extract_link(meta: Mapping[str, Any]) -> Any:
    """The span context stored in a job's ``meta`` (None when there is none or it does not parse)."""
    if _trace is None or "traceparent" not in meta:
        return None
    carrier = {k: str(meta[k]) for k in TRACE_KEYS if k in meta}
    ctx = _propagator.extract(carrier)
    span_context = _trace.get_current_span(ctx).get_span_context()
    return span_context if span_context.is_valid else None
