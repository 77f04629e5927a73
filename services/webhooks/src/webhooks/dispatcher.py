"""The sending half of the deliverer: claims due deliveries, attempts them, records outcomes.

Claims use `FOR UPDATE SKIP LOCKED` and a lease: a claim counts the attempt (`attempts` + 1,
`claimed_at`), moves `next_attempt_at` to the end of its lease (WEBHOOK_TIMEOUT + 5 s) and
stamps the rows with this process's lease id, so replicas never claim the same delivery while
its attempt may still be running. The process renews the leases of the rows it holds longer
than half a lease, so a live deliverer keeps them however long they queue, and a dead one's are
due again within a lease of its death (at least once). A claim that takes a row whose lease ran
out logs the attempt that had no outcome (it may have reached the receiver). Outcomes are
written only by the lease holder.

The intake claims the deliveries it queues in the same statement (`claiming` gives it the room
left and the lease; `adopt` starts them), so a fresh event costs no claim round trip; rows beyond
the room are queued due, for the claims below.

First attempts and retries (any later attempt) are two kinds, claimed from two indexes and
queued apart, so a backlog of fresh deliveries never hides a due retry: the dispatcher sleeps
until the next retry (or lease end) falls due, and the process wakes it when it schedules one.
Concurrency is bounded twice: WEBHOOK_MAX_CONCURRENCY attempts in the process, and
WEBHOOK_MAX_CONCURRENCY_PER_TARGET (P) per target (scheme://host:port), whose slots go to the
two kinds in turn (`webhooks.slots`). To spare a database round trip per attempt, a target may
hold up to two waves of claimed deliveries of each kind (P running, the rest queued in the
process); it is claimed for again once it is down to one wave. A wave is the process's room of a
kind (2 x WEBHOOK_MAX_CONCURRENCY) shared among the targets holding rows of it and one more,
halved, and never less than P (`Dispatcher.wave`): one busy target is claimed for 32 rows at a
time with the defaults, seven or more busy targets P at a time, so the process's bounds (rows
held, leases, memory) stay as they are while a lone busy target costs a quarter of the claims.
A claim asks only for targets with room, so a slow or dead endpoint holds at most its own rows
and P running slots while the others' deliveries keep flowing; every attempt ends within
WEBHOOK_TIMEOUT.

Before anything is read or sent, an attempt checks that the webhook's author (who last saved it)
may still READ every record of the event's object, with the author's current access from
identity cached for a few seconds (crmkit.authors); otherwise the delivery fails at once, its
error saying why (docs/webhooks.md).

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

from crmkit.authors import Author, AuthorAccess, AuthorUnavailable
from crmkit.db import retry_while_unavailable
from crmkit.http_send import HttpAttempt
from crmkit.retries import next_step, wait_until_due
from crmkit.telemetry import extract_context, span_recordable
from webhooks.metrics import WebhooksMetrics
from webhooks.omitted import RecordReader, RecordUnavailable
from webhooks.payload import Body, EventPayload, PayloadTooLarge, build_body
from webhooks.sealing import SecretBox, SecretUnavailable
from webhooks.sender import Sender
from webhooks.settings import WebhooksSettings
from webhooks.slots import Kind, TargetSlots

log = logging.getLogger("webhooks.dispatcher")
_tracer = trace.get_tracer("webhooks.dispatcher")

_LEASE_MARGIN_SECONDS = 5.0
_RENEW_CHECK_SECONDS = 1.0
_MAX_IDLE_SECONDS = 1.0
_CANDIDATE_FACTOR = 2  # rows scanned per row claimed, so busy targets do not starve the claim
_FLUSH_BATCH = 500
# Outcomes wait this long for company before they are written: at 100 deliveries/s, one
# statement per few deliveries instead of one each. Nothing waits on them but the delivery log.
_FLUSH_LINGER_SECONDS = 0.05
_GAUGE_SECONDS = 5.0
_PRUNE_SECONDS = 600.0
_PRUNE_CHUNK = 1000
LOST_ATTEMPT = "no outcome recorded: the deliverer stopped during this attempt"

# $1..$3 what this process holds per target (first attempts, retries), $4/$5 targets with a full
# wave queued of each kind, $6/$7 rows of each kind to take, $8/$13 the wave of each kind (a
# target holds up to two), $9 lease seconds, $10 the lease, $11 the error logged for an attempt
# whose lease ran out, $12 candidates per row taken.
# Candidates are read without locks and only the chosen rows are locked (SKIP LOCKED) and
# rechecked: locking every candidate wrote a lock to rows that were not taken, most of them when
# one busy target fills the due queue.
_CLAIM = """
WITH room AS (
    SELECT * FROM unnest($1::text[], $2::int[], $3::int[]) AS r(origin, first_held, retry_held)
), candidates AS (
    (SELECT d.id, d.next_attempt_at, true AS retry, w.target_origin
     FROM webhooks.deliveries d JOIN webhooks.webhooks w ON w.id = d.webhook_id
     WHERE d.status = 'pending' AND d.attempts > 0 AND d.next_attempt_at <= now() AND w.is_active
       AND NOT (w.target_origin = ANY($5::text[])) AND d.lease IS DISTINCT FROM $10::uuid
     ORDER BY d.next_attempt_at
     LIMIT $7::int * $12::int)
    UNION ALL
    (SELECT d.id, d.next_attempt_at, false, w.target_origin
     FROM webhooks.deliveries d JOIN webhooks.webhooks w ON w.id = d.webhook_id
     WHERE d.status = 'pending' AND d.attempts = 0 AND d.next_attempt_at <= now()
       AND w.is_active AND NOT (w.target_origin = ANY($4::text[]))
     ORDER BY d.next_attempt_at
     LIMIT $6::int * $12::int)
), ranked AS (
    SELECT c.id, c.next_attempt_at, c.retry,
           CASE WHEN c.retry THEN coalesce(r.retry_held, 0) ELSE coalesce(r.first_held, 0) END
             + row_number() OVER (PARTITION BY c.target_origin, c.retry
                                  ORDER BY c.next_attempt_at, c.id) AS position
    FROM candidates c LEFT JOIN room r ON r.origin = c.target_origin
), fitting AS (
    SELECT id, next_attempt_at, retry,
           row_number() OVER (PARTITION BY retry ORDER BY next_attempt_at, id) AS taken
    FROM ranked WHERE position <= 2 * CASE WHEN retry THEN $13::int ELSE $8::int END
), chosen AS (
    SELECT id, next_attempt_at AS due FROM fitting
    WHERE taken <= CASE WHEN retry THEN $7::int ELSE $6::int END
), locked AS (
    SELECT d.id, d.lease AS old_lease, d.attempts AS old_attempts, d.claimed_at AS old_claimed_at
    FROM webhooks.deliveries d
    WHERE d.id = ANY(ARRAY(SELECT id FROM chosen)) AND d.status = 'pending'
      AND d.next_attempt_at <= now()
    FOR UPDATE SKIP LOCKED
), lost AS (
    INSERT INTO webhooks.delivery_attempts (delivery_id, attempt, attempted_at, status_code,
                                            latency_ms, error)
    SELECT id, old_attempts, coalesce(old_claimed_at, now()), NULL, 0, $11::text
    FROM locked WHERE old_lease IS NOT NULL AND old_attempts > 0
    ON CONFLICT DO NOTHING
), claimed AS (
    UPDATE webhooks.deliveries d
    SET attempts = d.attempts + 1, claimed_at = now(),
        next_attempt_at = now() + make_interval(secs => $9::float8), lease = $10::uuid
    FROM chosen, locked, webhooks.webhooks w, webhooks.events e
    WHERE d.id = chosen.id AND locked.id = d.id AND w.id = d.webhook_id AND e.id = d.event_id
    RETURNING d.id::text, d.workspace_id::text, d.webhook_id::text, d.event_id::text,
              d.operation, d.attempts, w.target_url, w.target_origin, w.secret_sealed,
              e.record::text AS record, e.previous_record::text AS previous_record,
              e.occurred_at, e.trace_context::text AS trace_context, e.object,
              e.record_id::text AS record_id, e.record_omitted, e.previous_record_omitted,
              w.author_user_id::text, w.author_api_key_id::text, chosen.due
)
SELECT * FROM claimed ORDER BY due
"""

# Outcomes of this process's attempts ($9: its lease), each for the attempt it claimed.
_RECORD = """
WITH results AS (
    SELECT * FROM unnest($1::uuid[], $2::int[], $3::text[], $4::timestamptz[], $5::int[],
                         $6::int[], $7::text[], $8::float8[])
        AS r(id, attempt, outcome, attempted_at, status_code, latency_ms, error, retry_in)
), updated AS (
    UPDATE webhooks.deliveries d
    SET status = CASE r.outcome WHEN 'retry' THEN 'pending' ELSE r.outcome END,
        next_attempt_at = CASE WHEN r.outcome = 'retry'
                               THEN now() + make_interval(secs => r.retry_in) END,
        lease = NULL,
        last_status_code = r.status_code,
        last_error = r.error,
        finished_at = CASE WHEN r.outcome <> 'retry' THEN now() END,
        updated_at = clock_timestamp()
    FROM results r
    WHERE d.id = r.id AND d.lease = $9 AND d.attempts = r.attempt
    RETURNING d.id, d.attempts
)
INSERT INTO webhooks.delivery_attempts (delivery_id, attempt, attempted_at, status_code,
                                        latency_ms, error)
SELECT u.id, u.attempts, r.attempted_at, r.status_code, r.latency_ms, r.error
FROM updated u JOIN results r ON r.id = u.id
ON CONFLICT DO NOTHING
"""

_RENEW = """
UPDATE webhooks.deliveries SET next_attempt_at = now() + make_interval(secs => $3)
WHERE id = ANY($1::uuid[]) AND lease = $2 AND status = 'pending'
"""

# Rows a stopping process claimed but never sent: given back uncounted, due at once.
_RELEASE = """
UPDATE webhooks.deliveries
SET attempts = attempts - 1, lease = NULL, claimed_at = NULL, next_attempt_at = now()
WHERE id = ANY($1::uuid[]) AND lease = $2 AND status = 'pending'
"""
_RELEASE_SECONDS = 2.0

# The next retry or lease end to fall due (first attempts are due when queued).
_NEXT_DUE = """
SELECT min(next_attempt_at) FROM webhooks.deliveries
WHERE status = 'pending' AND attempts > 0 AND next_attempt_at > now()
"""
# From the two partial indexes of pending rows: `status = 'pending'` alone matches neither, so it
# was a sequential scan of every delivery kept (WEBHOOK_DELIVERY_RETENTION: 30 days of them) every
# _GAUGE_SECONDS in each replica; 16 ms at 75,000 deliveries, 1.8 ms this way.
_PENDING = """
SELECT (SELECT count(*) FROM webhooks.deliveries WHERE status = 'pending' AND attempts = 0)
     + (SELECT count(*) FROM webhooks.deliveries WHERE status = 'pending' AND attempts > 0)
"""
# Events (with their deliveries, by cascade) past the retention and no longer needed.
_PRUNE = """
DELETE FROM webhooks.events e
WHERE e.id IN (SELECT id FROM webhooks.events WHERE received_at < now() - make_interval(secs => $1)
               ORDER BY received_at LIMIT $2)
  AND NOT EXISTS (SELECT 1 FROM webhooks.deliveries d
                  WHERE d.event_id = e.id AND d.status = 'pending')
"""


class AuthorRefused(Exception):
    """The webhook's author may no longer read the event's object (crmkit.authors)."""


@dataclass(frozen=True)
class Claimed:
    id: str
    workspace_id: str
    webhook_id: str
    event_id: str
    operation: str
    attempts: int  # counting this attempt
    target_url: str
    target_origin: str
    secret_sealed: bytes
    record: str | None
    previous_record: str | None
    occurred_at: datetime
    trace_context: str  # JSON object of W3C trace headers stored with the event
    object: str
    record_id: str
    record_omitted: bool  # left out of the event for size: read it by id
    previous_record_omitted: bool
    author_user_id: str | None  # the webhook's author, whose access each attempt checks
    author_api_key_id: str | None
    lease: uuid.UUID

    @property
    def kind(self) -> Kind:
        return Kind.FIRST if self.attempts <= 1 else Kind.RETRY

    @property
    def author(self) -> Author:
        return Author(self.author_user_id, self.author_api_key_id)


@dataclass(frozen=True)
class Room:
    """What a claim may take of one kind: `total` rows in all, each target up to 2 x `wave`
    counting the `held` ones, each row leased by `lease` for `lease_seconds`."""

    lease: uuid.UUID
    total: int
    held: dict[str, int]
    wave: int
    lease_seconds: float


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
        records: RecordReader,
        authors: AuthorAccess,
    ) -> None:
        self._settings = settings
        self._authors = authors
        self._pool = pool
        self._sender = sender
        self._box = box
        self._metrics = metrics
        self._records = records
        self._delays = settings.retry_delays
        self._per_target = settings.WEBHOOK_MAX_CONCURRENCY_PER_TARGET
        self._max_claimed = 2 * settings.WEBHOOK_MAX_CONCURRENCY  # of each kind
        self._lease = uuid.uuid4()  # this process's: outcomes and renewals are its rows only
        self._lease_seconds = settings.WEBHOOK_TIMEOUT + _LEASE_MARGIN_SECONDS
        self._running = asyncio.Semaphore(settings.WEBHOOK_MAX_CONCURRENCY)
        self._wake = asyncio.Event()
        # kind -> target -> claimed, running or queued
        self._held: dict[Kind, Counter[str]] = {kind: Counter() for kind in Kind}
        self._target_slots: dict[str, TargetSlots] = {}
        self._drained: dict[tuple[str, Kind], bool] = {}  # its last claim took every due row
        self._leased_at: dict[str, float] = {}  # delivery id -> when its lease was last set
        self._sending: set[str] = set()  # deliveries whose attempt has started
        self._tasks: set[asyncio.Task[None]] = set()
        self._claiming = asyncio.Lock()  # one claim (or intake adoption) at a time
        self._outcomes: asyncio.Queue[Outcome] = asyncio.Queue()
        self._next_gauge = 0.0
        self._next_prune = 0.0

    def wake(self) -> None:
        self._wake.set()

    @asynccontextmanager
    async def claiming(self) -> AsyncIterator[Room]:
        """The room for first attempts claimed while this is held (the intake's, see `adopt`);
        claims of this process wait meanwhile so the room is not given twice."""
        async with self._claiming:
            yield self._room(Kind.FIRST)

    def adopt(self, claimed: list[Claimed], left_due: set[str]) -> None:
        """Starts deliveries the intake queued and leased with the room of `claiming`.
        `left_due`: targets of rows it queued due instead (no room): claimed once there is."""
        for delivery in claimed:
            self._start(delivery)
        for target in {delivery.target_origin for delivery in claimed} | left_due:
            # Nothing else due known for a target all of whose new rows were taken (the idle
            # rounds, at most a second apart, find rows others left due).
            key = (target, Kind.FIRST)
            self._drained[key] = target not in left_due and self._drained.get(key, True)
        # A claim now would leave out a target with a full wave queued, after reading past every
        # due row of it (its backlog, however long): the end of its attempts wakes us instead.
        held, wave = self._held[Kind.FIRST], self.wave(Kind.FIRST)
        if any(held[target] <= wave for target in left_due):
            self._wake.set()

    def _room(self, kind: Kind) -> Room:
        held = self._held[kind]
        return Room(
            lease=self._lease,
            total=self._max_claimed - sum(held.values()),
            held=dict(held),
            wave=self.wave(kind),
            lease_seconds=self._lease_seconds,
        )

    def wave(self, kind: Kind) -> int:
        """Rows of `kind` a target is claimed for at a time (it holds up to two waves): the
        process's room shared among the targets holding rows and one more, halved; at least P."""
        targets = max(len(self._held[kind]), 1) + 1
        return max(self._per_target, self._max_claimed // (2 * targets))

    async def run(self) -> None:
        helpers = [
            asyncio.create_task(self._write_outcomes(), name="webhook-outcomes"),
            asyncio.create_task(self._renew_leases(), name="webhook-leases"),
        ]
        try:
            while True:
                await retry_while_unavailable(self._round, "dispatch round failed", log)
        finally:
            unsent = [i for i in self._leased_at if i not in self._sending]
            for task in [*helpers, *self._tasks]:
                task.cancel()
            await asyncio.gather(*helpers, *self._tasks, return_exceptions=True)
            await self._release(unsent)

    async def _release(self, unsent: list[str]) -> None:
        """On a clean stop, gives back the claimed rows not sent yet (best effort: otherwise
        their lease runs out and the log shows an attempt without outcome)."""
        if not unsent:
            return
        try:
            await asyncio.wait_for(
                self._pool.execute(_RELEASE, unsent, self._lease), _RELEASE_SECONDS
            )
        except Exception as exc:  # the database is gone too: the leases will run out
            log.warning("could not give back unsent deliveries: %s", exc)

    async def _round(self) -> None:
        self._wake.clear()
        await self._housekeeping()
        async with self._claiming:
            rooms = {kind: self._room(kind) for kind in Kind}
            claimed = await self._claim(rooms) if any(r.total > 0 for r in rooms.values()) else []
            full = self._note_drained(rooms, claimed)
            for delivery in claimed:
                self._start(delivery)
        if full:
            return  # maybe more due: go again once claims drain (an attempt ending wakes us)
        # Sleep until the next retry or lease end falls due (this process's own retries wake it
        # when written). Rows already due but not claimed wait for a busy target: attempts
        # ending or new rows wake us.
        due = await self._pool.fetchval(_NEXT_DUE) if rooms[Kind.RETRY].total > 0 else None
        await wait_until_due(self._wake, due, _MAX_IDLE_SECONDS)

    async def _claim(self, rooms: dict[Kind, Room]) -> list[Claimed]:
        first, retry = rooms[Kind.FIRST], rooms[Kind.RETRY]
        targets = sorted(set(first.held) | set(retry.held))
        rows = await self._pool.fetch(
            _CLAIM,
            targets,
            [first.held.get(target, 0) for target in targets],
            [retry.held.get(target, 0) for target in targets],
            # A target with more than a wave claimed of a kind still has a full wave of it queued.
            [target for target, count in first.held.items() if count > first.wave],
            [target for target, count in retry.held.items() if count > retry.wave],
            max(first.total, 0),
            max(retry.total, 0),
            first.wave,
            self._lease_seconds,
            self._lease,
            LOST_ATTEMPT,
            _CANDIDATE_FACTOR,
            retry.wave,
        )
        return [Claimed(*tuple(row)[:-1], lease=self._lease) for row in rows]  # type: ignore[misc]

    def _note_drained(self, rooms: dict[Kind, Room], claimed: list[Claimed]) -> bool:
        """Remember the targets that had no more due rows than this claim took; True when a
        kind's claim stopped at the process limit (more may be due)."""
        full = False
        for kind, room in rooms.items():
            if room.total <= 0:
                continue  # not claimed for: nothing learnt
            mine = [delivery for delivery in claimed if delivery.kind is kind]
            if len(mine) == room.total:
                full = True
                for key in [key for key in self._drained if key[1] is kind]:
                    del self._drained[key]
                continue
            got = Counter(delivery.target_origin for delivery in mine)
            for target in set(room.held) | set(got):
                if room.held.get(target, 0) > room.wave:
                    continue  # skipped by this claim: nothing learnt
                self._drained[(target, kind)] = got[target] < 2 * room.wave - room.held.get(
                    target, 0
                )
        return full

    def _start(self, delivery: Claimed) -> None:
        target = delivery.target_origin
        self._held[delivery.kind][target] += 1
        if target not in self._target_slots:
            self._target_slots[target] = TargetSlots(self._per_target)
        self._leased_at[delivery.id] = time.monotonic()
        task = asyncio.create_task(self._queued_attempt(delivery))
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._finished(delivery, done))

    async def _queued_attempt(self, delivery: Claimed) -> None:
        slots = self._target_slots[delivery.target_origin]
        await slots.acquire(delivery.kind)
        try:
            async with self._running:
                self._sending.add(delivery.id)
                self._metrics.in_flight.inc()
                try:
                    with _delivery_span(delivery):
                        await self._attempt(delivery)
                finally:
                    self._metrics.in_flight.dec()
        finally:
            slots.release()

    def _finished(self, delivery: Claimed, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._leased_at.pop(delivery.id, None)
        self._sending.discard(delivery.id)
        target, kind = delivery.target_origin, delivery.kind
        held = self._held[kind]
        held[target] -= 1
        left = held[target]
        if left <= 0:
            del held[target]
            if all(target not in counts for counts in self._held.values()):
                del self._target_slots[target]
        # Claim again once this target is down to one wave of the kind, unless its last claim
        # found no more due rows (new rows wake us themselves), or when the process limit frees.
        if (left <= self.wave(kind) and not self._drained.get((target, kind), False)) or sum(
            held.values()
        ) == self._max_claimed - 1:
            self._wake.set()
        if left <= 0:
            self._drained.pop((target, kind), None)

    async def _attempt(self, delivery: Claimed) -> None:
        try:
            refusal = await self._authors.refusal(
                delivery.workspace_id, delivery.author, (delivery.object,)
            )
            if refusal is not None:
                raise AuthorRefused(refusal)
            body = await self._body(delivery)
            secret = self._box.open(delivery.webhook_id, delivery.secret_sealed)
        except (AuthorRefused, PayloadTooLarge, SecretUnavailable) as exc:
            # Nothing can be sent, now or later: fail at once, saying why.
            now = datetime.now(UTC)
            result = HttpAttempt(False, None, "", 0, str(exc), now)
            self._outcomes.put_nowait(Outcome(delivery, result, "failed", 0.0))
            return
        except (AuthorUnavailable, RecordUnavailable) as exc:  # retried on the schedule
            result = HttpAttempt(False, None, "", 0, str(exc), datetime.now(UTC))
            self._outcomes.put_nowait(self._judge(delivery, result))
            return
        result = await self._sender.send(delivery.workspace_id, delivery.target_url, secret, body)
        self._outcomes.put_nowait(self._judge(delivery, result))

    async def _body(self, delivery: Claimed) -> Body:
        """The body, with a record the relay left out read again (its current state)."""
        record, left_out = delivery.record, []
        if delivery.record_omitted:
            record = await self._records.current(
                delivery.workspace_id, delivery.object, delivery.record_id
            )
            if record is None:
                left_out.append("record")  # gone since: nothing to send
        if delivery.previous_record_omitted:
            left_out.append("previousRecord")
        return build_body(
            EventPayload(
                event_id=delivery.event_id,
                workspace_id=delivery.workspace_id,
                webhook_id=delivery.webhook_id,
                operation=delivery.operation,
                occurred_at=delivery.occurred_at,
                record=record,
                previous_record=delivery.previous_record,
            ),
            left_out=tuple(left_out),
        )

    def _judge(self, delivery: Claimed, result: HttpAttempt) -> Outcome:
        self._metrics.attempt_duration.observe(result.latency_ms / 1000)
        if result.ok:
            self._metrics.event_to_delivery.observe(
                max((datetime.now(UTC) - delivery.occurred_at).total_seconds(), 0.0)
            )
        outcome, retry_in = next_step(
            delivery.attempts, result.ok, self._delays, success="delivered"
        )
        if outcome != "delivered":
            log.info(
                "delivery attempt failed",
                extra={
                    "delivery_id": delivery.id,
                    "webhook_id": delivery.webhook_id,
                    "attempt": delivery.attempts,
                    "status_code": result.status_code,
                    "latency_ms": result.latency_ms,
                    "error": result.error,
                    "next": f"retry in {retry_in:g} s" if outcome == "retry" else "failed",
                },
            )
        return Outcome(delivery, result, outcome, retry_in)

    async def _write_outcomes(self) -> None:
        loop = asyncio.get_running_loop()
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
            # Claim each retry when it falls due rather than at the next idle round.
            for delay in sorted({item.retry_in for item in batch if item.outcome == "retry"}):
                loop.call_later(delay, self._wake.set)

    async def _record(self, batch: list[Outcome]) -> None:
        await self._pool.execute(
            _RECORD,
            [item.delivery.id for item in batch],
            [item.delivery.attempts for item in batch],
            [item.outcome for item in batch],
            [item.result.attempted_at for item in batch],
            [item.result.status_code for item in batch],
            [item.result.latency_ms for item in batch],
            [item.result.error for item in batch],
            [item.retry_in for item in batch],
            self._lease,
        )

    async def _renew_leases(self) -> None:
        """Keeps the leases of the rows this process holds (queued or in flight) from running
        out: each is renewed once it is half through."""
        while True:
            await asyncio.sleep(_RENEW_CHECK_SECONDS)
            now = time.monotonic()
            due = [i for i, at in self._leased_at.items() if now - at > self._lease_seconds / 2]
            if not due:
                continue
            await retry_while_unavailable(
                functools.partial(
                    self._pool.execute, _RENEW, due, self._lease, self._lease_seconds
                ),
                "cannot renew delivery leases",
                log,
            )
            for delivery_id in due:
                if delivery_id in self._leased_at:
                    self._leased_at[delivery_id] = now

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
            "crm.webhook.attempt": delivery.attempts,
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
