"""The enqueuer's side of tracing (extra ``pgjobs-queue[otel]``): W3C trace context into the job's ``meta``.

When a span is active at enqueue, ``enqueue`` / ``enqueue_many`` (decorated with :func:`traced_one` /
:func:`traced_many`) run inside a PRODUCER span ``create
{queue}`` (OpenTelemetry messaging conventions: ``messaging.system = "pgjobs"``, ``messaging.operation.type
= "create"``, ``messaging.destination.name``, ``messaging.message.id`` once the id is known) and store that
span's context in each job's ``meta`` as ``traceparent`` (and ``tracestate`` when there is one). Keys the
caller put in ``meta`` win. The worker's span for each attempt links to it (``pgjobs/runtime/tracing.py``).

Without opentelemetry installed nothing is imported and :func:`active` is one ``is None`` test; with it but no
span active, one ``get_current_span()`` lookup.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from pgjobs.client.arguments import NO_PAYLOAD
from pgjobs.client.defaults import fill_spec, resolve

F = TypeVar("F", bound=Callable[..., Any])

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


# True inside our own create span: a traced method that calls another one (enqueue_many(method="copy") ->
# enqueue_copy) makes one create span, not two.
_creating: contextvars.ContextVar[bool] = contextvars.ContextVar("pgjobs_creating", default=False)


def active() -> bool:
    """Whether an enqueue now should be traced: opentelemetry is installed and a recording span is current."""
    if _trace is None or _creating.get():
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
        token = _creating.set(True)
        try:
            yield span, {k: v for k, v in carrier.items() if k in TRACE_KEYS}
        finally:
            _creating.reset(token)


def _set_ids(span: Any, ids: list[int]) -> None:
    if len(ids) == 1:
        span.set_attribute("messaging.message.id", str(ids[0]))


def _queue_of(client: Any, kind: str, queue: str | None) -> str:
    """The queue an enqueue goes to: the one given, else the kind's declared one (``Client(app=...)``)."""
    return str(resolve(getattr(client, "_enqueue_defaults", None), kind, {"queue": queue})["queue"])


def _specs_of(client: Any, jobs: Iterable[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], str | None]:
    """The specs as a list, and the queue they all go to (the span's destination; None when they differ)."""
    specs = list(jobs)
    defaults = getattr(client, "_enqueue_defaults", None)
    queues = {fill_spec(defaults, j).get("queue") or "default" for j in specs}
    return specs, queues.pop() if len(queues) == 1 else None


def _with_trace_all(specs: list[Mapping[str, Any]], trace: Mapping[str, str]) -> list[dict[str, Any]]:
    return [{**j, "meta": with_trace(j.get("meta"), trace)} for j in specs]


# Decorators of the client's enqueue methods: the method's body stays what it is; with a span active the call
# runs inside a create span and gets the trace context in ``meta`` (each spec's, for the many-job forms).


def traced_one(method: F) -> F:
    @functools.wraps(method)
    def wrapper(self: Any, kind: str, payload: Any = NO_PAYLOAD, **kw: Any) -> Any:
        if not active():
            return method(self, kind, payload, **kw)
        with create_span(_queue_of(self, kind, kw.get("queue"))) as (span, carrier):
            result = method(self, kind, payload, **{**kw, "meta": with_trace(kw.get("meta"), carrier)})
            _set_ids(span, [result.id])
            return result

    return wrapper  # type: ignore[return-value]


def traced_one_async(method: F) -> F:
    @functools.wraps(method)
    async def wrapper(self: Any, kind: str, payload: Any = NO_PAYLOAD, **kw: Any) -> Any:
        if not active():
            return await method(self, kind, payload, **kw)
        with create_span(_queue_of(self, kind, kw.get("queue"))) as (span, carrier):
            result = await method(self, kind, payload, **{**kw, "meta": with_trace(kw.get("meta"), carrier)})
            _set_ids(span, [result.id])
            return result

    return wrapper  # type: ignore[return-value]


def traced_many(method: F) -> F:
    @functools.wraps(method)
    def wrapper(self: Any, jobs: Iterable[Mapping[str, Any]], **kw: Any) -> Any:
        if not active():
            return method(self, jobs, **kw)
        specs, queue = _specs_of(self, jobs)
        with create_span(queue, len(specs)) as (span, carrier):
            result = method(self, _with_trace_all(specs, carrier), **kw)
            _set_ids(span, [r.id for r in result])
            return result

    return wrapper  # type: ignore[return-value]


def traced_many_async(method: F) -> F:
    @functools.wraps(method)
    async def wrapper(self: Any, jobs: Iterable[Mapping[str, Any]], **kw: Any) -> Any:
        if not active():
            return await method(self, jobs, **kw)
        specs, queue = _specs_of(self, jobs)
        with create_span(queue, len(specs)) as (span, carrier):
            result = await method(self, _with_trace_all(specs, carrier), **kw)
            _set_ids(span, [r.id for r in result])
            return result

    return wrapper  # type: ignore[return-value]


def extract_link(meta: Mapping[str, Any]) -> Any:
    """The span context stored in a job's ``meta`` (None when there is none or it does not parse)."""
    if _trace is None or "traceparent" not in meta:
        return None
    carrier = {k: str(meta[k]) for k in TRACE_KEYS if k in meta}
    ctx = _propagator.extract(carrier)
    span_context = _trace.get_current_span(ctx).get_span_context()
    return span_context if span_context.is_valid else None
