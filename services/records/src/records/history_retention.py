"""Record history retention: entries older than RECORD_HISTORY_RETENTION_DAYS are deleted by a
background loop in every records replica, in small batches with bounded work per run.

Each batch is its own short transaction deleting old rows only (`FOR UPDATE SKIP LOCKED`, so
replicas never wait on each other); writes insert new rows and never touch old ones, so pruning
never blocks a write. A backlog beyond one run's bound is finished by the next runs.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from crmkit.db import DATABASE_UNAVAILABLE
from records.metrics import RecordsMetrics
from records.settings import RecordsSettings

log = logging.getLogger(__name__)

_PRUNE = (
    "DELETE FROM records.record_history WHERE id IN (SELECT id FROM records.record_history "
    "WHERE occurred_at < now() - make_interval(days => $1) LIMIT $2 FOR UPDATE SKIP LOCKED)"
)


async def prune_once(pool: Any, retention_days: int, batch: int, max_batches: int) -> int:
    """Delete up to `batch * max_batches` expired entries; the number deleted."""
    deleted = 0
    async with pool.acquire() as connection:
        for _ in range(max_batches):
            status = await connection.execute(_PRUNE, retention_days, batch)
            count = int(status.split()[-1])
            deleted += count
            if count < batch:
                break
    return deleted


async def prune_forever(pool: Any, settings: RecordsSettings, metrics: RecordsMetrics) -> None:
    """Run `prune_once` every RECORD_HISTORY_PRUNE_INTERVAL (never when retention is 0; the
    loop still runs: a background job that returns stops the service)."""
    days = settings.RECORD_HISTORY_RETENTION_DAYS
    while True:
        if days == 0:
            await asyncio.sleep(settings.RECORD_HISTORY_PRUNE_INTERVAL)
            continue
        try:
            deleted = await prune_once(
                pool,
                days,
                settings.RECORD_HISTORY_PRUNE_BATCH,
                settings.RECORD_HISTORY_PRUNE_MAX_BATCHES,
            )
            if deleted:
                metrics.history_pruned.inc(deleted)
                log.info("record history pruned", extra={"deleted": deleted})
        except DATABASE_UNAVAILABLE as exc:
            log.warning("record history pruning skipped: %s", exc)
        await asyncio.sleep(settings.RECORD_HISTORY_PRUNE_INTERVAL)
