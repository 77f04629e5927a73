"""Holders of interest in record events (docs/events.md, "Who listens"): their names, and the
rule the webhooks and workflows services follow to declare and release theirs.

The records relay publishes a workspace's events only while somebody declared interest in them.
A webhook or workflow whose creation, widening or activation committed before an event was
committed must get that event, so its service declares interest *before* that change commits,
inside its transaction, holding a shared transaction-level advisory lock on the workspace. It
releases interest only in a sweep that holds the exclusive lock for the workspace and finds
nothing there that listens any more: a release never races a creation (the creation either
committed before the sweep looked, or declares again after it). Until a holder has declared every
workspace it listens to once (`sync`, at start), the relay publishes every event.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg
import grpc

from crm.records.v1 import records_pb2, records_pb2_grpc
from crmkit.errors import InvalidArgument, ServiceError, from_rpc_error
from crmkit.principal import PrincipalCodec, system_principal

WEBHOOKS = "webhooks"
WORKFLOWS = "workflows"
SYNCED_HOLDERS = (WEBHOOKS, WORKFLOWS)
GATEWAY_PREFIX = "gateway:"
MAX_LEASE_SECONDS = 3600
MAX_WORKSPACES_PER_CALL = 1000
# Calls about many workspaces at once carry the system principal of no real workspace.
SERVICE_WORKSPACE = str(uuid.UUID(int=0))
_INSTANCE = re.compile(r"[A-Za-z0-9._-]{1,100}")

# Periodic sweep: this many workspaces with interest every so many seconds, whatever the tenant
# count (issue #27: periodic work must not grow with the number of workspaces).
SWEEP_SECONDS = 30.0
SWEEP_WORKSPACES = 50
_RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0)

log = logging.getLogger("crmkit.event_interest")


def gateway_holder(instance: str) -> str:
    """The holder name of one gateway process."""
    return GATEWAY_PREFIX + instance


def check_holder(holder: str) -> str:
    """`holder` if it names a holder; InvalidArgument naming `holder` otherwise."""
    if holder in SYNCED_HOLDERS:
        return holder
    if holder.startswith(GATEWAY_PREFIX) and _INSTANCE.fullmatch(holder[len(GATEWAY_PREFIX) :]):
        return holder
    raise InvalidArgument(
        "holder must be webhooks, workflows or gateway:<instance id> (letters, digits, . _ -)",
        field="holder",
    )


class InterestHolder:
    """How the webhooks (or workflows) service keeps its interest in step with its configuration.

    `listens_sql` ($1: workspace id) answers whether anything of the service listens to the
    workspace's events (an active webhook; an active record-triggered workflow);
    `listening_sql` ($1: a workspace id, $2: a count) lists the next workspaces, in id order,
    where something does.
    """

    def __init__(
        self,
        holder: str,
        pool: asyncpg.Pool,
        stub: records_pb2_grpc.EventInterestServiceStub,
        principals: PrincipalCodec,
        *,
        listens_sql: str,
        listening_sql: str,
    ) -> None:
        if holder not in SYNCED_HOLDERS:
            raise ValueError(f"{holder!r} is not a holder that syncs")
        self.holder = holder
        self._pool = pool
        self._stub = stub
        self._principals = principals
        self._listens_sql = listens_sql
        self._listening_sql = listening_sql
        self._lock_class = f"{holder}.event_interest"
        self._cursor = ""
        self._redeclare_cursor = ""

    async def declare(self, connection: Any, workspace_id: str) -> None:
        """Inside the transaction of a change that makes `workspace_id` listen: keeps sweeps of
        the workspace out until the transaction ends, and declares interest before it commits.
        Raises ServiceError (Unavailable when records cannot answer): the change must not
        commit, or its events could be skipped."""
        await connection.execute(
            "SELECT pg_advisory_xact_lock_shared(hashtext($1), hashtext($2))",
            self._lock_class,
            workspace_id,
        )
        await self._declare([workspace_id], workspace_id)

    async def sweep(self, workspace_id: str) -> bool:
        """Releases the interest in `workspace_id` if nothing of this service listens there any
        more; whether it did."""
        async with self._pool.acquire() as connection, connection.transaction():
            await connection.execute(
                "SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))",
                self._lock_class,
                workspace_id,
            )
            if await connection.fetchval(self._listens_sql, workspace_id):
                return False
            try:
                await self._stub.ReleaseEventInterest(
                    records_pb2.ReleaseEventInterestRequest(
                        holder=self.holder, workspace_ids=[workspace_id]
                    ),
                    metadata=self._principals.metadata(system_principal(workspace_id)),
                )
            except grpc.aio.AioRpcError as exc:
                raise from_rpc_error(exc) from None
        return True

    async def sweep_quietly(self, workspace_id: str) -> None:
        """`sweep` after a delete or deactivation has committed: a failure only leaves interest
        (events published that nobody needs) until the periodic sweep."""
        try:
            await self.sweep(workspace_id)
        except (ServiceError, asyncpg.PostgresError, OSError) as exc:
            log.warning(
                "event interest not released yet",
                extra={"holder": self.holder, "workspace_id": workspace_id, "error": repr(exc)},
            )

    async def run(self) -> None:
        """Forever: declares every workspace the service listens to (retrying until records
        answers), marks the holder synced, then every SWEEP_SECONDS sweeps SWEEP_WORKSPACES
        workspaces with interest and declares again SWEEP_WORKSPACES it listens to."""
        attempt = 0
        while True:
            try:
                await self.sync()
                break
            except (ServiceError, asyncpg.PostgresError, OSError) as exc:
                delay = _RETRY_SECONDS[min(attempt, len(_RETRY_SECONDS) - 1)]
                attempt += 1
                log.warning(
                    "event interest not synced yet; retrying",
                    extra={"holder": self.holder, "error": repr(exc), "retry_in": delay},
                )
                await asyncio.sleep(delay)
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            try:
                await self.sweep_some(SWEEP_WORKSPACES)
                await self.redeclare_some(SWEEP_WORKSPACES)
            except (ServiceError, asyncpg.PostgresError, OSError) as exc:
                log.warning(
                    "event interest sweep failed", extra={"holder": self.holder, "error": repr(exc)}
                )

    async def sync(self) -> int:
        """Declares interest in every workspace the service listens to, then marks the holder
        synced; returns how many workspaces it declared."""
        after, declared = SERVICE_WORKSPACE, 0
        while True:
            rows = await self._pool.fetch(self._listening_sql, after, MAX_WORKSPACES_PER_CALL)
            workspaces = [str(row[0]) for row in rows]
            if workspaces:
                await self._declare(workspaces, SERVICE_WORKSPACE)
                declared += len(workspaces)
                after = workspaces[-1]
            if len(workspaces) < MAX_WORKSPACES_PER_CALL:
                break
        await self._declare([], SERVICE_WORKSPACE, synced=True)
        log.info("event interest synced", extra={"holder": self.holder, "workspaces": declared})
        return declared

    async def sweep_some(self, count: int) -> int:
        """Sweeps the next `count` workspaces this holder has interest in (round robin);
        returns how many it released."""
        try:
            page = await self._stub.ListEventInterest(
                records_pb2.ListEventInterestRequest(
                    holder=self.holder, after=self._cursor, first=count
                ),
                metadata=self._principals.metadata(system_principal(SERVICE_WORKSPACE)),
            )
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        workspaces = list(page.workspace_ids)
        self._cursor = workspaces[-1] if len(workspaces) == count else ""
        released = 0
        for workspace_id in workspaces:
            released += await self.sweep(workspace_id)
        return released

    async def redeclare_some(self, count: int) -> int:
        """Declares again the next `count` workspaces the service listens to (round robin, one
        call), so interest lost outside these rules comes back (a records database restored
        from an older backup, a webhook saved by a replica of a version without interest);
        returns how many."""
        rows = await self._pool.fetch(
            self._listening_sql, self._redeclare_cursor or SERVICE_WORKSPACE, count
        )
        workspaces = [str(row[0]) for row in rows]
        self._redeclare_cursor = workspaces[-1] if len(workspaces) == count else ""
        if workspaces:
            await self._declare(workspaces, SERVICE_WORKSPACE)
        return len(workspaces)

    async def _declare(
        self, workspaces: Sequence[str], principal_workspace: str, *, synced: bool = False
    ) -> None:
        try:
            await self._stub.DeclareEventInterest(
                records_pb2.DeclareEventInterestRequest(
                    holder=self.holder, workspace_ids=list(workspaces), synced=synced
                ),
                metadata=self._principals.metadata(system_principal(principal_workspace)),
            )
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
