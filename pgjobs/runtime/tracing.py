"""The worker's side of tracing (extra ``pgjobs-queue[otel]``): one span per attempt, linked to the enqueuer's.

Each attempt runs in a CONSUMER span ``process {queue}`` whose link points at the W3C trace context the
enqueuer stored in the job's ``meta`` (``pgjobs/client/tracecontext.py``): a job may run hours after and many
times over, so its attempts start traces of their own rather than grow the producer's. Its outcome report is a
CLIENT span ``settle {queue}``, a child of the attempt's span (``complete_many`` settles many jobs in one
call: that span is the batch's and links every attempt it settles). Attributes follow the OpenTelemetry
messaging conventions: ``messaging.system = "pgjobs"``, ``messaging.destination.name`` (queue),
``messaging.operation.type`` (``process`` / ``settle``), ``messaging.message.id`` (job id),
``messaging.client.id`` (worker), plus ``messaging.pgjobs.attempt``, ``messaging.pgjobs.kind`` and
``messaging.pgjobs.outcome``; a failed attempt gets status ERROR, ``error.type`` and the exception event.

Hot path: :func:`enabled` is decided once per ``Worker.run`` (opentelemetry installed and a tracer provider
set, or ``Worker(tracing=True)``); a worker without tracing never calls into this module.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from typing import Any

from pgjobs.client.tracecontext import SYSTEM, extract_link

_trace: Any = None
_Context: Any = None
if importlib.util.find_spec("opentelemetry") is not None:  # pragma: no branch - the dev extra has it
    from opentelemetry import trace as _trace
    from opentelemetry.context import Context as _Context


def enabled(requested: bool | None) -> bool:
    """``requested`` None: on when opentelemetry is installed and a tracer provider was set (the API's default
    proxy provider records nothing, so spans would cost time for nothing)."""
    if _trace is None:
        if requested:
            raise RuntimeError("tracing needs opentelemetry: pip install 'pgjobs-queue[otel]'")
        return False
    if requested is not None:
        return requested
    return not isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider)


class Tracer:
    """Starts the worker's spans (only built when tracing is enabled)."""

    def __init__(self, worker_name: str) -> None:
        self._tracer = _trace.get_tracer("pgjobs")
        self.worker_name = worker_name

    def _base(self, queue: str, operation: str) -> dict[str, Any]:
        return {
            "messaging.system": SYSTEM,
            "messaging.destination.name": queue,
            "messaging.operation.type": operation,
            "messaging.operation.name": operation,
            "messaging.client.id": self.worker_name,
        }

    def process(self, job_id: int, kind: str, queue: str, attempt: int, meta: str | dict[str, Any] | None) -> Any:
        """Starts (not as current: handlers run in other tasks and threads) the attempt's span."""
        links = []
        parsed = meta
        if isinstance(meta, str):
            parsed = json.loads(meta) if "traceparent" in meta else None
        if isinstance(parsed, dict):
            ctx = extract_link(parsed)
            if ctx is not None:
                links.append(_trace.Link(ctx))
        attrs = self._base(queue, "process")
        attrs["messaging.message.id"] = str(job_id)
        attrs["messaging.pgjobs.attempt"] = attempt
        attrs["messaging.pgjobs.kind"] = kind
        return self._tracer.start_span(
            f"process {queue}", context=_root(), kind=_trace.SpanKind.CONSUMER, attributes=attrs, links=links
        )

    def current(self, span: Any) -> Any:
        """Makes ``span`` the current one while the handler runs (its own spans become children; a sync
        handler's thread gets a copy of the context). The outcome is recorded by :meth:`end_process`."""
        return _trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False)

    def end_process(self, span: Any, outcome: str, error: BaseException | None = None) -> None:
        span.set_attribute("messaging.pgjobs.outcome", outcome)
        if error is not None:
            span.record_exception(error)
            span.set_attribute("error.type", type(error).__qualname__)
            span.set_status(_trace.Status(_trace.StatusCode.ERROR, str(error)[:200]))
        span.end()

    def settle(self, span: Any, queue: str, job_id: int, operation: str) -> Any:
        """A settle span (child of the attempt's span) around one outcome call (fail, release, ack_cancel)."""
        attrs = self._base(queue, "settle")
        attrs["messaging.operation.name"] = operation
        attrs["messaging.message.id"] = str(job_id)
        return self._tracer.start_as_current_span(
            f"settle {queue}", context=_trace.set_span_in_context(span), kind=_trace.SpanKind.CLIENT, attributes=attrs
        )

    def settle_batch(self, queue: str | None, spans: Sequence[Any]) -> Any:
        """The span of one ``complete_many`` call, linked to the attempt span of every job it completes."""
        attrs = self._base(queue or "", "settle")
        attrs["messaging.operation.name"] = "complete_many"
        attrs["messaging.batch.message_count"] = len(spans)
        if queue is None:
            del attrs["messaging.destination.name"]
        links = [_trace.Link(s.get_span_context()) for s in spans if s is not None]
        return self._tracer.start_as_current_span(
            f"settle {queue}" if queue else "settle", context=_root(), kind=_trace.SpanKind.CLIENT,
            attributes=attrs, links=links,
        )  # fmt: skip


def _root() -> Any:
    """An empty context: the worker's spans start traces of their own whatever task they are started from."""
    return _Context()
