"""Event intake: record events from JetStream become delivery rows for the matching webhooks.

Every deliverer replica pulls from one durable consumer (`webhooks-deliverer`, explicit ack), so
each event goes to one replica at a time. Events no active webhook wants (`webhooks.routes`, the
cached routes, checked against the committed routing version in the same round trip) are
acknowledged without being written, or decoded: the routes are matched on the subject. The others
are turned into rows with one statement: the events that match an active webhook of their workspace
(exact operation, `<object>.*`, `*.<action>` or `*.*`) are stored once, with one delivery per
matching webhook, leased to this process and handed to the dispatcher as far as it has room (the
rest are queued due, for its claims). Both inserts are idempotent on ids (an event delivered twice
by JetStream adds nothing), and the messages are acknowledged only after the rows commit, so a
crash before that makes JetStream send them again; a leased delivery whose process died is due
again when its lease ends.

Each event is a consumer span continuing the trace carried in its NATS headers; the span's context
is stored with the event, so the delivery attempts continue the same trace.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from opentelemetry import trace

from crm.events.v1 import events_pb2
from crmkit.db import retry_while_unavailable
from crmkit.messaging import (
    RECORD_ACTION_NAMES,
    RECORD_EVENTS_STREAM,
    durable_record_consumer,
    event_count,
    event_payloads,
    fetch_batches,
    previous_record_json,
    subject_address,
)
from crmkit.telemetry import TRACE_HEADERS, extract_context, span_recordable, trace_context_headers
from webhooks.dispatcher import Claimed, Dispatcher, Room
from webhooks.metrics import WebhooksMetrics
from webhooks.routes import LOAD, VERSION, Routes
from webhooks.settings import WebhooksSettings

log = logging.getLogger("webhooks.intake")
_tracer = trace.get_tracer("webhooks.intake")

DURABLE = "webhooks-deliverer"
BATCH = 256

# $1..$12: the batch as parallel arrays; $13..$18 the dispatcher's room (`Room`). Returns the
# routing version this statement saw, and one row per delivery queued: leased to this process
# (with what the attempt needs) or left due for a later claim.
_INTAKE = """
WITH incoming AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::uuid[],
                         $6::text[], $7::text[], $8::timestamptz[], $9::bigint[], $10::text[],
                         $11::bool[], $12::bool[])
        WITH ORDINALITY
        AS i(id, workspace_id, object, action, record_id, record, previous_record, occurred_at,
             sequence, trace_context, record_omitted, previous_record_omitted, position)
), matched AS (
    SELECT i.id AS event_id, i.position, i.object || '.' || i.action AS operation,
           w.id AS webhook_id, w.workspace_id, w.target_origin
    FROM incoming i
    JOIN webhooks.webhooks w ON w.workspace_id = i.workspace_id AND w.is_active
     AND w.operations && ARRAY[i.object || '.' || i.action, i.object || '.*',
                               '*.' || i.action, '*.*']
), room AS (
    SELECT * FROM unnest($13::text[], $14::int[]) AS r(origin, claimed)
), ranked AS (
    SELECT m.*, coalesce(r.claimed, 0) + row_number() OVER (
               PARTITION BY m.target_origin ORDER BY m.position, m.webhook_id) AS slot
    FROM matched m LEFT JOIN room r ON r.origin = m.target_origin
), placed AS (
    SELECT ranked.*, slot <= 2 * $16::int AND sum((slot <= 2 * $16::int)::int) OVER (
               ORDER BY position, webhook_id ROWS UNBOUNDED PRECEDING) <= $15::int AS leased
    FROM ranked
), stored AS (
    INSERT INTO webhooks.events (id, workspace_id, object, action, record_id, record,
                                 previous_record, occurred_at, sequence, trace_context,
                                 record_omitted, previous_record_omitted)
    SELECT i.id, i.workspace_id, i.object, i.action, i.record_id, i.record::json,
           i.previous_record::json, i.occurred_at, i.sequence, i.trace_context::jsonb,
           i.record_omitted, i.previous_record_omitted
    FROM incoming i WHERE i.id IN (SELECT event_id FROM matched)
    ON CONFLICT (id) DO NOTHING
), queued AS (
    INSERT INTO webhooks.deliveries (id, workspace_id, webhook_id, event_id, operation,
                                     next_attempt_at, lease, attempts, claimed_at)
    SELECT gen_random_uuid(), p.workspace_id, p.webhook_id, p.event_id, p.operation,
           CASE WHEN p.leased THEN now() + make_interval(secs => $17::float8) ELSE now() END,
           CASE WHEN p.leased THEN $18::uuid END,
           -- a leased row's first attempt is counted now, as a claim counts it
           CASE WHEN p.leased THEN 1 ELSE 0 END,
           CASE WHEN p.leased THEN now() END
    FROM placed p
    ON CONFLICT (webhook_id, event_id) WHERE redelivery_of IS NULL DO NOTHING
    RETURNING id, workspace_id, webhook_id, event_id, operation, lease
)
SELECT v.version, q.id::text, q.workspace_id::text, q.webhook_id::text, q.event_id::text,
       q.operation, q.lease IS NOT NULL AS leased, w.target_url, w.target_origin,
       w.secret_sealed, w.author_user_id::text, w.author_api_key_id::text
FROM webhooks.routing_version v
LEFT JOIN (queued q JOIN webhooks.webhooks w ON w.id = q.webhook_id) ON true
"""


@dataclass(frozen=True)
class DecodedEvent:
    id: str
    workspace_id: str
    object: str
    action: str
    record_id: str
    record: str | None
    previous_record: str | None
    occurred_at: Any
    sequence: int
    trace_context: str = "{}"  # JSON object of W3C trace headers
    record_omitted: bool = False  # left out by the relay for size (docs/events.md)
    previous_record_omitted: bool = False


def decode(data: bytes) -> DecodedEvent | None:
    """The event in a message, or None when it is not a usable record event."""
    event = events_pb2.RecordEvent()
    try:
        event.ParseFromString(data)
    except Exception:  # protobuf raises DecodeError (a bare Exception subclass)
        return None
    action = RECORD_ACTION_NAMES.get(event.action)
    if action is None or not event.id or not event.workspace_id or not event.object:
        return None
    return DecodedEvent(
        id=event.id,
        workspace_id=event.workspace_id,
        object=event.object,
        action=action,
        record_id=event.record_id,
        record=event.record_json.decode() if event.record_json else None,
        previous_record=previous_record_json(event).decode() or None,
        occurred_at=_moment(event.occurred_at.seconds, event.occurred_at.nanos),
        sequence=event.sequence,
        record_omitted=event.record_omitted,
        previous_record_omitted=event.previous_record_omitted,
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _moment(seconds: int, nanos: int) -> datetime:
    """`Timestamp.ToDatetime(tzinfo=UTC)` at a fraction of its cost (microsecond precision)."""
    return _EPOCH + timedelta(seconds=seconds, microseconds=nanos // 1000)


Addressed = tuple[str, str, str, Msg]  # workspace, object, action (from the subject), message


class _Batch:
    """The messages of one fetch, decoded only when a route wants them (once each)."""

    def __init__(self) -> None:
        self.addressed: list[Addressed] = []
        self._decoded: dict[int, list[DecodedEvent]] = {}
        self._spans: list[trace.Span] = []

    def decoded(self, wanted: list[Addressed]) -> list[DecodedEvent]:
        events: list[DecodedEvent] = []
        for _, _, _, message in wanted:
            key = id(message)
            if key not in self._decoded:
                self._decoded[key] = self._decode(message)
            events += self._decoded[key]
        return events

    def _decode(self, message: Msg) -> list[DecodedEvent]:
        try:
            payloads = event_payloads(message.data, message.headers)
        except ValueError as exc:
            log.warning("skipping an unreadable event batch on %s: %s", message.subject, exc)
            return []
        events: list[DecodedEvent] = []
        for payload in payloads:
            event = decode(payload)
            if event is None:
                log.warning("skipping a message that is not a record event: %s", message.subject)
                continue
            span, carried = _process_span(message, event.id)
            self._spans.append(span)
            events.append(replace(event, trace_context=carried))
        return events

    def end_spans(self) -> None:
        for span in self._spans:
            span.end()


class Intake:
    def __init__(
        self,
        settings: WebhooksSettings,
        nats: NatsClient,
        pool: asyncpg.Pool,
        metrics: WebhooksMetrics,
        dispatcher: Dispatcher,
    ) -> None:
        self._settings = settings
        self._nats = nats
        self._pool = pool
        self._metrics = metrics
        self._dispatcher = dispatcher
        self._routes = Routes()

    async def run(self) -> None:
        subscription = await durable_record_consumer(
            self._nats,
            DURABLE,
            ack_wait=float(self._settings.WEBHOOK_CONSUMER_ACK_WAIT),
            max_ack_pending=4 * BATCH * 8,
        )
        async for messages in fetch_batches(subscription, BATCH):
            await self._handle(messages)

    async def _handle(self, messages: list[Msg]) -> None:
        batch = _Batch()
        for message in messages:
            address = subject_address(message.subject)
            if address is None:
                log.warning("skipping a message that is not a record event: %s", message.subject)
            else:
                batch.addressed.append((*address, message))
        try:
            await self._store_all(batch)
        finally:
            batch.end_spans()
        for message in messages:
            try:
                await message.ack()
            except Exception as exc:  # lost ack: the event comes again and adds nothing
                log.debug("ack failed: %s", exc)

    async def _store_all(self, batch: _Batch) -> None:
        if not batch.addressed:
            return
        # Not acknowledged meanwhile: JetStream would resend them after ack_wait anyway.
        queued = await retry_while_unavailable(
            lambda: self._route(batch), "cannot store events", log
        )
        self._metrics.events.inc(_events_in(batch.addressed))
        if queued:
            self._metrics.deliveries_queued.inc(queued)

    async def _route(self, batch: _Batch) -> int:
        """Queues the deliveries of the events some webhook wants; returns how many. Routed on
        the subjects, so an event no cached route wants is never decoded. The events the cached
        routes passed over are matched again whenever the statement saw another routing
        version than the cache's (a webhook changed), until they agree."""
        if not self._routes.version:
            await self._reload_routes()
        queued = 0
        left = batch.addressed
        while True:
            routes = self._routes
            wanted = [a for a in left if routes.wants(a[0], a[1], a[2])]
            events = batch.decoded(wanted)
            if events:
                version, count = await self._store(events)
                queued += count
            else:
                version = int(await self._pool.fetchval(VERSION))
            if version == routes.version:
                self._metrics.events_skipped.inc(_events_in(left) - len(events))
                return queued
            await self._reload_routes()
            left = [a for a in left if not routes.wants(a[0], a[1], a[2])]

    async def _reload_routes(self) -> None:
        self._routes = Routes.of(tuple(row) for row in await self._pool.fetch(LOAD))
        self._metrics.routes_loads.inc()

    async def _store(self, events: list[DecodedEvent]) -> tuple[int, int]:
        """Stores the events and their deliveries; the dispatcher starts those it has room for.
        Returns the routing version the statement saw and the deliveries queued."""
        async with self._dispatcher.claiming() as room:
            rows = await self._pool.fetch(_INTAKE, *_columns(events), *_room_args(room))
            by_id = {event.id: event for event in events}
            leased = [
                _claimed(row, by_id[row["event_id"]], room.lease) for row in rows if row["leased"]
            ]
            left_due = {
                row["target_origin"] for row in rows if row["id"] is not None and not row["leased"]
            }
            self._dispatcher.adopt(leased, left_due)
        queued = sum(1 for row in rows if row["id"] is not None)
        return int(rows[0]["version"]), queued


def _events_in(addressed: list[Addressed]) -> int:
    return sum(event_count(message.headers) for _, _, _, message in addressed)


def _columns(events: list[DecodedEvent]) -> tuple[list[Any], ...]:
    return (
        [e.id for e in events],
        [e.workspace_id for e in events],
        [e.object for e in events],
        [e.action for e in events],
        [e.record_id or None for e in events],
        [e.record for e in events],
        [e.previous_record for e in events],
        [e.occurred_at for e in events],
        [e.sequence for e in events],
        [e.trace_context for e in events],
        [e.record_omitted for e in events],
        [e.previous_record_omitted for e in events],
    )


def _room_args(room: Room) -> tuple[Any, ...]:
    return (
        list(room.held),
        list(room.held.values()),
        room.total,
        room.wave,
        room.lease_seconds,
        room.lease,
    )


def _claimed(row: Any, event: DecodedEvent, lease: uuid.UUID) -> Claimed:
    """A delivery the intake leased, as the dispatcher's claim would have returned it."""
    return Claimed(
        id=row["id"],
        workspace_id=row["workspace_id"],
        webhook_id=row["webhook_id"],
        event_id=row["event_id"],
        operation=row["operation"],
        attempts=1,
        target_url=row["target_url"],
        target_origin=row["target_origin"],
        secret_sealed=row["secret_sealed"],
        record=event.record,
        previous_record=event.previous_record,
        occurred_at=event.occurred_at,
        trace_context=event.trace_context,
        object=event.object,
        record_id=event.record_id,
        record_omitted=event.record_omitted,
        previous_record_omitted=event.previous_record_omitted,
        author_user_id=row["author_user_id"],
        author_api_key_id=row["author_api_key_id"],
        lease=lease,
    )


def _process_span(message: Msg, event_id: str) -> tuple[trace.Span, str]:
    """The consumer span of one event and the trace context to store with it (its own).

    An event published outside any trace gets no span (and an empty context); one whose trace
    nothing here would record gets no span either, and keeps the publisher's context."""
    carried = {key: value for key, value in (message.headers or {}).items() if key in TRACE_HEADERS}
    parent = extract_context(carried)
    if not trace.get_current_span(parent).get_span_context().is_valid:
        return trace.INVALID_SPAN, "{}"
    if not span_recordable(parent):  # the delivery goes on in the caller's trace, unrecorded
        return trace.INVALID_SPAN, orjson.dumps(carried).decode()
    span = _tracer.start_span(
        f"process {RECORD_EVENTS_STREAM}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes={
            "messaging.system": "nats",
            "messaging.operation.type": "process",
            "messaging.destination.name": message.subject,
            "messaging.message.id": event_id,
        },
    )
    with trace.use_span(span, end_on_exit=False):
        return span, orjson.dumps(trace_context_headers()).decode()
