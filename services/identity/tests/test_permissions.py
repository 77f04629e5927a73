from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2
from crmkit import authz
from crmkit.errors import InvalidArgument
from identity.principals import build_principal, effective_permissions
from identity.roles import ADMIN, MEMBER, RoleRow, grants_of, permissions_json

R, W, D = common_pb2.ACTION_READ, common_pb2.ACTION_WRITE, common_pb2.ACTION_DELETE


def _role(
    builtin: str | None = None, permissions: list[dict[str, object]] | None = None
) -> RoleRow:
    now = datetime.now(UTC)
    return RoleRow(
        id=uuid.uuid4(),
        workspace_id=uuid.uuid4(),
        name=builtin or "Custom",
        description="",
        builtin=builtin,
        permissions=permissions or [],
        flags=[],
        created_at=now,
        updated_at=now,
    )


def _principal(
    role: RoleRow, kind: int = common_pb2.PRINCIPAL_KIND_USER, scopes: tuple[str, ...] = ()
) -> common_pb2.Principal:
    return build_principal(
        kind=kind,  # type: ignore[arg-type]
        workspace_id=role.workspace_id,
        role=role,
        credential_id=uuid.uuid4(),
        user_id=uuid.uuid4(),
        scopes=scopes,
    )


def test_admin_may_do_everything() -> None:
    principal = _principal(_role(ADMIN))
    assert principal.role == common_pb2.ROLE_ADMIN
    access = authz.require_object_access(principal, "person", D)
    assert access.own_records_only is False
    authz.require_flag(principal, common_pb2.FLAG_API_KEYS_AND_WEBHOOKS)


def test_member_reaches_only_own_records_and_no_settings() -> None:
    principal = _principal(_role(MEMBER))
    access = authz.require_object_access(principal, "company", W)
    assert access.own_records_only is True
    assert access.owner_id == principal.user_id
    assert not authz.has_flag(principal, common_pb2.FLAG_API_KEYS_AND_WEBHOOKS)


def test_custom_role_grants_what_it_lists() -> None:
    role = _role(permissions=[{"object": "person", "actions": ["READ", "WRITE"]}])
    principal = _principal(role)
    assert principal.role == common_pb2.ROLE_CUSTOM
    authz.require_object_access(principal, "person", W)
    assert authz.object_access(principal, "person", D) is None
    assert authz.object_access(principal, "company", R) is None


def test_permissions_are_merged_and_validated() -> None:
    merged = permissions_json(
        [
            identity_pb2.RolePermission(object="person", actions=[D]),
            identity_pb2.RolePermission(object="person", actions=[R]),
        ]
    )
    assert merged == [{"object": "person", "actions": ["READ", "DELETE"]}]
    with pytest.raises(InvalidArgument) as error:
        permissions_json([identity_pb2.RolePermission(object="bad name", actions=[R])])
    assert error.value.field == "permissions[0].object"
    assert grants_of(_role(permissions=merged)).permissions[0].actions == [R, D]


def test_oauth_scopes_narrow_effective_permissions() -> None:
    principal = _principal(
        _role(ADMIN), common_pb2.PRINCIPAL_KIND_OAUTH, ("read:person", "write:*")
    )
    effective = {(p.object, tuple(p.actions)) for p in effective_permissions(principal)}
    assert effective == {("person", (R,)), ("*", (W, D))}
    # The same narrowing crmkit.authz applies when a service checks the principal.
    assert authz.object_access(principal, "company", R) is None
    assert authz.object_access(principal, "company", W) is not None
    everything = _principal(_role(ADMIN), common_pb2.PRINCIPAL_KIND_OAUTH, ("*",))
    assert [(p.object, list(p.actions)) for p in effective_permissions(everything)] == [
        ("*", [R, W, D])
    ]
