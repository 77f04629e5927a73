"""The current principal of a webhook's or workflow's author (a user or an API key).

Webhooks and workflows pass records on only while whoever last saved them may still read them
(docs/auth.md); they ask here, through AuthService/ResolveAuthor, and cache the answer briefly.
"""

from __future__ import annotations

import uuid

from crm.common.v1 import common_pb2
from identity.db_types import Executor
from identity.principals import build_principal
from identity.roles import RoleRow, role_columns

_USER = f"""
SELECT u.id, u.email, {role_columns("r", "role_")}
FROM identity.users u JOIN identity.roles r ON r.id = u.role_id
WHERE u.id = $1 AND u.workspace_id = $2
"""

_API_KEY = f"""
SELECT k.id, {role_columns("r", "role_")}
FROM identity.api_keys k JOIN identity.roles r ON r.id = k.role_id
WHERE k.id = $1 AND k.workspace_id = $2 AND k.revoked_at IS NULL
  AND (k.expires_at IS NULL OR k.expires_at > now())
"""


async def user_author(
    connection: Executor, workspace_id: uuid.UUID, user_id: uuid.UUID
) -> common_pb2.Principal | None:
    """The member's principal (their role's access), or None when they are no member."""
    row = await connection.fetchrow(_USER, user_id, workspace_id)
    if row is None:
        return None
    return build_principal(
        kind=common_pb2.PRINCIPAL_KIND_USER,
        workspace_id=workspace_id,
        role=RoleRow.from_record(row, "role_"),
        credential_id=None,
        user_id=row["id"],
        email=row["email"],
    )


async def api_key_author(
    connection: Executor, workspace_id: uuid.UUID, key_id: uuid.UUID
) -> common_pb2.Principal | None:
    """The key's principal, or None when it was deleted or has expired."""
    row = await connection.fetchrow(_API_KEY, key_id, workspace_id)
    if row is None:
        return None
    return build_principal(
        kind=common_pb2.PRINCIPAL_KIND_API_KEY,
        workspace_id=workspace_id,
        role=RoleRow.from_record(row, "role_"),
        credential_id=row["id"],
    )
