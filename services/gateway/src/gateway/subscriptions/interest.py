"""The gateway's leases on the record events of workspaces with open subscriptions.

The records relay publishes a workspace's events only while somebody declared interest in them
(docs/events.md, "Who listens"). Before a subscription is confirmed in a workspace this gateway
process holds no fresh lease on, the lease is declared (synchronously: if records cannot answer,
the subscription is refused with UNAVAILABLE); then, every RENEW_SECONDS, the leases of the
workspaces with subscriptions still open are renewed, in one call, and the others left to lapse.
A lease lasts LEASE_SECONDS, so it outlives two missed renewals; one with less than half its time
left is not fresh, and a new subscription declares it again rather than trust the next renewal.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable

import grpc

from crm.records.v1 import records_pb2, records_pb2_grpc
from crmkit.errors import Unavailable, from_rpc_error
from crmkit.event_interest import MAX_WORKSPACES_PER_CALL, SERVICE_WORKSPACE, gateway_holder
from crmkit.principal import PrincipalCodec, system_principal

log = logging.getLogger("gateway.subscriptions")

LEASE_SECONDS = 60
RENEW_SECONDS = 20.0


class InterestLeases:
    def __init__(
        self,
        stub: records_pb2_grpc.EventInterestServiceStub,
        principals: PrincipalCodec,
        open_workspaces: Callable[[], Iterable[str]],
        *,
        instance: str | None = None,
        lease: int = LEASE_SECONDS,
        renew_every: float = RENEW_SECONDS,
    ) -> None:
        self.holder = gateway_holder(instance or uuid.uuid4().hex)
        self._stub = stub
        self._principals = principals
        self._open_workspaces = open_workspaces
        self._lease = lease
        self._renew_every = renew_every
        self._until: dict[
            str, float
        ] = {}  # workspace -> monotonic time its lease lapses (at least)
        self._declaring: dict[str, asyncio.Future[None]] = {}

    def fresh(self, workspace_id: str, now: float | None = None) -> bool:
        """Whether the lease on `workspace_id` has at least half its time left."""
        moment = time.monotonic() if now is None else now
        return self._until.get(workspace_id, 0.0) - moment >= self._lease / 2

    async def ensure(self, workspace_id: str) -> None:
        """Before a subscription in `workspace_id` is confirmed: a fresh lease, declared now if
        need be (Unavailable when records cannot answer)."""
        if self.fresh(workspace_id):
            return
        declaring = self._declaring.get(workspace_id)
        if declaring is None:  # one call however many subscriptions open at once
            declaring = asyncio.ensure_future(self._declare([workspace_id], workspace_id))
            self._declaring[workspace_id] = declaring
            declaring.add_done_callback(lambda _: self._declaring.pop(workspace_id, None))
        try:
            await asyncio.shield(declaring)
        except grpc.aio.AioRpcError as exc:
            error = from_rpc_error(exc)
            raise Unavailable(
                f"record events cannot be subscribed to now: {error.message}"
            ) from None

    async def run(self) -> None:
        """Forever: renews the leases of the workspaces with open subscriptions."""
        while True:
            await asyncio.sleep(self._renew_every)
            await self.renew()

    async def renew(self) -> None:
        workspaces = sorted(set(self._open_workspaces()))
        for gone in self._until.keys() - set(workspaces):
            del self._until[gone]
        for start in range(0, len(workspaces), MAX_WORKSPACES_PER_CALL):
            chunk = workspaces[start : start + MAX_WORKSPACES_PER_CALL]
            try:
                await self._declare(chunk, SERVICE_WORKSPACE)
            except grpc.aio.AioRpcError as exc:
                log.warning(
                    "subscription leases not renewed",
                    extra={"workspaces": len(chunk), "error": from_rpc_error(exc).message},
                )

    async def _declare(self, workspaces: list[str], principal_workspace: str) -> None:
        started = time.monotonic()
        await self._stub.DeclareEventInterest(
            records_pb2.DeclareEventInterestRequest(
                holder=self.holder, workspace_ids=workspaces, lease_seconds=self._lease
            ),
            metadata=self._principals.metadata(system_principal(principal_workspace)),
        )
        for workspace_id in workspaces:
            self._until[workspace_id] = started + self._lease
