"""The one JetStream consumer of record events in a gateway process.

An ephemeral push consumer on `crm.records.>` (no acks, in-memory consumer state, idle
heartbeats) that starts after the last event stored when the gateway starts: subscribers get new
events only. The feed remembers the stream sequence of the last event it saw; when the consumer
is lost (NATS restarted, heartbeats missed) or a delivery is skipped (sequence gap), it creates a
new consumer starting right after that event, so a NATS outage delays events but loses none and
replays none. This is what nats-py's ordered consumer does, except that one restarts from the
first stored event when it is reset before its first message.

Messages are handled one at a time in arrival order; an event whose (workspace, object, action)
no local subscription asked for is skipped before it is decoded. JetStream drops a republished
event inside its duplicate window; the feed also remembers the last DEDUPE_WINDOW event ids
(`Nats-Msg-Id`, or each event's id in a batch of a bulk write), so a row the relay publishes
again later is not pushed twice either.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from opentelemetry import trace

from crmkit.messaging import (
    EVENT_BATCH_HEADER,
    RECORD_EVENTS_STREAM,
    ensure_record_stream,
    event_payloads,
)
from crmkit.telemetry import extract_context
from gateway.metrics import GatewayMetrics
from gateway.subscriptions.events import MalformedEvent, RecordChange, decode_change

log = logging.getLogger("gateway.subscriptions")
tracer = trace.get_tracer("gateway.subscriptions")

RECORD_SUBJECTS = "crm.records.>"
_STATUS = "Status"
_LAST_CONSUMER = "Nats-Last-Consumer"
_MSG_ID = "Nats-Msg-Id"
DEDUPE_WINDOW = 10_000

# Reads the record of an event the relay published without it (too large for a NATS message).
RecordLoader = Callable[[RecordChange], Awaitable[Mapping[str, Any] | None]]


class RecordEventFeed:
    def __init__(
        self,
        nats: NatsClient,
        wants: Callable[[str, str, str], bool],
        deliver: Callable[[RecordChange], int],
        metrics: GatewayMetrics,
        *,
        load_record: RecordLoader | None = None,
        heartbeat: float = 2.0,
    ) -> None:
        self._nats = nats
        self._js = nats.jetstream()
        self._wants = wants
        self._deliver = deliver
        self._metrics = metrics
        self._load_record = load_record
        self._heartbeat = heartbeat
        self._next_sequence = 0  # stream sequence of the first event not seen yet
        self._expected_delivery = 1  # consumer sequence the next message must carry
        self._generation = 0  # bumped per consumer: messages of an older one are ignored
        self._subscription: Any = None
        self._consumer = ""
        self._last_activity = time.monotonic()
        self._reset_requested = asyncio.Event()
        self._watchdog: asyncio.Task[None] | None = None
        self._healthy = False
        self._seen: OrderedDict[str, None] = OrderedDict()

    @property
    def consumer_name(self) -> str:
        return self._consumer

    async def start(self) -> None:
        await ensure_record_stream(self._js)
        info = await self._js.stream_info(RECORD_EVENTS_STREAM)
        self._next_sequence = info.state.last_seq + 1
        await self._open()
        self._watchdog = asyncio.create_task(self._watch(), name="record-event-feed")

    async def stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        await self._close()

    # -- consumer lifecycle ------------------------------------------------------------------

    async def _open(self) -> None:
        self._generation += 1
        generation = self._generation
        inbox = self._nats.new_inbox()

        async def on_message(msg: Msg) -> None:
            if generation == self._generation:
                await self._on_message(msg)

        subscription = await self._nats.subscribe(inbox, cb=on_message)
        config = ConsumerConfig(
            description="gateway: record events for GraphQL subscriptions",
            deliver_subject=inbox,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self._next_sequence,
            ack_policy=AckPolicy.NONE,
            filter_subject=RECORD_SUBJECTS,
            idle_heartbeat=self._heartbeat,
            mem_storage=True,
            num_replicas=1,
            # The server removes the consumer of a gateway that went away without stopping it.
            inactive_threshold=max(30.0, self._heartbeat * 10),
        )
        try:
            info = await self._js.add_consumer(RECORD_EVENTS_STREAM, config=config)
        except BaseException:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
            raise
        self._subscription = subscription
        self._consumer = info.name
        self._expected_delivery = 1
        self._last_activity = time.monotonic()

    async def _close(self) -> None:
        subscription, consumer = self._subscription, self._consumer
        self._subscription, self._consumer = None, ""
        self._generation += 1
        if subscription is not None:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
        if consumer and self._nats.is_connected:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self._js.delete_consumer(RECORD_EVENTS_STREAM, consumer), timeout=2
                )

    async def _watch(self) -> None:
        """Recreates the consumer when asked to (gap) or when it went silent (lost)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reset_requested.wait(), timeout=self._heartbeat)
            silent = time.monotonic() - self._last_activity > 3 * self._heartbeat
            if not (self._reset_requested.is_set() or silent or self._subscription is None):
                continue
            self._reset_requested.clear()
            await self._close()
            try:
                await self._open()
            except Exception as exc:  # NATS still away: try again on the next round
                if self._healthy:
                    log.warning("record event feed lost; retrying", extra={"error": repr(exc)})
                self._healthy = False
                continue
            self._metrics.record_feed_resets.inc()
            self._healthy = True
            log.info(
                "record event feed resumed",
                extra={"consumer": self._consumer, "start_sequence": self._next_sequence},
            )

    # -- messages ----------------------------------------------------------------------------

    async def _on_message(self, msg: Msg) -> None:
        self._last_activity = time.monotonic()
        self._healthy = True
        headers = msg.headers or {}
        if headers.get(_STATUS) is not None:
            # Idle heartbeat: it names the last consumer sequence sent, so a lost message shows.
            last = headers.get(_LAST_CONSUMER)
            if last is not None and last.isdecimal() and int(last) >= self._expected_delivery:
                self._reset_requested.set()
            return
        try:
            sequence = msg.metadata.sequence
        except Exception:
            return  # not a JetStream delivery
        if sequence.consumer != self._expected_delivery:
            self._reset_requested.set()
            return
        self._expected_delivery += 1
        self._next_sequence = sequence.stream + 1
        if await self._dispatch(msg):
            # Let subscribers drain their queues between events: a burst (a batch import) then
            # flows through instead of piling up in every queue at once.
            await asyncio.sleep(0)

    async def _dispatch(self, msg: Msg) -> bool:
        """Hands the event (each event of a batch) to the local subscriptions that want it;
        whether any may have."""
        parts = msg.subject.split(".")
        if len(parts) != 5 or not self._wants(parts[2], parts[3], parts[4]):
            return False
        headers = msg.headers or {}
        if EVENT_BATCH_HEADER not in headers:
            if self._repeated(headers.get(_MSG_ID)):
                return False
            return await self._dispatch_event(msg, msg.data, seen=True)
        try:
            payloads = event_payloads(msg.data, headers)
        except ValueError as exc:
            log.warning("unreadable event batch skipped", extra={"error": str(exc)})
            return False
        dispatched = False
        for payload in payloads:
            if await self._dispatch_event(msg, payload, seen=False):
                dispatched = True
                await asyncio.sleep(0)  # subscribers drain between a batch's events too
        return dispatched

    async def _dispatch_event(self, msg: Msg, payload: bytes, *, seen: bool) -> bool:
        """Hands one event to the subscriptions; `seen` when its id was already checked
        against the recent ones (a lone event's `Nats-Msg-Id`)."""
        try:
            change = decode_change(payload, msg.headers)
        except MalformedEvent as exc:
            log.warning("malformed record event skipped", extra={"error": str(exc)})
            return False
        if not seen and self._repeated(change.id):
            return False
        if change.record_omitted:
            # Rare (records near 1 MB): read inline, so this record's events stay in order.
            record = await self._load_record(change) if self._load_record else None
            if record is None:
                log.warning("record of an event could not be read", extra={"event": change.id})
                return False
            change = dataclasses.replace(change, record=record, record_omitted=False)
        with tracer.start_as_current_span(
            "record event fan-out",
            context=extract_context(change.trace_context),
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "nats",
                "messaging.destination.name": msg.subject,
                "messaging.message.id": change.id,
            },
        ) as span:
            span.set_attribute("crm.subscribers", self._deliver(change))
        return True

    def _repeated(self, event_id: str | None) -> bool:
        """Whether this event id was dispatched recently (and remembers it)."""
        if not event_id:
            return False
        if event_id in self._seen:
            return True
        self._seen[event_id] = None
        if len(self._seen) > DEDUPE_WINDOW:
            self._seen.popitem(last=False)
        return False
