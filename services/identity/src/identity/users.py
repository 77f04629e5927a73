"""Users and workspaces as rows and as protos."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from crm.identity.v1 import identity_pb2
from identity.roles import RoleRow, role_columns, timestamp

USER_COLUMNS = (
    "u.id, u.workspace_id, u.email, u.password_hash, u.first_name, u.last_name, "
    "u.role_id, u.created_at"
)


@dataclass(frozen=True)
class UserRow:
    id: uuid.UUID
    workspace_id: uuid.UUID
    email: str
    password_hash: str
    first_name: str
    last_name: str
    role_id: uuid.UUID
    created_at: datetime

    @classmethod
    def from_record(cls, record: asyncpg.Record) -> UserRow:
        return cls(
            id=record["id"],
            workspace_id=record["workspace_id"],
            email=record["email"],
            password_hash=record["password_hash"],
            first_name=record["first_name"],
            last_name=record["last_name"],
            role_id=record["role_id"],
            created_at=record["created_at"],
        )

    def to_proto(self) -> identity_pb2.User:
        return identity_pb2.User(
            id=str(self.id),
            email=self.email,
            first_name=self.first_name,
            last_name=self.last_name,
        )


# A user with its role, for queries that build principals or members.
USER_WITH_ROLE = f"""
SELECT {USER_COLUMNS}, {role_columns("r", "role_")}
FROM identity.users u JOIN identity.roles r ON r.id = u.role_id
"""


def member_proto(user: UserRow, role: RoleRow) -> identity_pb2.Member:
    return identity_pb2.Member(
        user=user.to_proto(),
        role_id=str(role.id),
        role_name=role.name,
        created_at=timestamp(user.created_at),
    )


def workspace_proto(record: asyncpg.Record) -> identity_pb2.Workspace:
    return identity_pb2.Workspace(
        id=str(record["id"]), name=record["name"], created_at=timestamp(record["created_at"])
    )
