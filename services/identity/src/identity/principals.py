"""The principal each kind of credential carries, and the permissions it effectively has."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2
from identity.roles import ALL_ACTIONS, RoleRow, grants_of

_SCOPE_ACTIONS = {
    "read": (common_pb2.ACTION_READ,),
    "write": (common_pb2.ACTION_WRITE, common_pb2.ACTION_DELETE),
}


def build_principal(
    *,
    kind: common_pb2.PrincipalKind,
    workspace_id: uuid.UUID,
    role: RoleRow,
    credential_id: uuid.UUID | None,
    user_id: uuid.UUID | None = None,
    email: str = "",
    scopes: Sequence[str] = (),
    oauth_client_id: str = "",
) -> common_pb2.Principal:
    grants = grants_of(role)
    return common_pb2.Principal(
        workspace_id=str(workspace_id),
        kind=kind,
        user_id=str(user_id) if user_id else "",
        credential_id=str(credential_id) if credential_id else "",
        role_id=str(role.id),
        role_name=role.name,
        role=grants.role,
        permissions=grants.permissions,
        flags=grants.flags,
        scopes=list(scopes),
        oauth_client_id=oauth_client_id,
        email=email,
    )


def effective_permissions(principal: common_pb2.Principal) -> list[identity_pb2.ObjectActions]:
    """What the principal may do per object: its role's permissions, narrowed by OAuth scopes."""
    merged: dict[tuple[str, bool], set[common_pb2.Action]] = {}
    for permission in principal.permissions:
        for object_name, actions in _narrow(principal, permission):
            merged.setdefault((object_name, permission.own_records_only), set()).update(actions)
    return [
        identity_pb2.ObjectActions(
            object=object_name,
            actions=[action for action in ALL_ACTIONS if action in actions],
            own_records_only=own,
        )
        for (object_name, own), actions in merged.items()
        if actions
    ]


def _narrow(
    principal: common_pb2.Principal, permission: common_pb2.ObjectPermission
) -> list[tuple[str, set[common_pb2.Action]]]:
    actions = set(permission.actions)
    if principal.kind != common_pb2.PRINCIPAL_KIND_OAUTH or "*" in principal.scopes:
        return [(permission.object, actions)]
    narrowed: list[tuple[str, set[common_pb2.Action]]] = []
    for scope in principal.scopes:
        verb, _, target = scope.partition(":")
        allowed = actions & set(_SCOPE_ACTIONS.get(verb, ()))
        if not allowed:
            continue
        if target == "*":
            narrowed.append((permission.object, allowed))
        elif permission.object in ("*", target):
            narrowed.append((target, allowed))
    return narrowed
