"""Fan-out of record events to the subscriptions open on this gateway process.

Subscriptions are indexed by (workspace, object, action), so an event costs only the
subscriptions that asked for exactly that: other workspaces, objects and actions are never
looked at. Each subscription owns a bounded queue; `publish` never awaits, it only offers the
record to each queue. A subscriber that does not keep up (its queue is full) is dropped from the
hub and told through its `on_overflow` callback (the session then closes the socket, see
docs/subscriptions.md); the others are not delayed by it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from crmkit.metrics import Children
from gateway.metrics import GatewayMetrics
from gateway.subscriptions.events import RecordChange

log = logging.getLogger("gateway.subscriptions")

Record = Mapping[str, Any]
Predicate = Callable[[Record], bool]
Key = tuple[str, str, str]  # workspace id, singular object name, action
# Put on the queue of a closed subscription to wake its reader.
_END = RecordChange("", "", "", "", {}, 0.0)


class EventSubscription:
    """One subscription's stream of events: `next_change()`, or as an async iterator of
    records (what a GraphQL subscription resolver returns), over its bounded queue."""

    def __init__(
        self,
        hub: SubscriptionHub,
        key: Key,
        *,
        predicate: Predicate | None,
        owner_id: str | None,
        capacity: int,
        on_overflow: Callable[[EventSubscription], None],
    ) -> None:
        self._hub = hub
        self.key = key
        self.predicate = predicate
        self.owner_id = owner_id
        self.on_overflow = on_overflow
        self._queue: asyncio.Queue[RecordChange] = asyncio.Queue(capacity)
        self.closed = False

    @property
    def object(self) -> str:
        return self.key[1]

    def accepts(self, record: Record) -> bool:
        if self.owner_id is not None and record.get("ownerId") != self.owner_id:
            return False
        if self.predicate is None:
            return True
        try:
            return self.predicate(record)
        except Exception:  # one odd record must not stop the fan-out to everyone else
            log.exception("subscription filter failed; event skipped for this subscriber")
            return False

    def offer(self, change: RecordChange) -> bool:
        """Queue `change`; False when the queue is full."""
        try:
            self._queue.put_nowait(change)
        except asyncio.QueueFull:
            return False
        return True

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._hub.remove(self)
        if not self._queue.full():
            self._queue.put_nowait(_END)

    def __aiter__(self) -> EventSubscription:
        return self

    async def next_change(self) -> RecordChange:
        """The next event; StopAsyncIteration once the subscription is closed and drained."""
        if self.closed and self._queue.empty():
            raise StopAsyncIteration
        change = await self._queue.get()
        if change is _END:
            raise StopAsyncIteration
        return change

    async def __anext__(self) -> Record:
        return (await self.next_change()).record

    async def aclose(self) -> None:
        """Called by GraphQL execution when the subscription ends."""
        self.close()


class SubscriptionHub:
    def __init__(self, metrics: GatewayMetrics, queue_size: int) -> None:
        self._metrics = metrics
        self._events = Children(metrics.subscription_events)
        self._queue_size = queue_size
        self._index: dict[Key, set[EventSubscription]] = {}
        self._count = 0

    @property
    def open_subscriptions(self) -> int:
        return self._count

    def workspaces(self) -> set[str]:
        """The workspaces with at least one open subscription here."""
        return {key[0] for key in self._index}

    def wants(self, workspace_id: str, object_name: str, action: str) -> bool:
        """Whether any subscription here asked for this (workspace, object, action)."""
        return (workspace_id, object_name, action) in self._index

    def subscribe(
        self,
        workspace_id: str,
        object_name: str,
        action: str,
        *,
        predicate: Predicate | None,
        owner_id: str | None,
        on_overflow: Callable[[EventSubscription], None],
    ) -> EventSubscription:
        key = (workspace_id, object_name, action)
        subscription = EventSubscription(
            self,
            key,
            predicate=predicate,
            owner_id=owner_id,
            capacity=self._queue_size,
            on_overflow=on_overflow,
        )
        self._index.setdefault(key, set()).add(subscription)
        self._count += 1
        self._metrics.subscriptions_open.set(self._count)
        return subscription

    def remove(self, subscription: EventSubscription) -> None:
        subscribers = self._index.get(subscription.key)
        if subscribers is None or subscription not in subscribers:
            return
        subscribers.discard(subscription)
        if not subscribers:
            del self._index[subscription.key]
        self._count -= 1
        self._metrics.subscriptions_open.set(self._count)

    def publish(self, change: RecordChange) -> int:
        """Offer `change` to every matching subscription; returns how many queued it."""
        if change.occurred_at > 0:
            self._metrics.subscription_event_lag.observe(max(time.time() - change.occurred_at, 0))
        subscribers = self._index.get((change.workspace_id, change.object, change.action))
        if not subscribers:
            return 0
        queued = skipped = 0
        overflowed: list[EventSubscription] = []
        for subscription in subscribers:
            if not subscription.accepts(change.record):
                skipped += 1
            elif subscription.offer(change):
                queued += 1
            else:
                overflowed.append(subscription)
        for subscription in overflowed:
            subscription.close()
            self._metrics.subscription_overflows.inc()
            subscription.on_overflow(subscription)
        if queued:
            self._events("queued").inc(queued)
        if skipped:
            self._events("skipped").inc(skipped)
        if overflowed:
            self._events("dropped").inc(len(overflowed))
        return queued
