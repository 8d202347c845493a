"""Group weights of fair queues through the client: ``configure_group`` and ``fair_groups``
(pgjobs/client/fair.py), sync and async, and the SQLSTATE mapping of a refused weight."""

from __future__ import annotations

import asyncio
import math
from datetime import datetime

import pytest

from pgjobs import AsyncClient, Client, FairGroup, InvalidArgument


def _ring(client: Client, queue: str) -> dict[str | None, FairGroup]:
    return {g.group_key: g for g in client.fair_groups(queue)}


def test_set_list_and_reset_a_weight(dsn: str) -> None:
    with Client(dsn) as client:
        client.configure_queue("reports", fair=True)
        assert client.fair_groups("reports") == []  # never claimed as fair: no ring yet
        assert client.configure_group("reports", "tenant-1", 3) == 3.0
        assert client.configure_group("reports", "tenant-2", 0.5) == 0.5
        for group in ("tenant-1", "tenant-2", "tenant-3"):
            client.enqueue("render", {}, queue="reports", group_key=group)
        client.enqueue("render", {}, queue="reports")  # ungrouped: one more group in the ring
        [first] = client.claim("w", ["reports"], max_jobs=1)
        ring = _ring(client, "reports")
        assert {k: g.weight for k, g in ring.items()} == {"tenant-1": 3.0, "tenant-2": 0.5, "tenant-3": 1.0, None: 1.0}
        assert client.fair_groups("reports")[0].group_key == "tenant-1"  # heaviest first
        served = ring[first.group_key]
        assert isinstance(served.last_served_at, datetime) and served.served > 0
        waiting = next(g for k, g in ring.items() if k != first.group_key)
        assert waiting.last_served_at is None and waiting.served == 0  # never served: None, not -infinity

        assert client.configure_group("reports", "tenant-1") == 1.0  # the default resets it
        assert _ring(client, "reports")["tenant-1"].weight == 1.0


@pytest.mark.parametrize(
    ("bad", "shown"), [(0, "0"), (-1, "-1"), (1001, "1001"), (math.nan, "NaN"), (math.inf, "Infinity")]
)
def test_a_weight_outside_the_range_raises_invalid_argument_naming_it(dsn: str, bad: float, shown: str) -> None:
    with Client(dsn) as client:
        with pytest.raises(InvalidArgument) as info:
            client.configure_group("reports", "tenant-1", bad)
        assert info.value.sqlstate == "PJ002"
        assert str(info.value) == f"weight must be in (0, 1000], got {shown}"


def test_an_empty_group_or_queue_raises_invalid_argument(dsn: str) -> None:
    with Client(dsn) as client:
        with pytest.raises(InvalidArgument, match="group_key"):
            client.configure_group("reports", "", 2)
        with pytest.raises(InvalidArgument, match="queue"):
            client.fair_groups("")


def test_the_async_client_sets_and_lists_weights(dsn: str) -> None:
    async def scenario() -> None:
        async with AsyncClient(dsn) as client:
            await client.configure_queue("reports", fair=True)
            assert await client.configure_group("reports", "tenant-1", 4) == 4.0
            await client.enqueue("render", {}, queue="reports", group_key="tenant-1")
            await client.enqueue("render", {}, queue="reports", group_key="tenant-2")
            await client.claim("w", ["reports"], max_jobs=1)
            groups = await client.fair_groups("reports")
            assert [(g.group_key, g.weight) for g in groups] == [("tenant-1", 4.0), ("tenant-2", 1.0)]
            with pytest.raises(InvalidArgument, match="got 0"):
                await client.configure_group("reports", "tenant-1", 0)

    asyncio.run(scenario())


def test_the_sync_and_async_clients_offer_the_same_weight_calls() -> None:
    import inspect

    for name in ("configure_group", "fair_groups"):
        sync, concurrent = getattr(Client, name), getattr(AsyncClient, name)
        assert inspect.iscoroutinefunction(concurrent) and not inspect.iscoroutinefunction(sync), name
        assert inspect.signature(sync).parameters.keys() == inspect.signature(concurrent).parameters.keys(), name
