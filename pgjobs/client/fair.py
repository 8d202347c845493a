"""Group weights of fair queues: ``pgjobs.configure_group`` (sql/admin.sql) and ``pgjobs.fair_ring_groups``
(sql/fair.sql).

While several groups of a fair queue have work, each is served in proportion to its weight (1 by default); a
group with none gives its share to the others, and one that comes back neither starves nor makes up for lost
turns.
"""

from __future__ import annotations

from pgjobs.client._call import AsyncConn, AsyncRunner, Call, SyncConn, SyncRunner, scalar
from pgjobs.records import FairGroup


def configure_group_call(queue: str, group_key: str, weight: float = 1.0) -> Call[float]:
    return Call(
        "SELECT pgjobs.configure_group(queue => %(queue)s, group_key => %(group_key)s, weight => %(weight)s::real)",
        {"queue": queue, "group_key": group_key, "weight": weight},
        lambda rows: float(scalar(rows)),
    )


def fair_groups_call(queue: str) -> Call[list[FairGroup]]:
    return Call(
        "SELECT group_key, last_served_at, served, weight"
        " FROM pgjobs.fair_ring_groups(queue => %(queue)s)"
        " ORDER BY weight DESC, served, group_key NULLS LAST",
        {"queue": queue},
        lambda rows: [FairGroup.from_row(r) for r in rows],
        read=True,
    )


class FairOps(SyncRunner):
    def configure_group(
        self, queue: str, group_key: str, weight: float = 1.0, *, conn: SyncConn | None = None
    ) -> float:
        """Sets the weight of ``group_key`` in the fair queue ``queue``, in (0, 1000], and returns it: while
        several groups have work, each gets claims in proportion to its weight. ``weight=1`` (the default)
        resets it. A weight outside (0, 1000] raises :class:`~pgjobs.InvalidArgument`."""
        return self._run(configure_group_call(queue, group_key, weight), conn)

    def fair_groups(self, queue: str, *, conn: SyncConn | None = None) -> list[FairGroup]:
        """The groups of the fair queue ``queue`` that had pending work at its last claim (``group_key`` None:
        the ungrouped jobs), heaviest first, then the least recently served; empty for a queue never claimed as fair."""
        return self._run(fair_groups_call(queue), conn)


class AsyncFairOps(AsyncRunner):
    async def configure_group(
        self, queue: str, group_key: str, weight: float = 1.0, *, conn: AsyncConn | None = None
    ) -> float:
        return await self._run(configure_group_call(queue, group_key, weight), conn)

    async def fair_groups(self, queue: str, *, conn: AsyncConn | None = None) -> list[FairGroup]:
        return await self._run(fair_groups_call(queue), conn)
