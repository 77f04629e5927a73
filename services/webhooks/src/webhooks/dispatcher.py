"""The sending half of the deliverer: claims due deliveries, attempts them, records outcomes.

Claims use `FOR UPDATE SKIP LOCKED` and a lease: a claim moves `next_attempt_at` to the end of
its lease and stamps the rows with its lease id, so replicas never claim the same delivery
while its attempt may still be running; if a process dies mid-attempt, the lease runs out and
the delivery is due again (at least once). Outcomes are written only by the lease holder.

The intake claims the deliveries it queues in the same statement (`claiming` gives it the room
left and a lease; `adopt` starts them), so a fresh event costs no claim round trip; rows beyond
the room are queued due, for the claims below.

Concurrency is bounded twice: WEBHOOK_MAX_CONCURRENCY attempts in the process, and
WEBHOOK_MAX_CONCURRENCY_PER_TARGET (P) per target (scheme://host:port). To spare a database
round trip per attempt, a target may hold up to 2P claimed deliveries: P running and P queued in
the process; it is claimed for again once it is down to P. A claim asks only for targets with
room, so a slow or dead endpoint holds at most its own 2P rows and P running slots while the
others' deliveries keep flowing; every attempt ends within WEBHOOK_TIMEOUT, and each row's lease
covers the attempts queued before it (ceil(position / P) timeouts, plus a margin).

Outcomes are written in batches: a delivery succeeds on a 2xx, otherwise the next retry is
scheduled after WEBHOOK_RETRY_DELAYS[attempt - 1], and after the last one it fails.

Each attempt is a span in the trace of the change that caused the event (its context is stored
with the event); the request carries the trace on in `traceparent`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg
import orjson
from opentelemetry import trace
from opentelemetry.context import Context

from crmkit.db import retry_while_unavailable
from crmkit.http_send import HttpAttempt
from crmkit.retries import next_step, wait_until_due
from crmkit.telemetry import extract_context, span_recordable
from webhooks.metrics import WebhooksMetrics
from webhooks.payload import EventPayload, PayloadTooLarge, build_body
from webhooks.sealing import SecretBox, SecretUnavailable
from webhooks.sender import Sender
from webhooks.settings import WebhooksSettings

log = logging.getLogger("webhooks.dispatcher")
_tracer = trace.get_tracer("webhooks.dispatcher")

_LEASE_MARGIN_SECONDS = 10.0
_MAX_IDLE_SECONDS = 1.0
_CANDIDATE_FACTOR = 2  # rows scanned per row claimed, so busy targets do not starve the claim
_FLUSH_BATCH = 500
# Outcomes wait this long for company before they are written: at 100 deliveries/s, one
# statement per few deliveries instead of one each. Nothing waits on them but the delivery log.
_FLUSH_LINGER_SECONDS = 0.05
_GAUGE_SECONDS = 5.0
_PRUNE_SECONDS = 600.0
_PRUNE_CHUNK = 1000

# Candidates are read without locks and only the chosen rows are locked (SKIP LOCKED) and
# rechecked: locking every candidate wrote a lock to rows that were not taken, most of them when
# one busy target fills the due queue.
_CLAIM = """
WITH room AS (
    SELECT * FROM unnest($2::text[], $3::int[]) AS r(origin, claimed)
), candidates AS (
    SELECT d.id, d.next_attempt_at, w.target_origin
    FROM webhooks.deliveries d JOIN webhooks.webhooks w ON w.id = d.webhook_id
    WHERE d.status = 'pending' AND d.next_attempt_at <= now() AND w.is_active
      AND NOT (w.target_origin = ANY($4::text[]))
    ORDER BY d.next_attempt_at
    LIMIT $5
), ranked AS (
    SELECT c.id, c.next_attempt_at,
           coalesce(r.claimed, 0)
             + row_number() OVER (PARTITION BY c.target_origin
                                  ORDER BY c.next_attempt_at, c.id) AS position
    FROM candidates c LEFT JOIN room r ON r.origin = c.target_origin
), chosen AS (
    SELECT id, next_attempt_at AS due,
           ceil(position::float8 / $6) * $7 + $8 AS lease_seconds
    FROM ranked WHERE position <= 2 * $6 ORDER BY next_attempt_at LIMIT $1
), locked AS (
    SELECT d.id FROM webhooks.deliveries d
    WHERE d.id = ANY(ARRAY(SELECT id FROM chosen)) AND d.status = 'pending'
      AND d.next_attempt_at <= now()
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE webhooks.deliveries d
    SET next_attempt_at = now() + make_interval(secs => chosen.lease_seconds), lease = $9
    FROM chosen, locked, webhooks.webhooks w, webhooks.events e
    WHERE d.id = chosen.id AND locked.id = d.id AND w.id = d.webhook_id AND e.id = d.event_id
    RETURNING d.id::text, d.workspace_id::text, d.webhook_id::text, d.event_id::text,
              d.operation, d.attempts, w.target_url, w.target_origin, w.secret_sealed,
              e.record::text AS record, e.previous_record::text AS previous_record,
              e.occurred_at, e.trace_context::text AS trace_context, chosen.due
)
SELECT * FROM claimed ORDER BY due
"""

_RECORD = """
WITH results AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::timestamptz[], $5::int[],
                         $6::int[], $7::text[], $8::float8[])
        AS r(id, lease, outcome, attempted_at, status_code, latency_ms, error, retry_in)
), updated AS (
    UPDATE webhooks.deliveries d
    SET attempts = d.attempts + 1,
        status = CASE r.outcome WHEN 'retry' THEN 'pending' ELSE r.outcome END,
        next_attempt_at = CASE WHEN r.outcome = 'retry'
                               THEN now() + make_interval(secs => r.retry_in) END,
        lease = NULL,
        last_status_code = r.status_code,
        last_error = r.error,
        finished_at = CASE WHEN r.outcome <> 'retry' THEN now() END,
        updated_at = clock_timestamp()
    FROM results r
    WHERE d.id = r.id AND d.lease = r.lease
    RETURNING d.id, d.attempts
)
INSERT INTO webhooks.delivery_attempts (delivery_id, attempt, attempted_at, status_code,
                                        latency_ms, error)
SELECT u.id, u.attempts, r.attempted_at, r.status_code, r.latency_ms, r.error
FROM updated u JOIN results r ON r.id = u.id
ON CONFLICT DO NOTHING
"""

_NEXT_DUE = "SELECT min(next_attempt_at) FROM webhooks.deliveries WHERE status = 'pending'"
_PENDING = "SELECT count(*) FROM webhooks.deliveries WHERE status = 'pending'"
# Events (with their deliveries, by cascade) past the retention and no longer needed.
_PRUNE = """
DELETE FROM webhooks.events e
WHERE e.id IN (SELECT id FROM webhooks.events WHERE received_at < now() - make_interval(secs => $1)
               ORDER BY received_at LIMIT $2)
  AND NOT EXISTS (SELECT 1 FROM webhooks.deliveries d
                  WHERE d.event_id = e.id AND d.status = 'pending')
"""


@dataclass(frozen=True)
class Claimed:
    id: str
    workspace_id: str
    webhook_id: str
    event_id: str
    operation: str
    attempts: int  # before this attempt
    target_url: str
    target_origin: str
    secret_sealed: bytes
    record: str | None
    previous_record: str | None
    occurred_at: datetime
    trace_context: str  # JSON object of W3C trace headers stored with the event
    lease: uuid.UUID


@dataclass(frozen=True)
class Room:
    """What a claim may take: `total` rows in all, each target up to 2 x `per_target` counting
    the `held` ones, each row leased by `lease` for `ceil(position / per_target) x timeout +
    margin` seconds (position in its target's queue)."""

    lease: uuid.UUID
    total: int
    held: dict[str, int]
    per_target: int
    timeout: float
    margin: float


@dataclass(frozen=True)
class Outcome:
    delivery: Claimed
    result: HttpAttempt
    outcome: str  # delivered, retry, failed
    retry_in: float


class Dispatcher:
    def __init__(
        self,
        settings: WebhooksSettings,
        pool: asyncpg.Pool,
        sender: Sender,
        box: SecretBox,
        metrics: WebhooksMetrics,
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._sender = sender
        self._box = box
        self._metrics = metrics
        self._delays = settings.retry_delays
        self._per_target = settings.WEBHOOK_MAX_CONCURRENCY_PER_TARGET
        self._max_claimed = 2 * settings.WEBHOOK_MAX_CONCURRENCY
        self._running = asyncio.Semaphore(settings.WEBHOOK_MAX_CONCURRENCY)
        self._wake = asyncio.Event()
        self._claimed: Counter[str] = Counter()  # target -> claimed, running or queued
        self._target_slots: dict[str, asyncio.Semaphore] = {}
        self._drained: dict[str, bool] = {}  # target -> its last claim took every due row
        self._tasks: set[asyncio.Task[None]] = set()
        self._claiming = asyncio.Lock()  # one claim (or intake adoption) at a time
        self._outcomes: asyncio.Queue[Outcome] = asyncio.Queue()
        self._next_gauge = 0.0
        self._next_prune = 0.0

    def wake(self) -> None:
        self._wake.set()

    @asynccontextmanager
    async def claiming(self) -> AsyncIterator[Room]:
        """The room for rows claimed while this is held (the intake's, see `adopt`); claims of
        this process wait meanwhile so the room is not given twice."""
        async with self._claiming:
            yield self._room()

    def adopt(self, claimed: list[Claimed], left_due: set[str]) -> None:
        """Starts deliveries the intake queued and leased with the room of `claiming`.
        `left_due`: targets of rows it queued due instead (no room): claimed once there is."""
        for delivery in claimed:
            self._start(delivery)
        for target in {delivery.target_origin for delivery in claimed} | left_due:
            # Nothing else due known for a target all of whose new rows were taken (the idle
            # rounds, at most a second apart, find rows others left due).
            self._drained[target] = target not in left_due and self._drained.get(target, True)
        if left_due:
            self._wake.set()

    def _room(self) -> Room:
        return Room(
            lease=uuid.uuid4(),
            total=self._max_claimed - sum(self._claimed.values()),
            held=dict(self._claimed),
            per_target=self._per_target,
            timeout=self._settings.WEBHOOK_TIMEOUT,
            margin=_LEASE_MARGIN_SECONDS,
        )

    async def run(self) -> None:
        writer = asyncio.create_task(self._write_outcomes(), name="webhook-outcomes")
        try:
            while True:
                await retry_while_unavailable(self._round, "dispatch round failed", log)
        finally:
            writer.cancel()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(writer, *self._tasks, return_exceptions=True)

    async def _round(self) -> None:
        self._wake.clear()
        await self._housekeeping()
        async with self.claiming() as space:
            room = space.total
            claimed = await self._claim(space) if room > 0 else []
            self._note_drained(space.held, claimed, room)
            for delivery in claimed:
                self._start(delivery)
        if claimed and len(claimed) == room:
            return  # maybe more due: go again once claims drain (an attempt ending wakes us)
        # Sleep until the next retry falls due. Rows already due but not claimed wait for a
        # busy target or another replica's lease: attempts ending or new rows wake us.
        due = await self._pool.fetchval(_NEXT_DUE) if room > 0 else None
        await wait_until_due(self._wake, due, _MAX_IDLE_SECONDS)

    async def _claim(self, room: Room) -> list[Claimed]:
        # A target with more than P claimed still has a full wave queued: skip it this time.
        busy = [target for target, count in room.held.items() if count > room.per_target]
        rows = await self._pool.fetch(
            _CLAIM,
            room.total,
            list(room.held),
            list(room.held.values()),
            busy,
            room.total * _CANDIDATE_FACTOR,
            room.per_target,
            room.timeout,
            room.margin,
            room.lease,
        )
        return [Claimed(*tuple(row)[:-1], lease=room.lease) for row in rows]  # type: ignore[misc]

    def _note_drained(self, held: dict[str, int], claimed: list[Claimed], room: int) -> None:
        """Remember the targets that had no more due rows than this claim took."""
        if len(claimed) == room:
            self._drained.clear()  # the claim stopped at the process limit: more may be due
            return
        got = Counter(delivery.target_origin for delivery in claimed)
        for target in set(held) | set(got):
            if held.get(target, 0) > self._per_target:
                continue  # skipped by this claim: nothing learnt
            self._drained[target] = got[target] < 2 * self._per_target - held.get(target, 0)

    def _start(self, delivery: Claimed) -> None:
        target = delivery.target_origin
        self._claimed[target] += 1
        if target not in self._target_slots:
            self._target_slots[target] = asyncio.Semaphore(self._per_target)
        task = asyncio.create_task(self._queued_attempt(delivery))
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._finished(delivery, done))

    async def _queued_attempt(self, delivery: Claimed) -> None:
        async with self._target_slots[delivery.target_origin], self._running:
            self._metrics.in_flight.inc()
            try:
                with _delivery_span(delivery):
                    await self._attempt(delivery)
            finally:
                self._metrics.in_flight.dec()

    def _finished(self, delivery: Claimed, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        target = delivery.target_origin
        self._claimed[target] -= 1
        left = self._claimed[target]
        if left <= 0:
            del self._claimed[target]
            del self._target_slots[target]
        # Claim again once this target is down to one wave, unless its last claim found no more
        # due rows (new rows wake us themselves), or when the process limit frees up.
        if (left <= self._per_target and not self._drained.get(target, False)) or sum(
            self._claimed.values()
        ) == self._max_claimed - 1:
            self._wake.set()
        if left <= 0:
            self._drained.pop(target, None)

    async def _attempt(self, delivery: Claimed) -> None:
        try:
            body = build_body(
                EventPayload(
                    event_id=delivery.event_id,
                    workspace_id=delivery.workspace_id,
                    webhook_id=delivery.webhook_id,
                    operation=delivery.operation,
                    occurred_at=delivery.occurred_at,
                    record=delivery.record,
                    previous_record=delivery.previous_record,
                )
            )
            secret = self._box.open(delivery.webhook_id, delivery.secret_sealed)
        except (PayloadTooLarge, SecretUnavailable) as exc:
            # Nothing can be sent, now or later: fail at once, saying why.
            now = datetime.now(UTC)
            result = HttpAttempt(False, None, "", 0, str(exc), now)
            self._outcomes.put_nowait(Outcome(delivery, result, "failed", 0.0))
            return
        result = await self._sender.send(delivery.workspace_id, delivery.target_url, secret, body)
        self._outcomes.put_nowait(self._judge(delivery, result))

    def _judge(self, delivery: Claimed, result: HttpAttempt) -> Outcome:
        self._metrics.attempt_duration.observe(result.latency_ms / 1000)
        if result.ok:
            self._metrics.event_to_delivery.observe(
                max((datetime.now(UTC) - delivery.occurred_at).total_seconds(), 0.0)
            )
        outcome, retry_in = next_step(
            delivery.attempts + 1, result.ok, self._delays, success="delivered"
        )
        if outcome != "delivered":
            log.info(
                "delivery attempt failed",
                extra={
                    "delivery_id": delivery.id,
                    "webhook_id": delivery.webhook_id,
                    "attempt": delivery.attempts + 1,
                    "status_code": result.status_code,
                    "latency_ms": result.latency_ms,
                    "error": result.error,
                    "next": f"retry in {retry_in:g} s" if outcome == "retry" else "failed",
                },
            )
        return Outcome(delivery, result, outcome, retry_in)

    async def _write_outcomes(self) -> None:
        while True:
            batch = [await self._outcomes.get()]
            if self._outcomes.qsize() < _FLUSH_BATCH:
                await asyncio.sleep(_FLUSH_LINGER_SECONDS)
            while len(batch) < _FLUSH_BATCH and not self._outcomes.empty():
                batch.append(self._outcomes.get_nowait())
            # The leases outlive the retries; if the process dies first the attempts repeat.
            await retry_while_unavailable(
                functools.partial(self._record, batch), "cannot record delivery outcomes", log
            )
            for item in batch:
                self._metrics.attempts.labels(item.outcome).inc()

    async def _record(self, batch: list[Outcome]) -> None:
        await self._pool.execute(
            _RECORD,
            [item.delivery.id for item in batch],
            [item.delivery.lease for item in batch],
            [item.outcome for item in batch],
            [item.result.attempted_at for item in batch],
            [item.result.status_code for item in batch],
            [item.result.latency_ms for item in batch],
            [item.result.error for item in batch],
            [item.retry_in for item in batch],
        )

    async def _housekeeping(self) -> None:
        now = time.monotonic()
        if now >= self._next_gauge:
            self._next_gauge = now + _GAUGE_SECONDS
            self._metrics.pending.set(await self._pool.fetchval(_PENDING))
        if now >= self._next_prune:
            self._next_prune = now + _PRUNE_SECONDS
            retention = float(self._settings.WEBHOOK_DELIVERY_RETENTION)
            while True:
                status = await self._pool.execute(_PRUNE, retention, _PRUNE_CHUNK)
                if int(status.split()[-1]) < _PRUNE_CHUNK:
                    break


def _delivery_span(delivery: Claimed) -> AbstractContextManager[trace.Span]:
    """The span of one attempt, in the trace of the change that caused the event; the HTTP
    request below it is a client span of its own (crmkit.outbound) carrying `traceparent`."""
    parent = _stored_context(delivery.trace_context)
    if not span_recordable(parent):  # its trace id still reaches logs and the traceparent sent
        return trace.use_span(trace.get_current_span(parent), end_on_exit=False)
    return _tracer.start_as_current_span(
        "webhook delivery",
        context=parent,
        attributes={
            "crm.webhook.id": delivery.webhook_id,
            "crm.webhook.delivery.id": delivery.id,
            "crm.webhook.attempt": delivery.attempts + 1,
            "crm.event.id": delivery.event_id,
        },
    )


def _stored_context(raw: str) -> Context:
    """The trace context stored with an event (an empty one when it arrived without)."""
    try:
        headers = orjson.loads(raw or "{}")
    except orjson.JSONDecodeError:
        headers = {}
    if not isinstance(headers, dict):
        headers = {}
    return extract_context({k: v for k, v in headers.items() if isinstance(v, str)})
