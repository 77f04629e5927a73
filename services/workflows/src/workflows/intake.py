"""Event intake: record events from JetStream become queued runs of the matching workflows.

Every runner replica pulls from one durable consumer (`workflows-runner`, explicit ack), so each
event goes to one replica at a time. For a batch, the active record-triggered workflows of the
workspaces and objects its subjects name are read in one query; only the events one of them may
want are decoded, and matched in memory (crm.workflows triggers), and one run per (workflow, event)
is inserted, idempotent on the pair. The messages are acknowledged only after the rows commit, so a
crash before that makes JetStream send them again. The trace context of each message is kept on its
runs, so the HTTP request continues the trace of the write that caused it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC
from typing import Any

import asyncpg
import grpc
import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from crm.events.v1 import events_pb2
from crm.records.v1 import records_pb2 as rp
from crm.records.v1 import records_pb2_grpc
from crmkit.authors import Author, AuthorAccess, AuthorUnavailable
from crmkit.db import retry_while_unavailable
from crmkit.filters import referenced_fields
from crmkit.messaging import (
    RECORD_ACTION_NAMES,
    durable_record_consumer,
    event_count,
    event_payloads,
    fetch_batches,
    previous_record_json,
    subject_address,
)
from crmkit.principal import PrincipalCodec, system_principal
from crmkit.telemetry import TRACE_HEADERS
from workflows.definitions import relation_heads
from workflows.metrics import WorkflowsMetrics
from workflows.settings import WorkflowsSettings
from workflows.triggers import ACTION_TRIGGERS, Event, RecordTrigger, filter_matches, wants

log = logging.getLogger("workflows.intake")

DURABLE = "workflows-runner"
BATCH = 256

_TRIGGERS = """
SELECT id::text, workspace_id::text, trigger_type, object, filter, fields,
       author_user_id::text, author_api_key_id::text, read_objects
FROM workflows.workflows
WHERE status = 'active' AND trigger_type IN ('record_created', 'record_updated')
  AND (workspace_id, object) IN (SELECT * FROM unnest($1::uuid[], $2::text[]))
"""

_QUEUE = """
WITH queued AS (
    INSERT INTO workflows.runs (id, workspace_id, workflow_id, trigger_key, trigger_event,
                                trace_context, next_attempt_at)
    SELECT * , now() FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::jsonb[],
                                 $6::jsonb[])
    ON CONFLICT (workflow_id, trigger_key) WHERE trigger_key IS NOT NULL DO NOTHING
    RETURNING workflow_id
), touched AS (
    UPDATE workflows.workflows SET last_run_at = now()
    WHERE id IN (SELECT workflow_id FROM queued)
)
SELECT count(*) FROM queued
"""


def decode(data: bytes) -> tuple[Event, events_pb2.RecordEvent] | None:
    """The event in a message, or None when it is not a usable record event."""
    message = events_pb2.RecordEvent()
    try:
        message.ParseFromString(data)
    except Exception:  # protobuf raises DecodeError (a bare Exception subclass)
        return None
    action = RECORD_ACTION_NAMES.get(message.action)
    if action is None or not message.id or not message.workspace_id or not message.object:
        return None
    previous = previous_record_json(message)
    event = Event(
        id=message.id,
        workspace_id=message.workspace_id,
        object=message.object,
        action=action,
        record=orjson.loads(message.record_json) if message.record_json else None,
        previous_record=orjson.loads(previous) if previous else None,
        changed_fields=frozenset(message.changed_fields),
        actor_workflow_id=message.actor.workflow_id,
    )
    return event, message


def trigger_event(event: Event, message: events_pb2.RecordEvent) -> dict[str, Any]:
    """What a run keeps of the event that started it (shown as the run's triggerEvent)."""
    return {
        "id": event.id,
        "type": f"{event.object}.{event.action}",
        "object": event.object,
        "recordId": message.record_id,
        "occurredAt": message.occurred_at.ToDatetime(tzinfo=UTC).isoformat(),
        "record": event.record,
        "previousRecord": event.previous_record,
        "changedFields": sorted(event.changed_fields),
    }


def trace_of(message: Msg, event: events_pb2.RecordEvent) -> dict[str, str]:
    headers: Mapping[str, str] = message.headers or {}
    found = {key: headers[key] for key in TRACE_HEADERS if key in headers}
    return found or dict(event.trace_context)


class Intake:
    def __init__(
        self,
        settings: WorkflowsSettings,
        nats: NatsClient,
        pool: asyncpg.Pool,
        records: records_pb2_grpc.RecordsServiceStub,
        principals: PrincipalCodec,
        metrics: WorkflowsMetrics,
        on_queued: Callable[[], None],
        authors: AuthorAccess,
    ) -> None:
        self._authors = authors
        self._settings = settings
        self._nats = nats
        self._pool = pool
        self._records = records
        self._principals = principals
        self._metrics = metrics
        self._on_queued = on_queued

    async def run(self) -> None:
        subscription = await durable_record_consumer(
            self._nats,
            DURABLE,
            ack_wait=float(self._settings.WORKFLOW_CONSUMER_ACK_WAIT),
            max_ack_pending=4 * BATCH,
        )
        async for messages in fetch_batches(subscription, BATCH):
            await self._handle(messages)

    async def _handle(self, messages: list[Msg]) -> None:
        addressed: list[tuple[str, str, str, Msg]] = []
        for message in messages:
            address = subject_address(message.subject)
            if address is None:
                log.warning("skipping a message that is not a record event: %s", message.subject)
            else:
                addressed.append((*address, message))
        # Not acknowledged meanwhile: JetStream would resend them after ack_wait anyway.
        queued = (
            await retry_while_unavailable(lambda: self._queue(addressed), "cannot queue runs", log)
            if addressed
            else 0
        )
        self._metrics.events.inc(sum(event_count(a[3].headers) for a in addressed))
        if queued:
            self._metrics.runs_queued.labels("record").inc(queued)
            self._on_queued()
        for message in messages:
            try:
                await message.ack()
            except Exception as exc:  # lost ack: the event comes again and adds nothing
                log.debug("ack failed: %s", exc)

    async def _queue(self, addressed: list[tuple[str, str, str, Msg]]) -> int:
        """Queues the runs the events start. The triggers are read for the workspaces and
        objects named by the subjects, after the batch arrived (so after its events committed):
        an event is decoded only when an active workflow of its workspace may want it."""
        keys = {(workspace_id, object_name) for workspace_id, object_name, _, _ in addressed}
        rows = await self._pool.fetch(_TRIGGERS, [key[0] for key in keys], [key[1] for key in keys])
        if not rows:
            return 0
        triggers = [RecordTrigger.of(dict(row)) for row in rows]
        listening = {(t.workspace_id, t.object, t.type) for t in triggers}
        decoded: list[tuple[Event, events_pb2.RecordEvent, Msg]] = []
        for workspace_id, object_name, action, msg in addressed:
            if (workspace_id, object_name, ACTION_TRIGGERS.get(action)) not in listening:
                continue
            try:
                payloads = event_payloads(msg.data, msg.headers)
            except ValueError as exc:
                log.warning("skipping an unreadable event batch on %s: %s", msg.subject, exc)
                continue
            for payload in payloads:
                found = decode(payload)
                if found is None:
                    log.warning("skipping a message that is not a record event: %s", msg.subject)
                else:
                    decoded.append((*found, msg))
        authored = {
            row["id"]: (
                Author(row["author_user_id"], row["author_api_key_id"]),
                row["read_objects"],
            )
            for row in rows
        }
        runs: list[tuple[Any, ...]] = []
        for event, message, msg in decoded:
            for trigger in triggers:
                if not wants(trigger, event):
                    continue
                record = await self._with_relations(trigger, event)
                if not filter_matches(trigger, record):
                    continue
                runs.append(
                    (
                        uuid.uuid4(),
                        event.workspace_id,
                        trigger.workflow_id,
                        event.id,
                        await self._kept_event(
                            trigger_event(event, message),
                            event.workspace_id,
                            *authored[trigger.workflow_id],
                        ),
                        trace_of(msg, message),
                    )
                )
        if not runs:
            return 0
        columns = list(zip(*runs, strict=True))
        count = await self._pool.fetchval(_QUEUE, *[list(column) for column in columns])
        return int(count or 0)

    async def _kept_event(
        self, kept: dict[str, Any], workspace_id: str, author: Author, read_objects: list[str]
    ) -> dict[str, Any]:
        """What the run keeps of the event (its triggerEvent, shown in the run log): without
        the records when the author may not read them now, or cannot be checked (the runner
        checks again before the run reads anything, and says why it fails)."""
        try:
            refusal = await self._authors.refusal(workspace_id, author, read_objects)
        except AuthorUnavailable:
            refusal = "unchecked"
        if refusal is None:
            return kept
        return {**kept, "record": None, "previousRecord": None}

    async def _with_relations(self, trigger: RecordTrigger, event: Event) -> dict[str, Any] | None:
        """The record, with the relations the filter reads through loaded (rare: only filters
        such as {"company": {"name": ...}} need them)."""
        record = event.record
        if record is None or trigger.filter is None:
            return record
        heads = relation_heads(sorted(referenced_fields(trigger.filter)), record)
        heads = [head for head in heads if record.get(f"{head}Id")]
        if not heads:
            return record
        principal = system_principal(event.workspace_id, workflow_id=trigger.workflow_id)
        try:
            reply = await self._records.GetRecord(
                rp.GetRecordRequest(
                    ref=rp.ObjectRef(object=event.object),
                    id=str(record.get("id")),
                    depth=1,
                    deleted=rp.DELETED_SCOPE_INCLUDE,
                ),
                metadata=self._principals.metadata(principal),
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return record
            raise OSError(f"records service: {exc.details()}") from None
        loaded: dict[str, Any] = orjson.loads(reply.record_json)
        return {**record, **{head: loaded.get(head) for head in heads}}
