"""pgjobs: durable background jobs that live inside PostgreSQL."""

from .app import App, CancelFlag, JobCancelled, JobContext, JobHandler, Retry, Snooze, SyncJobContext
from .client import AsyncClient, Client
from .errors import (
    GraphError,
    InvalidArgument,
    InvalidState,
    JobNotFound,
    PgJobsError,
    QueueFull,
    SchemaMissing,
)
from .graph import Dep, JobRef, after_batch, on_complete, on_failure, on_success
from .records import (
    BatchState,
    BatchStatus,
    ClaimedJob,
    Enqueued,
    EnqueuedSpec,
    Job,
    JobState,
    JobStatus,
    Materialized,
    QueueSettings,
    QueueStat,
    Schedule,
    WorkerInfo,
)
from .recurring import PeriodicSpec
from .stream import StatusEvent
from .worker import Worker

__all__ = [
    "AsyncClient",
    "ClaimedJob",
    "Client",
    "Enqueued",
    "EnqueuedSpec",
    "GraphError",
    "InvalidArgument",
    "InvalidState",
    "Job",
    "JobNotFound",
    "JobState",
    "JobStatus",
    "Materialized",
    "PeriodicSpec",
    "PgJobsError",
    "QueueFull",
    "QueueSettings",
    "QueueStat",
    "Schedule",
    "SchemaMissing",
    "WorkerInfo",
]
__all__ += ["BatchState", "BatchStatus", "Dep", "JobRef", "after_batch", "on_complete", "on_failure", "on_success"]
__all__ += [
    "App",
    "CancelFlag",
    "JobCancelled",
    "JobContext",
    "JobHandler",
    "Retry",
    "Snooze",
    "StatusEvent",
    "SyncJobContext",
    "Worker",
]
__version__ = "0.1.0"
