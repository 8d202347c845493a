"""Prometheus metrics of one worker process (``Worker(metrics_port=...)``, ``pgjobs worker --metrics-port``).

Each worker gets its own :class:`~prometheus_client.CollectorRegistry` (several workers in one process, as in
the tests, would otherwise collide on the default registry), served by prometheus-client's HTTP server on a
daemon thread. What the database knows (jobs per queue and state, oldest pending age, workers) is the
dashboard's ``/metrics``, read from SQL at scrape time; this endpoint says what only the worker knows:

* ``pgjobs_jobs_processed_total{queue,kind,outcome}``: attempts this worker ended, by outcome (``succeeded``,
  ``retried``, ``failed``, ``cancelled``, ``snoozed``, ``released``, ``parked``, ``lost``);
* ``pgjobs_job_duration_seconds{queue,kind}``: histogram of the handler's run time per attempt;
* ``pgjobs_worker_active_jobs{queue}`` / ``pgjobs_worker_capacity{queue}``: jobs held now / at most;
* ``pgjobs_worker_claims_total{queue}``, ``pgjobs_worker_claimed_jobs_total{queue}``,
  ``pgjobs_worker_claim_duration_seconds{queue}``: claim calls, jobs they returned, round-trip time;
* ``pgjobs_worker_completion_batches_total``: ``complete_many`` calls (jobs per call = succeeded / batches);
* ``pgjobs_worker_listen_connected``: 1 while the LISTEN connection is up, else 0;
* ``pgjobs_worker_database_up``: 0 while the worker is retrying through a connection outage, else 1;
* ``pgjobs_worker_info{worker,version}``: always 1; the worker's name.

Hot-path cost: the gauges are callbacks read at scrape time (nothing per job); a finished attempt costs one
counter increment and one histogram observation on cached label children; a worker without ``metrics_port``
has no :class:`WorkerMetrics` and pays one ``is None`` test per job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import start_http_server

OUTCOMES = ("succeeded", "retried", "failed", "cancelled", "snoozed", "released", "parked", "lost")

# Job run times span 1 ms no-ops to hour-long exports: a wide log-ish ladder (prometheus-client's default
# stops at 10 s).
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
# A claim is one round trip: 0.25 ms on an idle local server, tens of ms under contention.
CLAIM_BUCKETS = (0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class WorkerMetrics:
    """The worker's instruments, in a registry of their own; :meth:`serve` exposes them over HTTP."""

    def __init__(self, worker_name: str, version: str = "") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.processed = Counter(
            "pgjobs_jobs_processed", "Job attempts this worker ended, by outcome.", ["queue", "kind", "outcome"],
            registry=r,
        )  # fmt: skip
        self.duration = Histogram(
            "pgjobs_job_duration_seconds", "Run time of a job attempt's handler.", ["queue", "kind"],
            buckets=DURATION_BUCKETS, registry=r,
        )  # fmt: skip
        self.claims = Counter("pgjobs_worker_claims", "claim() calls this worker made.", ["queue"], registry=r)
        self.claimed = Counter("pgjobs_worker_claimed_jobs", "Jobs its claims returned.", ["queue"], registry=r)
        self.claim_duration = Histogram(
            "pgjobs_worker_claim_duration_seconds", "Round-trip time of one claim() call.", ["queue"],
            buckets=CLAIM_BUCKETS, registry=r,
        )  # fmt: skip
        self.completion_batches = Counter(
            "pgjobs_worker_completion_batches", "complete_many() calls (one per batch of completions).", registry=r
        )
        self._active = Gauge("pgjobs_worker_active_jobs", "Jobs this worker holds now.", ["queue"], registry=r)
        self._capacity = Gauge("pgjobs_worker_capacity", "Jobs it runs at once at most.", ["queue"], registry=r)
        self._listen = Gauge("pgjobs_worker_listen_connected", "1 while the LISTEN connection is up.", registry=r)
        self._db_up = Gauge("pgjobs_worker_database_up", "0 while retrying through a connection outage.", registry=r)
        Info("pgjobs_worker", "This worker.", registry=r).info({"worker": worker_name, "version": version})
        # label children cached: .labels() hashes and locks on every call
        self._ends: dict[tuple[str, str, str], Any] = {}
        self._durations: dict[tuple[str, str], Any] = {}
        self._claim_children: dict[str, tuple[Any, Any, Any]] = {}
        self._server: Any = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------------------------ wiring

    def watch_queue(self, queue: str, capacity: int, running: Callable[[], float]) -> None:
        """The per-queue gauges, read at scrape time from the worker's own counters."""
        self._active.labels(queue).set_function(running)
        self._capacity.labels(queue).set(capacity)

    def watch_connection(self, listen_connected: Callable[[], float], database_up: Callable[[], float]) -> None:
        self._listen.set_function(listen_connected)
        self._db_up.set_function(database_up)

    # ------------------------------------------------------------------------------------------ hot path

    def ended(self, queue: str, kind: str, outcome: str, duration: float | None) -> None:
        """One attempt ended (``duration``: its handler's run time, None when the handler never ran)."""
        key = (queue, kind, outcome)
        child = self._ends.get(key)
        if child is None:
            child = self._ends[key] = self.processed.labels(queue, kind, outcome)
        child.inc()
        if duration is not None:
            dkey = (queue, kind)
            hist = self._durations.get(dkey)
            if hist is None:
                hist = self._durations[dkey] = self.duration.labels(queue, kind)
            hist.observe(duration)

    def claim(self, queue: str, jobs: int, seconds: float) -> None:
        children = self._claim_children.get(queue)
        if children is None:
            children = self._claim_children[queue] = (
                self.claims.labels(queue), self.claimed.labels(queue), self.claim_duration.labels(queue),
            )  # fmt: skip
        calls, claimed, latency = children
        calls.inc()
        if jobs:
            claimed.inc(jobs)
        latency.observe(seconds)

    # ------------------------------------------------------------------------------------------ HTTP

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Starts the HTTP endpoint (``/metrics``, any path in fact) on a daemon thread; returns the bound
        port (``port=0``: one the OS picked)."""
        if self._server is not None:
            return int(self._server.server_address[1])
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        return int(self._server.server_address[1])

    @property
    def port(self) -> int | None:
        return None if self._server is None else int(self._server.server_address[1])

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
