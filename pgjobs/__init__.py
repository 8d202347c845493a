"""pgjobs: durable background jobs that live inside PostgreSQL."""

from pgjobs.client import AsyncClient, Client
from pgjobs.client.explain import Explanation, Reason
from pgjobs.client.graph import Dep, JobRef, after_batch, on_complete, on_failure, on_success
from pgjobs.client.recurring import PeriodicSpec
from pgjobs.client.stream import StatusEvent
from pgjobs.errors import (
    GraphError,
    InvalidArgument,
    InvalidState,
    JobNotFound,
    NeedsPrimary,
    PgJobsError,
    QueueFull,
    SchemaMissing,
)
from pgjobs.records import (
    BatchState,
    BatchStatus,
    ClaimedJob,
    Enqueued,
    EnqueuedSpec,
    FairGroup,
    Job,
    JobState,
    JobStatus,
    Materialized,
    QueueSettings,
    QueueStat,
    RateLimit,
    Schedule,
    UnhandledKind,
    WorkerInfo,
)
from pgjobs.runtime.app import App, CancelFlag, JobCancelled, JobContext, JobHandler, Retry, Snooze, SyncJobContext
from pgjobs.runtime.durable import Parked, WaitResult
from pgjobs.runtime.worker import Worker

__all__ = [
    "AsyncClient",
    "ClaimedJob",
    "Client",
    "Enqueued",
    "EnqueuedSpec",
    "FairGroup",
    "GraphError",
    "InvalidArgument",
    "InvalidState",
    "Job",
    "JobNotFound",
    "JobState",
    "JobStatus",
    "Materialized",
    "NeedsPrimary",
    "PeriodicSpec",
    "PgJobsError",
    "QueueFull",
    "QueueSettings",
    "QueueStat",
    "RateLimit",
    "Schedule",
    "SchemaMissing",
    "UnhandledKind",
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
__all__ += ["Parked", "WaitResult"]
__version__ = "0.1.0"
__all__ += ["Explanation", "Reason"]
