"""Repairs drift between committed definitions and the schema records applied.

Drift happens when metadata dies between records' DDL and its own commit (or a migrate call ends
ambiguously). The reconciler compares each workspace's committed version with records' applied
version and, where they differ, re-applies the committed definitions under a new version (the
same change protocol, so the repair is itself atomic and announced).

Idle cost does not grow with the number of workspaces: records announces every schema version
it applies (`crm.metadata.<id>.applied`), and each tick checks only the workspaces announced
since the last tick, the suspects of failed migrations, and a bounded repair sweep of the next
`batch` workspaces in id order (round robin, for announcements lost while NATS was down).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from crm.events.v1 import events_pb2
from crm.records.v1 import records_pb2, records_pb2_grpc
from crmkit.messaging import METADATA_SUBJECT_PREFIX
from metadata import store
from metadata.changes import ChangeRunner, NothingToDo
from metadata.definitions import Definitions

log = logging.getLogger("metadata.reconciler")
_PAGE = 500
_FIRST = "00000000-0000-0000-0000-000000000000"


class Reconciler:
    def __init__(
        self,
        pool: Any,
        records: records_pb2_grpc.RecordsServiceStub,
        changes: ChangeRunner,
        interval: float,
        batch: int,
    ) -> None:
        self._pool = pool
        self._records = records
        self._changes = changes
        self._interval = interval
        self._batch = batch
        self._announced: set[str] = set()  # workspaces records applied a schema to since a tick
        self._sweep_after = _FIRST  # where the round-robin repair sweep continues

    async def listen(self, nats: NatsClient) -> None:
        """Collect the workspaces records announces applied schema versions for."""

        async def on_applied(message: Msg) -> None:
            try:
                applied = events_pb2.MetadataChanged.FromString(message.data)
            except Exception:  # a malformed announcement must not stop the listener
                log.warning("ignored malformed schema announcement")
                return
            self.note_applied(applied.workspace_id)

        await nats.subscribe(f"{METADATA_SUBJECT_PREFIX}.*.applied", cb=on_applied)

    def note_applied(self, workspace_id: str) -> None:
        """Records applied a schema to this workspace: check it at the next tick."""
        if workspace_id:
            self._announced.add(workspace_id)

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
        """(checked, repaired) over one workspace or all of them (the Reconcile RPC)."""
        if workspace_id:
            return 1, int(await self.reconcile(workspace_id))
        checked = repaired = 0
        after = _FIRST
        while True:
            rows = await self._workspaces_after(after, _PAGE)
            for row in rows:
                checked += 1
                repaired += int(await self._try(row))
            if len(rows) < _PAGE:
                return checked, repaired
            after = rows[-1]

    async def _workspaces_after(self, after: str, limit: int) -> list[str]:
        async with self._pool.acquire() as connection:
            rows = await connection.fetch(
                "SELECT workspace_id::text FROM metadata.workspaces WHERE workspace_id > $1 "
                "ORDER BY workspace_id LIMIT $2",
                after,
                limit,
            )
        return [row[0] for row in rows]

    async def _try(self, workspace_id: str) -> bool:
        try:
            return await self.reconcile(workspace_id)
        except Exception as exc:  # keep going over the others
            log.warning("reconcile failed", extra={"workspace_id": workspace_id, "error": str(exc)})
            return False

    async def tick(self) -> int:
        """One bounded pass: announced workspaces, then the next `batch` of the sweep.

        Returns how many workspaces were checked (at most the announced ones plus `batch`).
        """
        announced, self._announced = self._announced, set()
        for workspace_id in announced:
            await self._try(workspace_id)
        swept = await self._workspaces_after(self._sweep_after, self._batch)
        self._sweep_after = swept[-1] if len(swept) == self._batch else _FIRST
        for workspace_id in swept:
            if workspace_id not in announced:
                await self._try(workspace_id)
        return len(announced | set(swept))

    async def run_forever(self) -> None:
        """Background task: a bounded pass every interval; suspects as soon as they appear."""
        while True:
            try:
                await self.tick()
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
