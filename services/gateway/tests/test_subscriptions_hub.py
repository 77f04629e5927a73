"""The fan-out hub: routing by (workspace, object, action), ownership, filters, bounded queues."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from typing import Any

import pytest

from gateway.metrics import GatewayMetrics
from gateway.subscriptions.events import RecordChange
from gateway.subscriptions.hub import EventSubscription, SubscriptionHub

WS, OTHER_WS = str(uuid.uuid4()), str(uuid.uuid4())
ALICE = str(uuid.uuid4())


def change(
    record: Mapping[str, Any],
    *,
    workspace: str = WS,
    obj: str = "person",
    action: str = "created",
) -> RecordChange:
    return RecordChange(str(uuid.uuid4()), workspace, obj, action, record, occurred_at=0.0)


def hub(queue_size: int = 8) -> tuple[SubscriptionHub, GatewayMetrics]:
    metrics = GatewayMetrics.create()
    return SubscriptionHub(metrics, queue_size), metrics


def counter(metrics: GatewayMetrics, outcome: str) -> float:
    value = metrics.registry.get_sample_value(
        "gateway_subscription_events_total", {"outcome": outcome}
    )
    return value or 0.0


def no_overflow(subscription: EventSubscription) -> None:
    raise AssertionError("unexpected overflow")


async def drain(subscription: EventSubscription, count: int) -> list[Mapping[str, Any]]:
    return [await asyncio.wait_for(anext(subscription), 5) for _ in range(count)]


async def test_events_reach_only_their_workspace_object_and_action() -> None:
    events, _ = hub()
    wanted = events.subscribe(
        WS, "person", "created", predicate=None, owner_id=None, on_overflow=no_overflow
    )
    others = [
        events.subscribe(
            OTHER_WS, "person", "created", predicate=None, owner_id=None, on_overflow=no_overflow
        ),
        events.subscribe(
            WS, "company", "created", predicate=None, owner_id=None, on_overflow=no_overflow
        ),
        events.subscribe(
            WS, "person", "updated", predicate=None, owner_id=None, on_overflow=no_overflow
        ),
    ]
    assert events.publish(change({"id": "1"})) == 1
    assert await drain(wanted, 1) == [{"id": "1"}]
    for other in others:
        other.close()
        with pytest.raises(StopAsyncIteration):
            await anext(other)  # closed with nothing queued: nothing was offered to it
    assert not events.wants(OTHER_WS, "person", "created")


async def test_own_records_only_and_filters_skip_what_they_exclude() -> None:
    events, metrics = hub()
    mine = events.subscribe(
        WS, "person", "created", predicate=None, owner_id=ALICE, on_overflow=no_overflow
    )
    acme = events.subscribe(
        WS,
        "person",
        "created",
        predicate=lambda record: record.get("city") == "Paris",
        owner_id=None,
        on_overflow=no_overflow,
    )
    events.publish(change({"id": "1", "ownerId": ALICE, "city": "Rome"}))
    events.publish(change({"id": "2", "ownerId": str(uuid.uuid4()), "city": "Paris"}))
    events.publish(change({"id": "3", "ownerId": None, "city": "Oslo"}))
    assert [r["id"] for r in await drain(mine, 1)] == ["1"]
    assert [r["id"] for r in await drain(acme, 1)] == ["2"]
    assert counter(metrics, "queued") == 2
    assert counter(metrics, "skipped") == 4


async def test_a_failing_filter_skips_the_event_for_that_subscriber_only() -> None:
    events, _ = hub()

    def broken(record: Mapping[str, Any]) -> bool:
        raise ValueError("boom")

    bad = events.subscribe(
        WS, "person", "created", predicate=broken, owner_id=None, on_overflow=no_overflow
    )
    good = events.subscribe(
        WS, "person", "created", predicate=None, owner_id=None, on_overflow=no_overflow
    )
    assert events.publish(change({"id": "1"})) == 1
    assert await drain(good, 1) == [{"id": "1"}]
    bad.close()


async def test_a_full_queue_drops_only_that_subscriber_and_tells_it() -> None:
    events, metrics = hub(queue_size=3)
    overflowed: list[EventSubscription] = []
    slow = events.subscribe(
        WS, "person", "created", predicate=None, owner_id=None, on_overflow=overflowed.append
    )
    fast = events.subscribe(
        WS, "person", "created", predicate=None, owner_id=None, on_overflow=no_overflow
    )
    received: list[Mapping[str, Any]] = []
    for number in range(10):
        events.publish(change({"id": str(number)}))
        received.extend(await drain(fast, 1))
    assert [r["id"] for r in received] == [str(n) for n in range(10)]
    assert overflowed == [slow]
    assert slow.closed
    assert events.open_subscriptions == 1
    assert counter(metrics, "dropped") == 1
    assert metrics.registry.get_sample_value("gateway_subscription_overflows_total") == 1
    # What it had queued before the overflow is still readable, then the stream ends.
    assert [r["id"] for r in await drain(slow, 3)] == ["0", "1", "2"]
    with pytest.raises(StopAsyncIteration):
        await anext(slow)


async def test_closing_ends_a_waiting_reader_and_unregisters() -> None:
    events, metrics = hub()
    subscription = events.subscribe(
        WS, "person", "deleted", predicate=None, owner_id=None, on_overflow=no_overflow
    )
    assert metrics.registry.get_sample_value("gateway_subscriptions_open") == 1
    reader = asyncio.create_task(anext(subscription))
    await asyncio.sleep(0)
    await subscription.aclose()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(reader, 5)
    assert events.publish(change({"id": "1"}, action="deleted")) == 0
    assert metrics.registry.get_sample_value("gateway_subscriptions_open") == 0
