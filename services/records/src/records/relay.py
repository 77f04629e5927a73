"""The outbox relay: publishes `records.outbox` rows to JetStream, in order per record, and marks
them published.

Every records replica runs it; one is active at a time. The active relay holds a session-level
Postgres advisory lock on its own connection; the others retry the lock every second, so when
the active process dies (its connection closes, the lock is released) another takes over. Rows
are never lost: a row is marked published only after JetStream acknowledged it. With NATS down
the rows wait (writes still succeed) and the relay retries with backoff; when NATS is back they
flow, each record's events in sequence order (see `envelope.waves`). A row published but not yet
marked when the process dies is published again; JetStream drops the copy inside its duplicate
window (Nats-Msg-Id), and consumers dedupe on the event id beyond it.

The relay wakes on `NOTIFY records_outbox` (a statement trigger on the outbox) and polls every
second as a fallback. Beside it, on a connection of its own so that no event waits behind them,
the active relay updates the pending and lag gauges every second and prunes published rows
older than the retention.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from typing import Any

import asyncpg
import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext
from opentelemetry import trace

from crmkit.db import DATABASE_UNAVAILABLE
from crmkit.messaging import RECORD_EVENTS_STREAM, ensure_record_stream
from crmkit.outages import OutageLog
from crmkit.telemetry import extract_context, inject_headers, span_recordable
from records.envelope import OUTBOX_COLUMNS, Message, OutboxRow, message_of, waves
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

_FETCH = (
    f"SELECT {OUTBOX_COLUMNS} FROM records.outbox WHERE published_at IS NULL "
    "ORDER BY sequence LIMIT $1"
)
# The next batch while the current one (`$2`) is being acknowledged.
_FETCH_AHEAD = (
    f"SELECT {OUTBOX_COLUMNS} FROM records.outbox WHERE published_at IS NULL "
    "AND sequence <> ALL($2::bigint[]) ORDER BY sequence LIMIT $1"
)
_MARK = "UPDATE records.outbox SET published_at = now() WHERE sequence = ANY($1::bigint[])"
_BACKLOG = (
    "SELECT count(*), coalesce(extract(epoch FROM clock_timestamp() - min(occurred_at)), 0) "
    "FROM records.outbox WHERE published_at IS NULL"
)
# Bounded work per round: among the oldest rows by sequence, those published before the cutoff.
_PRUNE = (
    "DELETE FROM records.outbox WHERE sequence IN (SELECT sequence FROM records.outbox "
    "ORDER BY sequence LIMIT $1) AND published_at < now() - make_interval(secs => $2)"
)


class PublishFailed(Exception):
    """Some messages of a wave were not acknowledged."""


class _Wave:
    """The acknowledgements of one wave, gathered on the relay's reply subscription.

    Each message is published with reply subject `<inbox>.<wave>x<index>`; JetStream answers
    there with its PubAck (or an error). One subscription and a dict instead of a future and
    a timer per message (nats-py's publish_async) lets one relay publish several times faster.
    """

    def __init__(self, number: int) -> None:
        self.prefix = f"{number}x"
        self.waiting: dict[str, tuple[Message, trace.Span]] = {}
        self.acknowledged: list[int] = []
        self.error = ""
        self.stream_missing = False
        self.sealed = False  # every message of the wave has been handed to the client
        self.complete = asyncio.Event()

    def answer(self, token: str, msg: Msg) -> None:
        entry = self.waiting.pop(token, None)
        if entry is None:
            return
        message, span = entry
        problem = _ack_problem(msg)
        if problem:
            self.error = self.error or problem
            self.stream_missing = self.stream_missing or problem.startswith("no stream")
        else:
            self.acknowledged.append(message.sequence)
        _end_span(span, problem)
        if self.sealed and not self.waiting:
            self.complete.set()

    def seal(self) -> None:
        self.sealed = True
        if not self.waiting:
            self.complete.set()

    def abandon(self, reason: str) -> None:
        """The messages still waiting count as failed (a late answer is then ignored)."""
        for _, span in self.waiting.values():
            _end_span(span, reason)
        if self.waiting:
            self.error = self.error or reason
        self.waiting.clear()


def _ack_problem(msg: Msg) -> str:
    """Why JetStream did not store the message ("" when it did, duplicates included)."""
    if msg.headers and msg.headers.get("Status") == "503":
        return "no stream answered (no responders)"
    try:
        answer = orjson.loads(msg.data)
    except orjson.JSONDecodeError:
        return "ack: unreadable answer"
    if not isinstance(answer, dict):
        return "ack: unreadable answer"
    if "error" in answer:
        error = answer["error"]
        detail = error.get("description", error) if isinstance(error, dict) else error
        return f"ack: {detail}"
    return ""


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
        self._waves = 0
        self._wave: _Wave | None = None

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
            # A mark lost in a database crash only republishes rows (deduped): no need to wait
            # for the WAL flush.
            server_settings={"application_name": name, "synchronous_commit": "off"},
        )

    async def _lead(self, connection: Any) -> None:
        await connection.add_listener(NOTIFY_CHANNEL, self._on_notify)
        backoff = 0.0
        ahead: list[Message] | None = None  # the next round, read while acks were awaited
        while not connection.is_closed():
            self._wake.clear()
            try:
                published, more, ahead = await self._publish_round(connection, ahead)
                backoff = 0.0
            except PublishFailed as exc:
                ahead = None
                backoff = min(max(backoff * 2, 0.1), _MAX_BACKOFF_SECONDS)
                log.warning("outbox publish failed, retrying in %.1fs: %s", backoff, exc)
                await asyncio.sleep(backoff)
                continue
            if published:
                self._metrics.published.inc(published)
            if more:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), _POLL_SECONDS)

    def _on_notify(self, *_: object) -> None:
        self._wake.set()

    async def _on_ack(self, msg: Msg) -> None:
        wave = self._wave
        token = msg.subject.rsplit(".", 1)[-1]
        if wave is not None and token.startswith(wave.prefix):
            wave.answer(token, msg)

    async def _publish_round(
        self, connection: Any, ahead: list[Message] | None = None
    ) -> tuple[int, bool, list[Message] | None]:
        """Publish one batch (`ahead`, when the previous round read it); returns the rows
        published, whether more rows may be waiting, and the next batch when it was read.

        While JetStream acknowledges this batch, the next one is read and encoded (the
        connection is idle then): the next round starts as soon as this one is marked. It is
        published only after every message of this one is acknowledged, so per-record order
        holds; after a failure it is dropped and read again.
        """
        if not self._nats.is_connected:
            raise PublishFailed("NATS is not connected")
        batch = self._settings.OUTBOX_RELAY_BATCH_SIZE
        messages = ahead
        if messages is None:
            messages = self._messages(await connection.fetch(_FETCH, batch))
        if not messages:
            return 0, False, None
        if not self._stream_ready:
            await self._ensure_stream()
        if not self._inbox:  # the client subscribes again by itself after a reconnect
            inbox = self._nats.new_inbox()
            await self._nats.subscribe(f"{inbox}.*", cb=self._on_ack)
            self._inbox = inbox
        more = len(messages) == batch
        reading = (
            asyncio.create_task(self._read_ahead(connection, batch, messages)) if more else None
        )
        acknowledged: list[int] = []
        failure: PublishFailed | None = None
        try:
            for wave in waves(messages):
                done, failed = await self._publish_wave(wave)
                acknowledged.extend(done)
                if failed:
                    failure = PublishFailed(failed)
                    break
        finally:
            following = await reading if reading is not None else None
        if acknowledged:
            await connection.execute(_MARK, acknowledged)
        if failure is not None:
            if acknowledged:
                self._metrics.published.inc(len(acknowledged))
            raise failure
        return len(acknowledged), more, following

    def _messages(self, rows: list[Any]) -> list[Message]:
        max_payload = self._nats.max_payload
        return [message_of(OutboxRow.of(tuple(row)), max_payload) for row in rows]

    async def _read_ahead(
        self, connection: Any, batch: int, in_flight: list[Message]
    ) -> list[Message]:
        rows = await connection.fetch(_FETCH_AHEAD, batch, [m.sequence for m in in_flight])
        return self._messages(rows)

    async def _publish_wave(self, wave: list[Message]) -> tuple[list[int], str]:
        """Sequences acknowledged, and why the others were not ("" when all were)."""
        self._waves += 1
        pending = _Wave(self._waves)
        self._wave = pending
        try:
            for index, message in enumerate(wave):
                span, headers = _publish_span(message)
                token = f"{pending.prefix}{index}"
                pending.waiting[token] = (message, span)
                try:
                    await self._nats.publish(
                        message.subject,
                        message.payload,
                        reply=f"{self._inbox}.{token}",
                        headers=headers,
                    )
                except Exception as exc:  # any client error: retry the rest later
                    del pending.waiting[token]
                    error = f"publish: {type(exc).__name__}: {exc}"
                    _end_span(span, error)
                    pending.error = error
                    break
            pending.seal()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    pending.complete.wait(), self._settings.OUTBOX_PUBLISH_TIMEOUT
                )
            pending.abandon("no acknowledgement in time")
        finally:
            self._wave = None
        if pending.stream_missing:
            self._stream_ready = False  # the stream is gone: create it again
        return pending.acknowledged, pending.error

    async def _ensure_stream(self) -> None:
        try:
            await ensure_record_stream(
                self._js,
                max_age=float(self._settings.RECORD_STREAM_MAX_AGE),
                max_bytes=self._settings.RECORD_STREAM_MAX_BYTES,
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
        pending, lag = await connection.fetchrow(_BACKLOG)
        self._metrics.outbox_pending.set(pending)
        self._metrics.relay_lag.set(float(lag))
        if now >= self._next_prune:
            self._next_prune = now + _PRUNE_SECONDS
            retention = float(self._settings.OUTBOX_RETENTION)
            while True:
                status = await connection.execute(_PRUNE, _PRUNE_CHUNK, retention)
                deleted = int(status.split()[-1])
                if deleted:
                    self._metrics.pruned.inc(deleted)
                if deleted < _PRUNE_CHUNK:
                    break


def _publish_span(message: Message) -> tuple[trace.Span, dict[str, str]]:
    """A producer span continuing the trace of the write that made the row (stored with it),
    and the message headers carrying that span's context onward. Rows written outside any
    trace are published without a span rather than starting a trace each; so are rows of a
    trace nothing here would record (the message carries the write's context unchanged)."""
    headers = dict(message.headers)
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
        inject_headers(headers)
    return span, headers


def _end_span(span: trace.Span, error: str) -> None:
    if error:
        span.set_status(trace.Status(trace.StatusCode.ERROR, error))
    span.end()
