"""pgjobs: durable background jobs that live inside PostgreSQL."""

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
from .records import (
    ClaimedJob,
    Enqueued,
    EnqueuedSpec,
    Job,
    JobState,
    JobStatus,
    QueueSettings,
    QueueStat,
    WorkerInfo,
)

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
    "PgJobsError",
    "QueueFull",
    "QueueSettings",
    "QueueStat",
    "SchemaMissing",
    "WorkerInfo",
]
__version__ = "0.1.0"
