"""Repairs drift between committed definitions and the schema records applied.

Drift happens when metadata dies between records' DDL and its own commit (or a migrate call ends
ambiguously). The reconciler compares each workspace's committed version with records' applied
version and, where they differ, re-applies the committed definitions under a new version (the
same change protocol, so the repair is itself atomic and announced).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from crm.records.v1 import records_pb2, records_pb2_grpc
from metadata import store
from metadata.changes import ChangeRunner, NothingToDo
from metadata.definitions import Definitions

log = logging.getLogger("metadata.reconciler")
_PAGE = 500


class Reconciler:
    def __init__(
        self,
        pool: Any,
        records: records_pb2_grpc.RecordsServiceStub,
        changes: ChangeRunner,
        interval: float,
    ) -> None:
        self._pool = pool
        self._records = records
        self._changes = changes
        self._interval = interval

    async def _applied(self, workspace_id: str) -> int:
        response = await self._records.GetSchemaVersion(
            records_pb2.GetSchemaVersionRequest(workspace_id=workspace_id),
            metadata=self._changes.system_metadata(workspace_id),
        )
        return int(response.applied_version)

    async def reconcile(self, workspace_id: str) -> bool:
        """Make records match the committed definitions; True when a repair was needed."""
        async with self._pool.acquire() as connection:
            committed = await store.workspace_version(connection, workspace_id)
        if committed is None or committed == 0:
            return False
        if await self._applied(workspace_id) == committed:
            return False

        async def recheck(connection: Any, defs: Definitions) -> None:
            # Under the workspace lock: a change that was in flight may have committed since.
            version = await store.workspace_version(connection, workspace_id)
            if version is not None and await self._applied(workspace_id) == version:
                raise NothingToDo

        try:
            await self._changes.run(workspace_id, recheck)
        except NothingToDo:
            return False
        self._changes.metrics.repairs.inc()
        log.info("repaired schema drift", extra={"workspace_id": workspace_id})
        return True

    async def reconcile_all(self, workspace_id: str = "") -> tuple[int, int]:
        """(checked, repaired) over one workspace or all of them."""
        if workspace_id:
            return 1, int(await self.reconcile(workspace_id))
        checked = repaired = 0
        after = "00000000-0000-0000-0000-000000000000"
        while True:
            async with self._pool.acquire() as connection:
                rows = await connection.fetch(
                    "SELECT workspace_id::text FROM metadata.workspaces WHERE workspace_id > $1 "
                    "ORDER BY workspace_id LIMIT $2",
                    after,
                    _PAGE,
                )
            for row in rows:
                checked += 1
                try:
                    repaired += int(await self.reconcile(row[0]))
                except Exception as exc:  # keep going over the others
                    log.warning(
                        "reconcile failed", extra={"workspace_id": row[0], "error": str(exc)}
                    )
            if len(rows) < _PAGE:
                return checked, repaired
            after = rows[-1][0]

    async def run_forever(self) -> None:
        """Background task: a full pass every interval; suspects as soon as they appear."""
        while True:
            try:
                await self.reconcile_all()
            except Exception:  # the loop must survive a database or records outage
                log.warning("reconcile pass failed", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changes.wake.wait(), timeout=self._interval)
            self._changes.wake.clear()
            while self._changes.suspects:
                workspace_id = self._changes.suspects.pop()
                try:
                    await self.reconcile(workspace_id)
                except Exception:
                    log.warning("reconcile failed", extra={"workspace_id": workspace_id})
                    self._changes.suspects.add(workspace_id)
                    break
