"""The change protocol: definitions and their DDL succeed or fail together.

A change runs in one metadata transaction holding the workspace row lock: it writes the new
definitions, takes a new version, asks records to migrate to the whole desired schema
(`MigrateSchema`, keyed by a fresh change id) and commits only when records answered. If records
refuses, the transaction rolls back and nothing changed. If the process dies after the DDL but
before the commit, records is ahead of the committed definitions: the reconciler notices the
version mismatch and migrates records back to what was committed, under a newer version.
After the commit the new version is announced on NATS so every cache refreshes.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from nats.aio.client import Client as NatsClient

from crm.events.v1 import events_pb2
from crm.records.v1 import records_pb2, records_pb2_grpc
from crmkit.errors import NotFound, ServiceError, Unavailable, from_rpc_error
from crmkit.messaging import metadata_subject
from crmkit.principal import PrincipalCodec, system_principal
from crmkit.telemetry import trace_context_headers
from metadata import store
from metadata.definitions import Definitions
from metadata.metrics import MetadataMetrics

log = logging.getLogger("metadata.changes")

R = TypeVar("R")
Mutation = Callable[[Any, Definitions], Awaitable[R]]


class NothingToDo(Exception):
    """Raised by a mutation that finds no change to make: the transaction rolls back quietly."""


class ChangeRunner:
    def __init__(
        self,
        pool: Any,
        records: records_pb2_grpc.RecordsServiceStub,
        principals: PrincipalCodec,
        nats: NatsClient,
        metrics: MetadataMetrics,
        *,
        migrate_timeout: float,
    ) -> None:
        self._pool = pool
        self.metrics = metrics
        self._records = records
        self._principals = principals
        self._nats = nats
        self._migrate_timeout = migrate_timeout
        self.suspects: set[str] = set()  # workspaces whose last migrate ended ambiguously
        self.wake = asyncio.Event()  # tells the reconciler to look at the suspects now

    def system_metadata(self, workspace_id: str) -> list[tuple[str, str | bytes]]:
        return self._principals.metadata(system_principal(workspace_id))

    async def run(self, workspace_id: str, mutate: Mutation[R], *, provision: bool = False) -> R:
        try:
            result, version = await self._apply(workspace_id, mutate, provision)
        except NothingToDo:
            raise
        except ServiceError as exc:
            outcome = "refused" if exc.code == grpc.StatusCode.INVALID_ARGUMENT else "failed"
            self.metrics.changes.labels(outcome).inc()
            raise
        self.metrics.changes.labels("committed").inc()
        await self.announce(workspace_id, version)
        return result

    async def _apply(
        self, workspace_id: str, mutate: Mutation[R], provision: bool
    ) -> tuple[R, int]:
        async with self._pool.acquire() as connection, connection.transaction():
            if provision:
                await connection.execute(
                    "INSERT INTO metadata.workspaces (workspace_id, version) VALUES ($1, 0) "
                    "ON CONFLICT (workspace_id) DO NOTHING",
                    workspace_id,
                )
            current = await store.workspace_version(connection, workspace_id, lock=True)
            if current is None:
                raise NotFound("this workspace has no data model: provision it first")
            defs = Definitions(workspace_id, await store.load_objects(connection, workspace_id))
            result = await mutate(connection, defs)
            version = int(await connection.fetchval("SELECT nextval('metadata.version_seq')"))
            await connection.execute(
                "UPDATE metadata.workspaces SET version = $2, updated_at = now() "
                "WHERE workspace_id = $1",
                workspace_id,
                version,
            )
            desired = await store.schema(connection, workspace_id)
            await self._migrate(workspace_id, desired)
        return result, version

    async def _migrate(self, workspace_id: str, desired: Any) -> None:
        request = records_pb2.MigrateSchemaRequest(change_id=str(uuid.uuid4()), schema=desired)
        try:
            await self._records.MigrateSchema(
                request,
                metadata=self.system_metadata(workspace_id),
                timeout=self._migrate_timeout,
            )
        except grpc.aio.AioRpcError as exc:
            error = from_rpc_error(exc)
            if exc.code() in (
                grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.FAILED_PRECONDITION,
            ):
                raise error from None
            # Records may or may not have run the DDL: roll back, and let the reconciler make
            # records match what is committed.
            self.suspects.add(workspace_id)
            self.wake.set()
            log.warning(
                "schema migration failed; change rolled back",
                extra={"workspace_id": workspace_id, "code": exc.code().name},
            )
            if isinstance(error, ServiceError) and error.code == grpc.StatusCode.INTERNAL:
                raise Unavailable(
                    "the schema change could not be applied; nothing changed"
                ) from None
            raise error from None

    async def announce(self, workspace_id: str, version: int) -> None:
        payload = events_pb2.MetadataChanged(workspace_id=workspace_id, version=version)
        try:
            await self._nats.publish(
                metadata_subject(workspace_id),
                payload.SerializeToString(),
                headers=trace_context_headers(),
            )
        except Exception:  # announcing is best effort: requests carry versions too
            log.warning("could not announce metadata version", exc_info=True)
