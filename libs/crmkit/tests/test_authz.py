from __future__ import annotations

import pytest

from crm.common.v1 import common_pb2
from crmkit.authz import (
    DELETE,
    READ,
    WRITE,
    object_access,
    require_flag,
    require_full_read,
    require_object_access,
)
from crmkit.errors import PermissionDenied


def _principal(**kwargs: object) -> common_pb2.Principal:
    return common_pb2.Principal(workspace_id="ws", user_id="u1", **kwargs)  # type: ignore[arg-type]


ADMIN = _principal(
    permissions=[common_pb2.ObjectPermission(object="*", actions=[READ, WRITE, DELETE])],
    flags=[common_pb2.FLAG_API_KEYS_AND_WEBHOOKS],
)
MEMBER = _principal(
    permissions=[
        common_pb2.ObjectPermission(
            object="*", actions=[READ, WRITE, DELETE], own_records_only=True
        )
    ]
)
READER = _principal(permissions=[common_pb2.ObjectPermission(object="company", actions=[READ])])


def test_admin_reaches_every_record() -> None:
    access = require_object_access(ADMIN, "person", DELETE)
    assert not access.own_records_only


def test_member_reaches_only_own_records() -> None:
    access = require_object_access(MEMBER, "opportunity", WRITE)
    assert access.own_records_only
    assert access.owner_id == "u1"


def test_custom_role_is_limited_to_its_objects_and_actions() -> None:
    assert object_access(READER, "company", READ) is not None
    assert object_access(READER, "company", WRITE) is None
    assert object_access(READER, "person", READ) is None
    with pytest.raises(PermissionDenied, match="WRITE on company"):
        require_object_access(READER, "company", WRITE)


def test_a_broader_grant_wins_over_own_records_only() -> None:
    principal = _principal(
        permissions=[
            common_pb2.ObjectPermission(object="*", actions=[READ], own_records_only=True),
            common_pb2.ObjectPermission(object="company", actions=[READ]),
        ]
    )
    assert not require_object_access(principal, "company", READ).own_records_only
    assert require_object_access(principal, "person", READ).own_records_only


@pytest.mark.parametrize(
    ("scopes", "object_name", "action", "allowed"),
    [
        (["read:person"], "person", READ, True),
        (["read:person"], "person", WRITE, False),
        (["read:person"], "company", READ, False),
        (["write:company"], "company", DELETE, True),
        (["read:*"], "company", READ, True),
        (["*"], "company", DELETE, True),
        ([], "person", READ, False),
    ],
)
def test_oauth_scopes_narrow_the_role(
    scopes: list[str], object_name: str, action: int, allowed: bool
) -> None:
    token = common_pb2.Principal(
        workspace_id="ws",
        kind=common_pb2.PRINCIPAL_KIND_OAUTH,
        permissions=ADMIN.permissions,
        scopes=scopes,
    )
    assert (object_access(token, object_name, action) is not None) is allowed


def test_flags() -> None:
    require_flag(ADMIN, common_pb2.FLAG_API_KEYS_AND_WEBHOOKS)
    with pytest.raises(PermissionDenied, match="API_KEYS_AND_WEBHOOKS"):
        require_flag(MEMBER, common_pb2.FLAG_API_KEYS_AND_WEBHOOKS)


@pytest.mark.parametrize(("scopes", "allowed"), [(["read:person"], False), (["*"], True)])
def test_a_flag_needs_the_full_scope_for_oauth_tokens(scopes: list[str], allowed: bool) -> None:
    token = common_pb2.Principal(
        workspace_id="ws",
        kind=common_pb2.PRINCIPAL_KIND_OAUTH,
        permissions=ADMIN.permissions,
        flags=ADMIN.flags,
        scopes=scopes,
    )
    if allowed:
        require_flag(token, common_pb2.FLAG_API_KEYS_AND_WEBHOOKS)
    else:
        with pytest.raises(PermissionDenied, match=r"\* scope"):
            require_flag(token, common_pb2.FLAG_API_KEYS_AND_WEBHOOKS)


def test_full_read_needs_every_record_and_a_wildcard_needs_every_object() -> None:
    require_full_read(ADMIN, "person")
    require_full_read(ADMIN, "*")
    with pytest.raises(PermissionDenied, match="READ on every record of person"):
        require_full_read(MEMBER, "person")
    people_reader = _principal(
        permissions=[common_pb2.ObjectPermission(object="person", actions=[READ])]
    )
    require_full_read(people_reader, "person")
    with pytest.raises(PermissionDenied, match="every object"):
        require_full_read(people_reader, "*")
