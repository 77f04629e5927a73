"""NATS connections and JetStream streams, with trace context in message headers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import zlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import nats
import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from crm.events.v1 import events_pb2

log = logging.getLogger("crmkit.nats")

RECORD_EVENTS_STREAM = "CRM_RECORDS"
RECORD_EVENTS_SUBJECTS = ["crm.records.>"]
# Seconds JetStream remembers an event id (`Nats-Msg-Id`) to drop a republished copy. It covers
# a relay takeover (seconds); consumers dedupe on the event id beyond it. Its memory is ~100 bytes
# per event published in the window, so it is kept short (docs/events.md).
RECORD_STREAM_DUPLICATE_WINDOW = 30
METADATA_SUBJECT_PREFIX = "crm.metadata"

# A record event's action as the word in its subject (and in webhook operations) and as the enum.
RECORD_ACTIONS: dict[str, events_pb2.RecordAction] = {
    "created": events_pb2.RECORD_ACTION_CREATED,
    "updated": events_pb2.RECORD_ACTION_UPDATED,
    "deleted": events_pb2.RECORD_ACTION_DELETED,
}
RECORD_ACTION_NAMES: dict[events_pb2.RecordAction, str] = {
    code: name for name, code in RECORD_ACTIONS.items()
}


def record_subject(workspace_id: str, object_name: str, action: str) -> str:
    return f"crm.records.{workspace_id}.{object_name}.{action}"


def previous_record_json(event: events_pb2.RecordEvent) -> bytes:
    """The whole record before the change (b"" for created, or when left out for size).

    The relay sends the before state once, as the values the change replaced
    (`previous_values_json`), and the record after it; the before state is the record overlaid
    with them. An event that carries the whole before state (`previous_record_json`) is read
    as it is.
    """
    if event.previous_record_json:
        return event.previous_record_json
    if not event.previous_values_json or not event.record_json:
        return b""
    replaced = orjson.loads(event.previous_values_json)
    if not replaced:
        return event.record_json
    return orjson.dumps({**orjson.loads(event.record_json), **replaced})


# A message carrying several events of one bulk write (`pack_events`) names their number here.
EVENT_BATCH_HEADER = "Crm-Event-Batch"
_EVENTS_FIELD = 0x0A  # RecordEventBatch.events: field 1, length-delimited


def pack_events(payloads: Sequence[bytes]) -> bytes:
    """Serialised `RecordEvent`s as one deflated `RecordEventBatch` (the payload of a message
    with `EVENT_BATCH_HEADER`). A bulk write's events share most of their bytes, so the batch
    is about a fifth of their size: what JetStream holds in memory follows the bytes published
    (docs/events.md, "Bulk writes")."""
    parts: list[bytes] = []
    for payload in payloads:
        parts += (b"\x0a", encode_varint(len(payload)), payload)
    return zlib.compress(b"".join(parts), 1)


def event_count(headers: Mapping[str, str] | None) -> int:
    """How many events a message carries (1 unless it is a batch)."""
    value = (headers or {}).get(EVENT_BATCH_HEADER)
    return int(value) if value is not None and value.isdecimal() else 1


def event_payloads(data: bytes, headers: Mapping[str, str] | None) -> list[bytes]:
    """The serialised `RecordEvent`s of a message: its payload, or each event of a batch.
    Raises ValueError for a batch that cannot be read."""
    if EVENT_BATCH_HEADER not in (headers or {}):
        return [data]
    try:
        raw = zlib.decompress(data)
    except zlib.error as exc:
        raise ValueError(f"unreadable event batch: {exc}") from exc
    payloads: list[bytes] = []
    position, end = 0, len(raw)
    while position < end:
        if raw[position] != _EVENTS_FIELD:
            raise ValueError(f"unexpected field in an event batch at byte {position}")
        size, position = _read_varint(raw, position + 1)
        if position + size > end:
            raise ValueError("truncated event batch")
        payloads.append(raw[position : position + size])
        position += size
    return payloads


def encode_varint(value: int) -> bytes:
    """A protobuf varint (https://protobuf.dev/programming-guides/encoding/); a negative int64
    or enum as its two's complement, ten bytes."""
    if value < 0:
        value += 1 << 64
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while position < len(data) and shift < 64:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
    raise ValueError("truncated event batch")


_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def subject_address(subject: str) -> tuple[str, str, str] | None:
    """(workspace, object, action) of a record event's subject, None when it is not one.

    Consumers route on it before decoding the payload: the relay builds the subject from the
    same row as the payload, so both name the same workspace, object and action.
    """
    parts = subject.split(".")
    if len(parts) != 5 or parts[4] not in RECORD_ACTIONS or not _UUID.match(parts[2]):
        return None
    return parts[2], parts[3], parts[4]


def metadata_subject(workspace_id: str) -> str:
    return f"{METADATA_SUBJECT_PREFIX}.{workspace_id}.changed"


def schema_applied_subject(workspace_id: str) -> str:
    """Records announces here each schema version it applied (the reconciler listens)."""
    return f"{METADATA_SUBJECT_PREFIX}.{workspace_id}.applied"


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
        # drain() waits for every message already buffered for a pull consumer to be fetched,
        # which never happens once the consumer loop is cancelled; nats-py's default of 30 s
        # outlasts the shutdown grace. Unacknowledged messages are redelivered by JetStream.
        drain_timeout=2,
        allow_reconnect=True,
        disconnected_cb=on_disconnected,
        reconnected_cb=on_reconnected,
        error_cb=on_error,
    )


async def ensure_record_stream(
    js: JetStreamContext,
    *,
    max_age: float | None = None,
    max_bytes: int | None = None,
    duplicate_window: float | None = None,
) -> None:
    """Create (or keep) the stream of record events; file storage, so events survive restarts.

    The producer (the records relay) passes its configured limits and brings an existing stream
    to them; other callers only make sure the stream exists (7 days, no byte limit, the default
    duplicate window).
    """
    config = StreamConfig(
        name=RECORD_EVENTS_STREAM,
        subjects=RECORD_EVENTS_SUBJECTS,
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=7 * 24 * 3600 if max_age is None else max_age,
        max_bytes=max_bytes or -1,
        duplicate_window=(
            RECORD_STREAM_DUPLICATE_WINDOW if duplicate_window is None else duplicate_window
        ),
    )
    try:
        info = await js.stream_info(RECORD_EVENTS_STREAM)
    except NotFoundError:
        await js.add_stream(config)
        log.info("created stream", extra={"stream": RECORD_EVENTS_STREAM})
        return
    if max_age is None and max_bytes is None and duplicate_window is None:
        return
    current = info.config
    wanted = (config.max_age, config.max_bytes, config.duplicate_window)
    if (current.max_age, current.max_bytes, current.duplicate_window) != wanted:
        current.max_age, current.max_bytes, current.duplicate_window = wanted
        await js.update_stream(current)
        log.info("updated stream limits", extra={"stream": RECORD_EVENTS_STREAM})


_IDLE_FETCH_SECONDS = 5.0
_DRAIN_FETCH_SECONDS = 0.01


async def durable_record_consumer(
    nats_client: NatsClient, durable: str, *, ack_wait: float, max_ack_pending: int
) -> Any:
    """A pull subscription to the record events through the durable consumer `durable`.

    Every replica of a worker binds to the same consumer (explicit ack), so each event goes to
    one replica at a time and comes again if it is not acknowledged within `ack_wait`. A new
    consumer starts at the stream's beginning, so events published before the worker first ran
    are not skipped (consumers are idempotent on the event id). Waits for NATS as long as needed.
    """
    config = ConsumerConfig(
        durable_name=durable,
        name=durable,
        filter_subject=RECORD_EVENTS_SUBJECTS[0],
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ack_wait,
        max_ack_pending=max_ack_pending,
        deliver_policy=DeliverPolicy.ALL,
        max_deliver=-1,
    )
    js = nats_client.jetstream()
    while True:
        try:
            await ensure_record_stream(js)
            try:
                await js.add_consumer(RECORD_EVENTS_STREAM, config=config)
            except Exception as exc:  # exists with settings that cannot change: keep it
                log.warning("consumer %s kept as it is: %s", durable, exc)
            return await js.pull_subscribe_bind(durable=durable, stream=RECORD_EVENTS_STREAM)
        except Exception as exc:  # NATS not reachable yet: keep trying
            log.warning("cannot subscribe to record events yet: %s", exc)
            await asyncio.sleep(1)


def _pending_after(message: Msg) -> bool:
    """Whether the stream holds more messages for the consumer after this one."""
    try:
        return bool(message.metadata.num_pending)
    except Exception:  # not a JetStream message: assume there may be more
        return True


async def fetch_batches(subscription: Any, batch: int) -> AsyncIterator[list[Msg]]:
    """Messages of a pull subscription as they come, up to `batch` at a time.

    One message is awaited; what is already waiting behind it joins the batch, so a lone event is
    handled at once and a burst in few round trips. NATS errors are retried forever.
    """
    while True:
        try:
            messages = await subscription.fetch(1, timeout=_IDLE_FETCH_SECONDS)
        except TimeoutError:
            continue
        except Exception as exc:  # NATS away or reconnecting: try again shortly
            log.debug("fetch failed: %s", exc)
            await asyncio.sleep(0.5)
            continue
        if batch > 1 and _pending_after(messages[-1]):
            # More already waiting joins the batch; a timeout means none (or NATS went away).
            with contextlib.suppress(Exception):
                messages += await subscription.fetch(batch - 1, timeout=_DRAIN_FETCH_SECONDS)
        yield messages
