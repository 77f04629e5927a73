"""Ticks of SCHEDULED workflows become queued runs, exactly once across runner replicas.

Each round takes the active scheduled workflows whose `next_run_at` has come, row-locked with
`FOR UPDATE SKIP LOCKED` in one transaction that queues the tick's run and moves `next_run_at`
to the following tick: a replica that finds a row locked skips it, and one that reads it after
the commit sees the new `next_run_at`. The run's key (`tick:<time>`) is unique per workflow as
a second guard. Ticks missed while no runner ran (or while the workflow was inactive) are not
made up: one run is queued for the latest due tick, and the schedule continues from now.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import asyncpg

from crmkit.db import retry_while_unavailable
from workflows import schedule
from workflows.metrics import WorkflowsMetrics

log = logging.getLogger("workflows.scheduler")

_MAX_IDLE_SECONDS = 1.0
_BATCH = 100

_DUE = """
SELECT id::text, workspace_id::text, name, cron, timezone, next_run_at, now() AS now
FROM workflows.workflows
WHERE status = 'active' AND trigger_type = 'scheduled' AND next_run_at <= now()
ORDER BY next_run_at
LIMIT $1
FOR UPDATE SKIP LOCKED
"""
_ADVANCE = "UPDATE workflows.workflows SET next_run_at = $2, last_run_at = now() WHERE id = $1"
_QUEUE = """
INSERT INTO workflows.runs (id, workspace_id, workflow_id, trigger_key, trigger_event,
                            next_attempt_at)
VALUES ($1, $2, $3, $4, $5, now())
ON CONFLICT (workflow_id, trigger_key) WHERE trigger_key IS NOT NULL DO NOTHING
"""
_NEXT_DUE = (
    "SELECT min(next_run_at) FROM workflows.workflows "
    "WHERE status = 'active' AND trigger_type = 'scheduled'"
)


def latest_due(cron: str, timezone: str, scheduled: datetime, now: datetime) -> datetime:
    """The last tick at or before `now`, starting from the due tick `scheduled`."""
    tick = scheduled
    while True:
        following = schedule.next_tick(cron, timezone, tick)
        if following > now:
            return tick
        tick = following


class Scheduler:
    def __init__(
        self, pool: asyncpg.Pool, metrics: WorkflowsMetrics, on_queued: Callable[[], None]
    ) -> None:
        self._pool = pool
        self._metrics = metrics
        self._on_queued = on_queued

    async def run(self) -> None:
        while True:
            queued = await retry_while_unavailable(self._round, "scheduler round failed", log)
            if queued:
                self._metrics.runs_queued.labels("scheduled").inc(queued)
                self._on_queued()
                continue
            await self._sleep()

    async def _round(self) -> int:
        queued = 0
        async with self._pool.acquire() as connection, connection.transaction():
            for row in await connection.fetch(_DUE, _BATCH):
                now: datetime = row["now"]
                try:
                    tick = latest_due(row["cron"], row["timezone"], row["next_run_at"], now)
                    following = schedule.next_tick(row["cron"], row["timezone"], now)
                except Exception as exc:  # a schedule that became invalid: stop it, say why
                    log.error("cannot compute the schedule of %s: %s", row["id"], exc)
                    await connection.execute(_ADVANCE, row["id"], None)
                    continue
                await connection.execute(_ADVANCE, row["id"], following)
                event = {
                    "type": "scheduled",
                    "scheduledAt": tick.astimezone(UTC).isoformat(),
                    "firedAt": now.astimezone(UTC).isoformat(),
                }
                status = await connection.execute(
                    _QUEUE,
                    uuid.uuid4(),
                    row["workspace_id"],
                    row["id"],
                    f"tick:{tick.astimezone(UTC).isoformat()}",
                    event,
                )
                queued += int(status.split()[-1])
        return queued

    async def _sleep(self) -> None:
        timeout = _MAX_IDLE_SECONDS
        due = await self._pool.fetchval(_NEXT_DUE)
        if due is not None:
            seconds = (due - datetime.now(UTC)).total_seconds()
            timeout = min(max(seconds, 0.01), timeout)
        await asyncio.sleep(timeout)
