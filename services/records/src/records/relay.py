"""The outbox relay: publishes `records.outbox` rows to JetStream, in order per record, and marks
them published. Only the rows of workspaces somebody listens to are published
(RECORD_EVENTS_PUBLISH=interested, `fetch_sql`, docs/events.md "Who listens"); the statement
that reads a batch marks the others published without publishing them.

Every records replica runs it; one is active at a time. The active relay holds a session-level
Postgres advisory lock on its own connection; the others retry the lock every second, so when the
active process dies (its connection closes, the lock is released) another takes over. Rows are
never lost: a row is marked published only after JetStream acknowledged it. With NATS down the rows
wait (writes still succeed) and the relay retries with backoff; when NATS is back they flow, each
record's events in sequence order (see `inflight.InFlight`). Publishes are pipelined: many in
flight, their acknowledgements read together on one reply subscription. A row published but not yet
marked when the process dies is published again; JetStream drops the copy inside its duplicate
window (Nats-Msg-Id), and consumers dedupe on the event id beyond it.

The relay wakes on `NOTIFY records_outbox` (sent by a write that records events, through
`records.events_wanted`) and polls every
second as a fallback; after a read that found less than a batch it lets rows gather for
OUTBOX_RELAY_GATHER (5 ms) before the next, so that under a steady stream of writes one statement
reads and marks the rows of many commits. Beside it, on a connection of its own so that no event
waits behind them, the active relay updates the pending and lag gauges every second and prunes
published rows older than the retention.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import asyncpg
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext
from opentelemetry import trace

from crmkit.db import DATABASE_UNAVAILABLE
from crmkit.messaging import RECORD_EVENTS_STREAM, ensure_record_stream
from crmkit.outages import OutageLog
from crmkit.telemetry import extract_context, span_recordable, trace_context_headers
from records.envelope import OUTBOX_COLUMNS, Message, OutboxRow, messages_of, pub_frame
from records.event_interest import GATING, PRUNE_LAPSED, PUBLISH_CONDITION
from records.inflight import InFlight
from records.metrics import RecordsMetrics
from records.settings import RecordsSettings

log = logging.getLogger("records.relay")
_tracer = trace.get_tracer("records.relay")

NOTIFY_CHANNEL = "records_outbox"
LOCK_KEY = int.from_bytes(hashlib.sha256(b"records.outbox.relay").digest()[:8], "big", signed=True)
_STANDBY_RETRY_SECONDS = 1.0
_POLL_SECONDS = 1.0  # fallback when a notification is missed
_GAUGE_SECONDS = 1.0
_PRUNE_SECONDS = 60.0
_PRUNE_CHUNK = 5000
_MAX_BACKOFF_SECONDS = 5.0
# Publish frames are handed to the NATS client this many bytes at a time (at most a message over).
_WRITE_BYTES = 256 * 1024


def fetch_sql(*, gated: bool, ahead: bool) -> str:
    """The statement reading the next batch of unpublished rows (OUTBOX_COLUMNS, then whether to
    publish the row). `ahead`: while earlier rows (`$2`: read, not yet marked) are in flight.

    `gated` (RECORD_EVENTS_PUBLISH=interested): a row is published only if its workspace has an
    unexpired interest (`event_interest.PUBLISH_CONDITION`), read by the same statement as the
    row, so after the row's commit: an interest committed before the event's transaction
    committed is seen. The rows of workspaces without interest are marked published by that
    statement too, never published.

    The rows read ahead leave out `$2` through a hashed set (`NOT IN (SELECT unnest(...))`, a
    hashed subplan) rather than `<> ALL($2)`, which compares each row with every element.
    """
    exclude = "AND o.sequence NOT IN (SELECT unnest($2::bigint[])) " if ahead else ""
    if not gated:
        return (
            f"SELECT {OUTBOX_COLUMNS}, true FROM records.outbox o WHERE o.published_at IS NULL "
            f"{exclude}ORDER BY o.sequence LIMIT $1"
        )
    return (
        f"WITH batch AS MATERIALIZED (SELECT {OUTBOX_COLUMNS}, {PUBLISH_CONDITION} AS wanted "
        f"FROM records.outbox o WHERE o.published_at IS NULL {exclude}"
        "ORDER BY o.sequence LIMIT $1), "
        "skipped AS (UPDATE records.outbox o SET published_at = now() FROM batch b "
        "WHERE o.sequence = b.sequence AND NOT b.wanted) "
        "SELECT * FROM batch ORDER BY sequence"
    )


_MARK = "UPDATE records.outbox SET published_at = now() WHERE sequence = ANY($1::bigint[])"
# The backlog's gauges from a bounded number of index entries, however long the backlog: the
# unpublished rows counted up to $1; beyond, the span of sequences from the next unpublished row
# (the one the relay reads next) to the newest row, an upper bound since the relay publishes in
# sequence order. A full count with min(occurred_at) read every waiting row every second: 64-88 ms
# at 500,000 rows, while the relay needs the database most.
_COUNT_CAP = 10_000
_BACKLOG = """
WITH next AS (
    SELECT sequence, occurred_at FROM records.outbox WHERE published_at IS NULL
    ORDER BY sequence LIMIT 1
)
SELECT (SELECT count(*) FROM (SELECT 1 FROM records.outbox WHERE published_at IS NULL
                              LIMIT $1) waiting),
       coalesce((SELECT max(sequence) FROM records.outbox) - (SELECT sequence FROM next) + 1, 0),
       coalesce(extract(epoch FROM clock_timestamp() - (SELECT occurred_at FROM next)), 0)
"""
# Bounded work per round: among the oldest rows by sequence, those published before the cutoff.
_PRUNE = (
    "DELETE FROM records.outbox WHERE sequence IN (SELECT sequence FROM records.outbox "
    "ORDER BY sequence LIMIT $1) AND published_at < now() - make_interval(secs => $2)"
)


# The relay's connections. A mark lost in a database crash only republishes rows (deduped): no
# need to wait for the WAL flush. Every statement is planned for its own batch, never from a
# generic plan cached while the outbox looked empty: that plan marked 1,000 rows by a sequential
# scan comparing every row with every id (166-294 ms a batch at 42,000 rows, the relay at
# 2,600-3,400 events/s); planned with the ids, an index scan (9 ms). And the next batch is always
# read from the unpublished rows' index in sequence order, only as far as the batch: with
# statistics from before a bulk load (the outbox "nearly empty"), a bitmap scan read the whole
# backlog and sorted it for every batch (22 ms a batch of 500 at 20,000 waiting rows, against
# 1.4 ms; the relay in the stack at 9,071-10,632 events/s, against 11,001-11,380).
SESSION_SETTINGS = {
    "synchronous_commit": "off",
    "plan_cache_mode": "force_custom_plan",
    "enable_bitmapscan": "off",
}


class PublishFailed(Exception):
    """Some messages were not acknowledged."""


class OutboxRelay:
    def __init__(
        self, settings: RecordsSettings, nats: NatsClient, metrics: RecordsMetrics
    ) -> None:
        self._settings = settings
        self._nats = nats
        self._js: JetStreamContext = nats.jetstream()
        self._metrics = metrics
        self._wake = asyncio.Event()
        self._stream_ready = False
        self._next_prune = 0.0
        self._outage = OutageLog("database (outbox relay)", log)
        self._inbox = ""
        self._runs = 0
        self._flight: InFlight | None = None
        gated = settings.RECORD_EVENTS_PUBLISH == "interested"
        self._gated = gated
        self._fetch = fetch_sql(gated=gated, ahead=False)
        self._fetch_ahead = fetch_sql(gated=gated, ahead=True)

    async def run(self) -> None:
        """Forever: wait to become the active relay, then publish until the connection fails."""
        while True:
            connection: Any = None
            try:
                connection = await self._connect("relay")
                self._outage.recovered()
                if await connection.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY):
                    log.info("outbox relay active")
                    self._metrics.relay_active.set(1)
                    keeper = asyncio.create_task(self._keep_house(), name="outbox-housekeeping")
                    try:
                        await self._lead(connection)
                    finally:
                        keeper.cancel()
                        await asyncio.gather(keeper, return_exceptions=True)
            except DATABASE_UNAVAILABLE as exc:
                self._outage.failed(exc)
            finally:
                self._metrics.relay_active.set(0)
                if connection is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(connection.close(timeout=2))
            await asyncio.sleep(_STANDBY_RETRY_SECONDS)

    async def _connect(self, name: str) -> Any:
        return await asyncpg.connect(
            self._settings.DATABASE_URL,
            server_settings={"application_name": name, **SESSION_SETTINGS},
        )

    async def _lead(self, connection: Any) -> None:
        await connection.add_listener(NOTIFY_CHANNEL, self._on_notify)
        backoff = 0.0
        full = True
        gather = self._settings.OUTBOX_RELAY_GATHER
        while not connection.is_closed():
            if not full and gather:
                # Rows committed meanwhile are read by one statement rather than one each.
                await asyncio.sleep(gather)
            self._wake.clear()
            try:
                full = await self._drain(connection)
                backoff = 0.0
            except PublishFailed as exc:
                backoff = min(max(backoff * 2, 0.1), _MAX_BACKOFF_SECONDS)
                log.warning("outbox publish failed, retrying in %.1fs: %s", backoff, exc)
                await asyncio.sleep(backoff)
                continue
            if full:
                continue  # the last read filled a batch: more rows are waiting
            # A row committed since the last read notified after the clear() above, so this wait
            # ends at once for it: no statement is spent on reading nothing.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), _POLL_SECONDS)

    def _on_notify(self, *_: object) -> None:
        self._wake.set()

    async def _on_ack(self, msg: Msg) -> None:
        flight = self._flight
        token = msg.subject.rsplit(".", 1)[-1]
        if flight is not None and token.startswith(flight.prefix):
            flight.answer(token, msg)

    async def _drain(self, connection: Any) -> bool:
        """Publishes the unpublished rows until a read finds less than a batch; returns whether
        the last read filled a batch (rows nobody listens to only: more may be waiting).

        Publishes are pipelined: up to twice the batch size are in flight, their
        acknowledgements read as they come and the acknowledged rows marked published a batch
        at a time; the next batch is read while earlier ones are in flight (rows read but not
        yet marked are left out of that read). A message waits only while an earlier one of
        its record is in flight (`InFlight.blocks`). On a failure nothing more is published:
        what was acknowledged is marked, and the next run reads the rest again in order.
        Rows nobody listens to were marked by the statement that read them (`fetch_sql`).
        """
        if not self._nats.is_connected:
            raise PublishFailed("NATS is not connected")
        batch = self._settings.OUTBOX_RELAY_BATCH_SIZE
        rows = await connection.fetch(self._fetch, batch)
        queue = deque(self._messages(rows))
        if not queue:
            return len(rows) == batch
        if not self._stream_ready:
            await self._ensure_stream()
        if not self._inbox:  # the client subscribes again by itself after a reconnect
            inbox = self._nats.new_inbox()
            await self._nats.subscribe(f"{inbox}.*", cb=self._on_ack)
            self._inbox = inbox
        self._runs += 1
        flight = InFlight(self._runs)
        self._flight = flight
        read = _sequences(queue)  # read and not yet marked
        more = len(rows) == batch
        reading: asyncio.Task[list[Any]] | None = None

        def absorb(rows: list[Any]) -> None:
            nonlocal more
            more = len(rows) == batch
            messages = self._messages(rows)
            queue.extend(messages)
            read.update(_sequences(messages))

        try:
            while True:
                # Refilled in bulk (not one message per acknowledgement): fewer, larger writes.
                if len(flight.waiting) <= 2 * batch - max(batch // 2, 1):
                    await self._publish_queued(flight, queue, 2 * batch)
                if reading is None and more and len(queue) < batch and not flight.error:
                    reading = asyncio.create_task(
                        connection.fetch(self._fetch_ahead, batch, list(read))
                    )
                    reading.add_done_callback(lambda _: flight.changed.set())
                if reading is not None and reading.done():
                    absorb(reading.result())
                    reading = None
                    continue
                settled = not queue and not flight.waiting and reading is None
                if flight.error or settled or len(flight.acknowledged) >= batch:
                    if reading is not None:  # one statement at a time on the connection
                        absorb(await reading)
                        reading = None
                    await self._mark(connection, flight, read)
                    if flight.error:
                        raise PublishFailed(flight.error)
                    if settled:
                        return False  # the last read found less than a batch
                    continue
                await self._await_answers(flight)
        finally:
            if reading is not None:
                await asyncio.gather(reading, return_exceptions=True)
            flight.abandon("relay stopped")
            self._flight = None
            if flight.stream_missing:
                self._stream_ready = False  # the stream is gone: create it again

    async def _publish_queued(self, flight: InFlight, queue: deque[Message], limit: int) -> None:
        """Publishes queued messages in order while none of them waits for its record: their
        frames written to the client's buffer together (a write per `_WRITE_BYTES`, not a
        client call per message)."""
        frames: list[bytes] = []
        tokens: list[str] = []
        size = 0
        while queue and not flight.error and len(flight.waiting) < limit:
            message = queue[0]
            if flight.blocks(message):
                break
            queue.popleft()
            span, headers = _publish_span(message)
            token = flight.add(message, span)
            try:
                frame = pub_frame(
                    message.subject, f"{self._inbox}.{token}", headers, message.payload
                )
            except ValueError as exc:  # this one fails; those before it go out
                flight.unsent(token, f"publish: {exc}")
                break
            frames.append(frame)
            tokens.append(token)
            size += len(frame)
            if size >= _WRITE_BYTES:
                await self._write(flight, frames, tokens)
                frames, tokens, size = [], [], 0
        if frames:
            await self._write(flight, frames, tokens)

    async def _write(self, flight: InFlight, frames: list[bytes], tokens: list[str]) -> None:
        """Queues publish frames on the NATS connection and wakes its flusher, as
        `Client.publish` does for one (nats-py's pending buffer and flusher task). On a client
        error the messages count as not sent (their rows are read again)."""
        nats: Any = self._nats
        try:
            if nats.is_closed or nats.is_draining_pubs or not nats.is_connected:
                raise PublishFailed("NATS is not connected")
            await nats._send_command(b"".join(frames))
            if nats._flush_queue is not None and nats._flush_queue.empty():
                await nats._flush_pending()
        except Exception as exc:  # any client error: retry the rest later
            for token in tokens:
                flight.unsent(token, f"publish: {type(exc).__name__}: {exc}")

    async def _await_answers(self, flight: InFlight) -> None:
        """Until an answer or the read ahead came (since the last call); fails the messages not
        answered within OUTBOX_PUBLISH_TIMEOUT."""
        timeout = self._settings.OUTBOX_PUBLISH_TIMEOUT
        if not flight.changed.is_set():
            oldest = flight.oldest()
            left = timeout if oldest is None else oldest + timeout - time.monotonic()
            if left > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(flight.changed.wait(), left)
        flight.changed.clear()
        oldest = flight.oldest()
        if oldest is not None and time.monotonic() - oldest >= timeout:
            flight.abandon("no acknowledgement in time")

    async def _mark(self, connection: Any, flight: InFlight, read: set[int]) -> None:
        acknowledged = flight.take_acknowledged()
        if not acknowledged:
            return
        await connection.execute(_MARK, acknowledged)
        read.difference_update(acknowledged)
        self._metrics.published.inc(len(acknowledged))

    def _messages(self, rows: list[Any]) -> list[Message]:
        """The messages of the rows to publish (the last column says whether to); the others
        were marked published by the statement that read them, and are counted."""
        published = [OutboxRow.of(tuple(row)[:-1]) for row in rows if row[-1]]
        if len(published) < len(rows):
            self._metrics.skipped.inc(len(rows) - len(published))
        return messages_of(
            published, self._nats.max_payload, batches=self._settings.RECORD_EVENTS_BULK_BATCHES
        )

    async def _ensure_stream(self) -> None:
        try:
            await ensure_record_stream(
                self._js,
                max_age=float(self._settings.RECORD_STREAM_MAX_AGE),
                max_bytes=self._settings.RECORD_STREAM_MAX_BYTES,
                duplicate_window=float(self._settings.RECORD_STREAM_DUPLICATE_WINDOW),
            )
        except Exception as exc:  # NATS away or not ready: the round retries
            raise PublishFailed(f"stream: {type(exc).__name__}: {exc}") from None
        self._stream_ready = True

    async def _keep_house(self) -> None:
        """While this relay is active: the gauges every second, the pruning every minute."""
        while True:
            connection: Any = None
            try:
                connection = await self._connect("relay-housekeeping")
                while True:
                    await self._housekeeping(connection)
                    await asyncio.sleep(_GAUGE_SECONDS)
            except DATABASE_UNAVAILABLE as exc:
                log.warning("outbox housekeeping lost its database connection: %s", exc)
            finally:
                if connection is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(connection.close(timeout=2))
            await asyncio.sleep(_STANDBY_RETRY_SECONDS)

    async def _housekeeping(self, connection: Any) -> None:
        now = time.monotonic()
        counted, span, lag = await connection.fetchrow(_BACKLOG, _COUNT_CAP + 1)
        self._metrics.outbox_pending.set(counted if counted <= _COUNT_CAP else span)
        self._metrics.relay_lag.set(float(lag))
        self._metrics.events_gated.set(
            1 if self._gated and await connection.fetchval(GATING) else 0
        )
        if now >= self._next_prune:
            self._next_prune = now + _PRUNE_SECONDS
            await connection.execute(PRUNE_LAPSED, _PRUNE_CHUNK)
            retention = float(self._settings.OUTBOX_RETENTION)
            while True:
                status = await connection.execute(_PRUNE, _PRUNE_CHUNK, retention)
                deleted = int(status.split()[-1])
                if deleted:
                    self._metrics.pruned.inc(deleted)
                if deleted < _PRUNE_CHUNK:
                    break


def _sequences(messages: Iterable[Message]) -> set[int]:
    """The outbox sequences of messages, a batch's each (without building a list per message:
    the relay calls this for every message it reads)."""
    found = {message.sequence for message in messages}
    found.update(sequence for message in messages for sequence, _ in message.rest)
    return found


def _publish_span(message: Message) -> tuple[trace.Span, dict[str, str]]:
    """A producer span continuing the trace of the write that made the row (stored with it),
    and the message headers carrying that span's context onward. Rows written outside any
    trace are published without a span rather than starting a trace each; so are rows of a
    trace nothing here would record (the message carries the write's context unchanged)."""
    headers = dict(message.headers)
    if "traceparent" not in headers:
        return trace.INVALID_SPAN, headers
    parent = extract_context(headers)
    if not trace.get_current_span(parent).get_span_context().is_valid:
        return trace.INVALID_SPAN, headers
    if not span_recordable(parent):
        return trace.INVALID_SPAN, headers
    span = _tracer.start_span(
        f"publish {RECORD_EVENTS_STREAM}",
        context=parent,
        kind=trace.SpanKind.PRODUCER,
        attributes={
            "messaging.system": "nats",
            "messaging.operation.type": "publish",
            "messaging.destination.name": message.subject,
            "messaging.message.id": headers.get("Nats-Msg-Id", ""),
        },
    )
    with trace.use_span(span, end_on_exit=False):
        trace_context_headers(headers)
    return span, headers
