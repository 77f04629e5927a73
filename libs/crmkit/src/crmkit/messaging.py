"""NATS connections and JetStream streams, with trace context in message headers."""

from __future__ import annotations

import logging

import nats
from nats.aio.client import Client as NatsClient
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

log = logging.getLogger("crmkit.nats")

RECORD_EVENTS_STREAM = "CRM_RECORDS"
RECORD_EVENTS_SUBJECTS = ["crm.records.>"]
METADATA_SUBJECT_PREFIX = "crm.metadata"


def record_subject(workspace_id: str, object_name: str, action: str) -> str:
    return f"crm.records.{workspace_id}.{object_name}.{action}"


def metadata_subject(workspace_id: str) -> str:
    return f"{METADATA_SUBJECT_PREFIX}.{workspace_id}.changed"


async def connect(url: str, name: str) -> NatsClient:
    """A connection that reconnects forever (the outbox waits while NATS is away)."""

    async def on_disconnected() -> None:
        log.warning("nats disconnected")

    async def on_reconnected() -> None:
        log.info("nats reconnected")

    async def on_error(exc: Exception) -> None:
        log.warning("nats error: %s", exc)

    return await nats.connect(
        url,
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=5,
        allow_reconnect=True,
        disconnected_cb=on_disconnected,
        reconnected_cb=on_reconnected,
        error_cb=on_error,
    )


async def ensure_record_stream(js: JetStreamContext) -> None:
    """Create (or keep) the stream of record events; file storage, so events survive restarts."""
    config = StreamConfig(
        name=RECORD_EVENTS_STREAM,
        subjects=RECORD_EVENTS_SUBJECTS,
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=7 * 24 * 3600,
        duplicate_window=120,
    )
    try:
        await js.stream_info(RECORD_EVENTS_STREAM)
    except NotFoundError:
        await js.add_stream(config)
        log.info("created stream", extra={"stream": RECORD_EVENTS_STREAM})
