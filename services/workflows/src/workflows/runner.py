"""The sending half of the runner: claims due runs, attempts them, records outcomes.

A claim marks runs `running` with a lease (`next_attempt_at` moved to the lease's end, a lease
id stamped) under `FOR UPDATE SKIP LOCKED`, so replicas never attempt the same run at once. If
a process dies mid-attempt, the lease runs out and the run is claimed again (at least once:
nothing is lost, an attempt may repeat). Outcomes are written only by the lease holder: success
on a 2xx; otherwise the run goes back to `queued` until the next retry
(WORKFLOW_RETRY_DELAYS[attempt - 1]), and after the last one it fails. A run whose templates
cannot be filled fails at once (a retry would fail the same way), and so does a run that reads
records its workflow's author may no longer read (crmkit.authors: the author's current access,
cached a few seconds; the run's error says why).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from crmkit.authors import Author, AuthorAccess, AuthorUnavailable
from crmkit.db import retry_while_unavailable
from crmkit.retries import next_step, wait_until_due
from workflows.execution import Action, Executor, Report, failed_report
from workflows.metrics import WorkflowsMetrics
from workflows.settings import WorkflowsSettings

log = logging.getLogger("workflows.runner")

_LEASE_MARGIN_SECONDS = 10.0
_MAX_IDLE_SECONDS = 1.0
_PRUNE_SECONDS = 600.0
_PRUNE_CHUNK = 1000

_CLAIM = """
WITH due AS (
    SELECT id FROM workflows.runs
    WHERE status IN ('queued', 'running') AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE workflows.runs r
SET status = 'running', lease = $2, next_attempt_at = now() + make_interval(secs => $3),
    started_at = coalesce(r.started_at, now()), updated_at = clock_timestamp()
FROM due, workflows.workflows w
WHERE r.id = due.id AND w.id = r.workflow_id
RETURNING r.id::text, r.workspace_id::text, r.workflow_id::text, r.attempts, r.trigger_event,
          r.trace_context, r.created_at, w.name, w.trigger_type, w.object, w.method, w.url,
          w.headers, w.body, w.secret_params, w.secrets, w.author_user_id::text,
          w.author_api_key_id::text, w.read_objects
"""

# Outcome of an attempt, written by the lease holder only (test runs hold none: NULL).
_RECORD = """
UPDATE workflows.runs
SET attempts = attempts + 1,
    status = CASE $3::text WHEN 'retry' THEN 'queued' ELSE $3::text END,
    next_attempt_at = CASE WHEN $3::text = 'retry' THEN now() + make_interval(secs => $4) END,
    lease = NULL,
    request_method = coalesce($5, request_method),
    request_url = coalesce($6, request_url),
    request_headers = coalesce($7::jsonb, request_headers),
    request_body = coalesce($8, request_body),
    response_status = $9,
    response_excerpt = $10,
    duration_ms = $11,
    error = $12,
    finished_at = CASE WHEN $3::text <> 'retry' THEN now() END,
    updated_at = clock_timestamp()
WHERE id = $1 AND lease IS NOT DISTINCT FROM $2::uuid
"""

_NEXT_DUE = "SELECT min(next_attempt_at) FROM workflows.runs WHERE status IN ('queued', 'running')"
# A test run is attempted by the API process that made it; if that process died mid-attempt the
# run would stay running: it fails, saying so, once no attempt can still be going on.
_INTERRUPTED_TESTS = """
UPDATE workflows.runs
SET status = 'failed', error = 'interrupted: the test was not finished', finished_at = now(),
    updated_at = clock_timestamp()
WHERE is_test AND status = 'running' AND started_at < now() - make_interval(secs => $1)
"""
_PRUNE = """
DELETE FROM workflows.runs
WHERE id IN (SELECT id FROM workflows.runs
             WHERE finished_at < now() - make_interval(secs => $1)
             ORDER BY finished_at LIMIT $2)
"""


@dataclass(frozen=True)
class Claimed:
    id: str
    workspace_id: str
    attempts: int  # before this attempt
    trigger_event: dict[str, Any]
    trace_context: dict[str, str]
    created_at: datetime
    action: Action
    lease: uuid.UUID
    author: Author
    read_objects: tuple[str, ...]  # what the run reads records of (none: scheduled)


async def record_outcome(
    connection: asyncpg.Pool,
    run_id: str,
    lease: uuid.UUID | None,
    outcome: str,
    retry_in: float,
    report: Report,
) -> None:
    """Write an attempt's outcome (`lease` None: a test run, which holds no lease)."""
    request = report.request
    result = report.attempt
    await connection.execute(
        _RECORD,
        run_id,
        lease,
        outcome,
        retry_in,
        request.method if request else None,
        request.url if request else None,
        request.headers if request else None,
        request.body if request else None,
        result.status_code,
        result.excerpt,
        result.latency_ms if request else None,
        result.error,
    )


class Runner:
    def __init__(
        self,
        settings: WorkflowsSettings,
        pool: asyncpg.Pool,
        executor: Executor,
        metrics: WorkflowsMetrics,
        authors: AuthorAccess,
    ) -> None:
        self._settings = settings
        self._authors = authors
        self._pool = pool
        self._executor = executor
        self._metrics = metrics
        self._delays = settings.retry_delays
        self._limit = settings.WORKFLOW_MAX_CONCURRENCY
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._next_prune = 0.0

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        try:
            while True:
                await retry_while_unavailable(self._round, "runner round failed", log)
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _round(self) -> None:
        self._wake.clear()
        await self._prune()
        room = self._limit - len(self._tasks)
        claimed = await self._claim(room) if room > 0 else []
        for run in claimed:
            task = asyncio.create_task(self._attempt(run))
            self._tasks.add(task)
            task.add_done_callback(self._finished)
        if claimed and len(claimed) == room:
            return  # maybe more due: claim again as soon as a slot frees (it wakes us)
        due = await self._pool.fetchval(_NEXT_DUE) if room > 0 else None
        await wait_until_due(self._wake, due, _MAX_IDLE_SECONDS)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._wake.set()

    async def _claim(self, limit: int) -> list[Claimed]:
        lease = uuid.uuid4()
        rows = await self._pool.fetch(
            _CLAIM, limit, lease, self._settings.WORKFLOW_TIMEOUT + _LEASE_MARGIN_SECONDS
        )
        return [
            Claimed(
                id=row["id"],
                workspace_id=row["workspace_id"],
                attempts=row["attempts"],
                trigger_event=row["trigger_event"],
                trace_context=row["trace_context"] or {},
                created_at=row["created_at"],
                action=Action.of(dict(row)),
                lease=lease,
                author=Author(row["author_user_id"], row["author_api_key_id"]),
                read_objects=tuple(row["read_objects"]),
            )
            for row in rows
        ]

    async def _attempt(self, run: Claimed) -> None:
        self._metrics.in_flight.inc()
        try:
            if run.attempts == 0:
                occurred = run.trigger_event.get("occurredAt") or run.trigger_event.get(
                    "scheduledAt"
                )
                started = _instant(occurred) or run.created_at
                self._metrics.trigger_to_request.observe(
                    max((datetime.now(UTC) - started).total_seconds(), 0.0)
                )
            report = await self._refused(run) or await self._executor.attempt(
                run_id=run.id,
                workspace_id=run.workspace_id,
                action=run.action,
                trigger_event=run.trigger_event,
                trace_context=run.trace_context,
            )
        finally:
            self._metrics.in_flight.dec()
        if report.permanent:
            outcome, retry_in = "failed", 0.0
        else:
            outcome, retry_in = next_step(run.attempts + 1, report.attempt.ok, self._delays)
        if outcome != "succeeded":
            log.info(
                "workflow run attempt failed",
                extra={
                    "run_id": run.id,
                    "workflow_id": run.action.workflow_id,
                    "attempt": run.attempts + 1,
                    "status_code": report.attempt.status_code,
                    "error": report.attempt.error,
                    "next": f"retry in {retry_in:g} s" if outcome == "retry" else "failed",
                },
            )
        # The lease outlives the retries; if the process dies first the attempt repeats.
        await retry_while_unavailable(
            lambda: record_outcome(self._pool, run.id, run.lease, outcome, retry_in, report),
            "cannot record a run's outcome",
            log,
        )
        self._metrics.runs.labels(outcome).inc()

    async def _refused(self, run: Claimed) -> Report | None:
        """A failed attempt when the run reads records its author may no longer read (nothing
        is read or sent; a retry cannot help), or when identity cannot be asked (retried)."""
        if not run.read_objects:
            return None
        try:
            refusal = await self._authors.refusal(run.workspace_id, run.author, run.read_objects)
        except AuthorUnavailable as exc:
            return failed_report(str(exc), permanent=False)
        return None if refusal is None else failed_report(refusal, permanent=True)

    async def _prune(self) -> None:
        now = time.monotonic()
        if now < self._next_prune:
            return
        self._next_prune = now + _PRUNE_SECONDS
        await self._pool.execute(
            _INTERRUPTED_TESTS, self._settings.WORKFLOW_TIMEOUT + _LEASE_MARGIN_SECONDS
        )
        retention = float(self._settings.WORKFLOW_RUN_RETENTION)
        while True:
            status = await self._pool.execute(_PRUNE, retention, _PRUNE_CHUNK)
            if int(status.split()[-1]) < _PRUNE_CHUNK:
                break


def _instant(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
