"""Roles: the built-in Admin and Member, custom roles, and what each grants."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
from google.protobuf.timestamp_pb2 import Timestamp

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2
from crmkit.errors import InvalidArgument

ADMIN = "admin"
MEMBER = "member"
BUILTIN_NAMES = {ADMIN: "Admin", MEMBER: "Member"}
BUILTIN_DESCRIPTIONS = {
    ADMIN: "Full access to every record and to workspace settings.",
    MEMBER: "Reads, writes and deletes the records they own.",
}

ALL_ACTIONS = (common_pb2.ACTION_READ, common_pb2.ACTION_WRITE, common_pb2.ACTION_DELETE)
ALL_FLAGS = (
    common_pb2.FLAG_API_KEYS_AND_WEBHOOKS,
    common_pb2.FLAG_WORKFLOWS,
    common_pb2.FLAG_DATA_MODEL,
    common_pb2.FLAG_WORKSPACE_MEMBERS,
)
ACTION_NAMES = {
    action: common_pb2.Action.Name(action).removeprefix("ACTION_") for action in ALL_ACTIONS
}
FLAG_NAMES = {flag: common_pb2.Flag.Name(flag).removeprefix("FLAG_") for flag in ALL_FLAGS}
_ACTION_BY_NAME = {name: action for action, name in ACTION_NAMES.items()}
_FLAG_BY_NAME = {name: flag for flag, name in FLAG_NAMES.items()}
_OBJECT_NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9]{0,62}$")
MAX_ROLE_NAME = 100


@dataclass(frozen=True)
class RoleRow:
    id: uuid.UUID
    workspace_id: uuid.UUID
    name: str
    description: str
    builtin: str | None
    permissions: list[dict[str, Any]]
    flags: list[str]
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_record(cls, record: asyncpg.Record, prefix: str = "") -> RoleRow:
        return cls(
            id=record[f"{prefix}id"],
            workspace_id=record[f"{prefix}workspace_id"],
            name=record[f"{prefix}name"],
            description=record[f"{prefix}description"],
            builtin=record[f"{prefix}builtin"],
            permissions=list(record[f"{prefix}permissions"]),
            flags=list(record[f"{prefix}flags"]),
            created_at=record[f"{prefix}created_at"],
            updated_at=record[f"{prefix}updated_at"],
        )


ROLE_COLUMNS = (
    "id",
    "workspace_id",
    "name",
    "description",
    "builtin",
    "permissions",
    "flags",
    "created_at",
    "updated_at",
)


def role_columns(alias: str, prefix: str) -> str:
    """`alias.col AS prefixcol, ...` for selecting a role beside other rows."""
    return ", ".join(f"{alias}.{column} AS {prefix}{column}" for column in ROLE_COLUMNS)


@dataclass(frozen=True)
class Grants:
    role: common_pb2.Role
    permissions: list[common_pb2.ObjectPermission]
    flags: list[common_pb2.Flag]


def grants_of(role: RoleRow) -> Grants:
    """What a role allows, in the principal's terms (crmkit.authz semantics)."""
    if role.builtin == ADMIN:
        return Grants(
            common_pb2.ROLE_ADMIN,
            [common_pb2.ObjectPermission(object="*", actions=ALL_ACTIONS)],
            list(ALL_FLAGS),
        )
    if role.builtin == MEMBER:
        return Grants(
            common_pb2.ROLE_MEMBER,
            [common_pb2.ObjectPermission(object="*", actions=ALL_ACTIONS, own_records_only=True)],
            [],
        )
    return Grants(
        common_pb2.ROLE_CUSTOM,
        [
            common_pb2.ObjectPermission(
                object=entry["object"], actions=[_ACTION_BY_NAME[name] for name in entry["actions"]]
            )
            for entry in role.permissions
        ],
        [_FLAG_BY_NAME[name] for name in role.flags],
    )


def role_name(value: str, field: str = "name") -> str:
    cleaned = value.strip()
    if not cleaned:
        raise InvalidArgument("name is required", field=field)
    if len(cleaned) > MAX_ROLE_NAME:
        raise InvalidArgument(f"name must have at most {MAX_ROLE_NAME} characters", field=field)
    if cleaned.lower() in {name.lower() for name in BUILTIN_NAMES.values()}:
        raise InvalidArgument(f"{cleaned} is a built-in role name", field=field)
    return cleaned


def permissions_json(
    permissions: Sequence[identity_pb2.RolePermission], field: str = "permissions"
) -> list[dict[str, Any]]:
    """Validated permissions as stored: one entry per object, actions in a fixed order."""
    merged: dict[str, set[common_pb2.Action]] = {}
    for index, permission in enumerate(permissions):
        object_name = permission.object.strip()
        if object_name != "*" and not _OBJECT_NAME.match(object_name):
            raise InvalidArgument(
                "object must be an object's singular name or *", field=f"{field}[{index}].object"
            )
        if not permission.actions:
            raise InvalidArgument(
                "actions must name at least one action", field=f"{field}[{index}].actions"
            )
        for action in permission.actions:
            if action not in ACTION_NAMES:
                raise InvalidArgument(
                    "actions must be READ, WRITE or DELETE", field=f"{field}[{index}].actions"
                )
        merged.setdefault(object_name, set()).update(permission.actions)
    return [
        {"object": name, "actions": [ACTION_NAMES[a] for a in ALL_ACTIONS if a in actions]}
        for name, actions in merged.items()
    ]


def flag_names(flags: Iterable[common_pb2.Flag], field: str = "flags") -> list[str]:
    names: list[str] = []
    for flag in flags:
        if flag not in FLAG_NAMES:
            raise InvalidArgument("unknown permission flag", field=field)
        if FLAG_NAMES[flag] not in names:
            names.append(FLAG_NAMES[flag])
    return names


def timestamp(value: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp


def to_proto(role: RoleRow) -> identity_pb2.RoleDef:
    grants = grants_of(role)
    return identity_pb2.RoleDef(
        id=str(role.id),
        name=role.name,
        description=role.description,
        is_builtin=role.builtin is not None,
        permissions=[
            identity_pb2.RolePermission(
                object=p.object, actions=list(p.actions), own_records_only=p.own_records_only
            )
            for p in grants.permissions
        ],
        flags=grants.flags,
        created_at=timestamp(role.created_at),
        updated_at=timestamp(role.updated_at),
    )
