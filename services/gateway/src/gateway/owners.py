"""`ownerId` names a member of the record's workspace (docs/api.md, "Record owners").

The records service knows no users, so the gateway checks a write's owners before forwarding it:
the ids other than the caller's own (the default, always a member) are looked up in identity in
one FindMembers call per request, however many records a batch holds. A value that is not a
UUID string is left to the records service, which names it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2
from crmkit.errors import InvalidArgument
from gateway.rpc import Metadata, call
from gateway.state import GatewayState

OWNER = "ownerId"


def named_owners(records: Sequence[Any], *, batch: bool, caller: str) -> dict[str, str]:
    """Owner id -> the field path of its first mention, for owners other than `caller`."""
    found: dict[str, str] = {}
    for index, record in enumerate(records):
        value = record.get(OWNER) if isinstance(record, dict) else None
        if not isinstance(value, str):
            continue
        try:
            owner = str(uuid.UUID(value))
        except ValueError:
            continue
        if owner != caller and owner not in found:
            found[owner] = f"[{index}].{OWNER}" if batch else OWNER
    return found


async def check_owners(
    state: GatewayState,
    principal: common_pb2.Principal,
    metadata: Metadata,
    records: Sequence[Any],
    *,
    batch: bool = False,
) -> None:
    """InvalidArgument naming the field when an `ownerId` is not a member of the workspace."""
    owners = named_owners(records, batch=batch, caller=principal.user_id)
    if not owners:
        return
    response = await call(
        state.upstreams.workspaces.FindMembers,
        identity_pb2.FindMembersRequest(user_ids=list(owners)),
        metadata,
    )
    members = set(response.user_ids)
    for owner, path in owners.items():
        if owner not in members:
            raise InvalidArgument(f"{path}: {owner} is not a member of this workspace", field=path)
