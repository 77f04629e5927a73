"""gRPC EventInterestService: which workspaces somebody listens to the record events of
(docs/events.md, "Who listens"), and the condition the relay publishes a row under.

Only services call it (a system principal): the webhooks and workflows services declare their
interest before a change that makes a workspace listen commits and release it in a sweep; a
gateway holds a lease per workspace with open subscriptions.
"""

from __future__ import annotations

from typing import Any

from crm.common.v1 import common_pb2
from crm.records.v1 import records_pb2, records_pb2_grpc
from crmkit.errors import InvalidArgument, PermissionDenied
from crmkit.event_interest import (
    GATEWAY_PREFIX,
    MAX_LEASE_SECONDS,
    MAX_WORKSPACES_PER_CALL,
    SERVICE_WORKSPACE,
    SYNCED_HOLDERS,
    check_holder,
)
from crmkit.ids import canonical_uuid
from crmkit.principal import PrincipalCodec

Context = Any

# SQL: whether the relay publishes the outbox row aliased `o` (a workspace with an unexpired
# interest), or publishes everything while a holder of SYNCED_HOLDERS has not synced yet.
_SYNCED = ", ".join(f"'{holder}'" for holder in SYNCED_HOLDERS)
PUBLISH_CONDITION = (
    "((SELECT count(*) FROM records.event_interest_synced "
    f"WHERE holder IN ({_SYNCED})) < {len(SYNCED_HOLDERS)} "
    "OR EXISTS (SELECT 1 FROM records.event_interest i WHERE i.workspace_id = o.workspace_id "
    "AND (i.expires_at IS NULL OR i.expires_at > now())))"
)
# Whether the relay skips rows at all (both holders synced): a gauge.
GATING = (
    f"SELECT count(*) = {len(SYNCED_HOLDERS)} FROM records.event_interest_synced "
    f"WHERE holder IN ({_SYNCED})"
)
# Lapsed gateway leases, a bounded chunk per round (the relay's housekeeping).
PRUNE_LAPSED = (
    "DELETE FROM records.event_interest WHERE (workspace_id, holder) IN ("
    "SELECT workspace_id, holder FROM records.event_interest WHERE expires_at < now() LIMIT $1)"
)

_DECLARE = (
    "INSERT INTO records.event_interest (workspace_id, holder, expires_at) "
    "SELECT w, $2, CASE WHEN $3::int > 0 THEN now() + make_interval(secs => $3::int) END "
    "FROM unnest($1::uuid[]) w "
    "ON CONFLICT (workspace_id, holder) DO UPDATE SET expires_at = EXCLUDED.expires_at, "
    "declared_at = now() "
    "WHERE event_interest.expires_at IS DISTINCT FROM EXCLUDED.expires_at"
)
# Before a holder's interest in a workspace starts (a new row, or a lease that lapsed), the
# workspace's lock of writes (`records.events_wanted`) taken exclusively: the declaration waits
# for the writes that decided without it to commit. In workspace order, so that two
# declarations never wait for each other.
_HOLD_WRITES = (
    "SELECT count(pg_advisory_xact_lock(hashtext('records.event_writes'), hashtext(w::text))) "
    "FROM (SELECT w FROM unnest($1::uuid[]) w WHERE NOT EXISTS (SELECT 1 FROM "
    "records.event_interest i WHERE i.workspace_id = w AND i.holder = $2 "
    "AND (i.expires_at IS NULL OR i.expires_at > now())) ORDER BY w) s"
)
_SYNC = "INSERT INTO records.event_interest_synced (holder) VALUES ($1) ON CONFLICT DO NOTHING"
_RELEASE = "DELETE FROM records.event_interest WHERE holder = $1 AND workspace_id = ANY($2::uuid[])"
_LIST = (
    "SELECT workspace_id::text FROM records.event_interest WHERE holder = $1 "
    "AND workspace_id > $2::uuid ORDER BY workspace_id LIMIT $3"
)
DEFAULT_PAGE = 100


def workspace_ids(values: list[str]) -> list[str]:
    """Distinct canonical ids, at most MAX_WORKSPACES_PER_CALL."""
    if len(values) > MAX_WORKSPACES_PER_CALL:
        raise InvalidArgument(
            f"at most {MAX_WORKSPACES_PER_CALL} workspace ids per call", field="workspaceIds"
        )
    return sorted({canonical_uuid(value, "workspaceIds") for value in values})


def lease_of(holder: str, seconds: int) -> int:
    """A gateway holds a lease (1..MAX_LEASE_SECONDS); the others hold until released (0)."""
    if holder.startswith(GATEWAY_PREFIX):
        if not 1 <= seconds <= MAX_LEASE_SECONDS:
            raise InvalidArgument(
                f"a gateway's leaseSeconds must be within 1..{MAX_LEASE_SECONDS}",
                field="leaseSeconds",
            )
        return seconds
    if seconds:
        raise InvalidArgument(f"{holder} holds interest without a lease", field="leaseSeconds")
    return 0


def page_size(first: int) -> int:
    if first < 0 or first > MAX_WORKSPACES_PER_CALL:
        raise InvalidArgument(f"first must be within 0..{MAX_WORKSPACES_PER_CALL}", field="first")
    return first or DEFAULT_PAGE


class EventInterestServicer(records_pb2_grpc.EventInterestServiceServicer):
    def __init__(self, pool: Any, principals: PrincipalCodec) -> None:
        self._pool = pool
        self._principals = principals

    def _service(self, context: Context) -> None:
        principal = self._principals.require(context)
        if principal.kind != common_pb2.PRINCIPAL_KIND_SYSTEM:
            raise PermissionDenied("permission denied: services only")

    async def DeclareEventInterest(  # noqa: N802
        self, request: records_pb2.DeclareEventInterestRequest, context: Context
    ) -> records_pb2.DeclareEventInterestResponse:
        self._service(context)
        holder = check_holder(request.holder)
        lease = lease_of(holder, request.lease_seconds)
        workspaces = workspace_ids(list(request.workspace_ids))
        if request.synced and holder not in SYNCED_HOLDERS:
            raise InvalidArgument("only webhooks and workflows sync", field="synced")
        async with self._pool.acquire() as connection, connection.transaction():
            if workspaces:
                await connection.execute(_HOLD_WRITES, workspaces, holder)
                await connection.execute(_DECLARE, workspaces, holder, lease)
            if request.synced:
                await connection.execute(_SYNC, holder)
        return records_pb2.DeclareEventInterestResponse()

    async def ReleaseEventInterest(  # noqa: N802
        self, request: records_pb2.ReleaseEventInterestRequest, context: Context
    ) -> records_pb2.ReleaseEventInterestResponse:
        self._service(context)
        holder = check_holder(request.holder)
        workspaces = workspace_ids(list(request.workspace_ids))
        if not workspaces:
            return records_pb2.ReleaseEventInterestResponse()
        status = await self._pool.execute(_RELEASE, holder, workspaces)
        return records_pb2.ReleaseEventInterestResponse(released=int(status.split()[-1]))

    async def ListEventInterest(  # noqa: N802
        self, request: records_pb2.ListEventInterestRequest, context: Context
    ) -> records_pb2.ListEventInterestResponse:
        self._service(context)
        holder = check_holder(request.holder)
        after = canonical_uuid(request.after, "after") if request.after else SERVICE_WORKSPACE
        rows = await self._pool.fetch(_LIST, holder, after, page_size(request.first))
        return records_pb2.ListEventInterestResponse(workspace_ids=[row[0] for row in rows])
