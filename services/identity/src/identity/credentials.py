"""Authoritative state of credentials, read from Postgres, as the cache entries the gateway uses."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2
from identity.cache import REVOKED, rejected
from identity.db_types import Connection
from identity.principals import build_principal
from identity.roles import RoleRow, role_columns

Entries = dict[str, identity_pb2.CachedCredential]

_GRANTS = f"""
SELECT g.id, g.workspace_id, g.user_id, g.kind, g.scopes, g.expires_at, g.revoked_at,
       c.client_id AS oauth_client, u.email, {role_columns("r", "role_")}
FROM identity.grants g
JOIN identity.users u ON u.id = g.user_id
JOIN identity.roles r ON r.id = u.role_id
LEFT JOIN identity.oauth_clients c ON c.id = g.oauth_client_id
WHERE g.id = ANY($1::uuid[])
"""

_API_KEYS = f"""
SELECT k.id, k.workspace_id, k.secret_hash, k.expires_at, k.revoked_at, {role_columns("r", "role_")}
FROM identity.api_keys k JOIN identity.roles r ON r.id = k.role_id
WHERE k.id = ANY($1::uuid[])
"""

_PERSONAL_ACCESS_TOKENS = f"""
SELECT t.id, t.workspace_id, t.user_id, t.secret_hash, t.expires_at, t.revoked_at, u.email,
       {role_columns("r", "role_")}
FROM identity.personal_access_tokens t
JOIN identity.users u ON u.id = t.user_id
JOIN identity.roles r ON r.id = u.role_id
WHERE t.id = ANY($1::uuid[])
"""


def _unix(value: datetime | None) -> int:
    return int(value.timestamp()) if value is not None else 0


def _missing(ids: Iterable[uuid.UUID], found: Entries) -> Entries:
    return {
        str(credential_id): rejected(common_pb2.ERROR_REASON_TOKEN_INVALID)
        for credential_id in ids
        if str(credential_id) not in found
    }


async def load_grants(connection: Connection, ids: list[uuid.UUID]) -> Entries:
    entries: Entries = {}
    now = datetime.now(UTC)
    for row in await connection.fetch(_GRANTS, ids):
        key = str(row["id"])
        if row["revoked_at"] is not None:
            entries[key] = rejected(REVOKED)
        elif row["expires_at"] <= now:
            entries[key] = rejected(common_pb2.ERROR_REASON_TOKEN_EXPIRED)
        else:
            oauth = row["kind"] == "oauth"
            entries[key] = identity_pb2.CachedCredential(
                principal=build_principal(
                    kind=common_pb2.PRINCIPAL_KIND_OAUTH
                    if oauth
                    else common_pb2.PRINCIPAL_KIND_USER,
                    workspace_id=row["workspace_id"],
                    role=RoleRow.from_record(row, "role_"),
                    credential_id=row["id"],
                    user_id=row["user_id"],
                    email=row["email"],
                    scopes=list(row["scopes"]) if oauth else (),
                    oauth_client_id=row["oauth_client"] or "",
                )
            )
    return entries | _missing(ids, entries)


async def load_api_keys(connection: Connection, ids: list[uuid.UUID]) -> Entries:
    entries: Entries = {}
    for row in await connection.fetch(_API_KEYS, ids):
        key = str(row["id"])
        if row["revoked_at"] is not None:
            entries[key] = rejected(REVOKED)
            continue
        entries[key] = identity_pb2.CachedCredential(
            principal=build_principal(
                kind=common_pb2.PRINCIPAL_KIND_API_KEY,
                workspace_id=row["workspace_id"],
                role=RoleRow.from_record(row, "role_"),
                credential_id=row["id"],
            ),
            secret_hash=bytes(row["secret_hash"]),
            expires_at=_unix(row["expires_at"]),
        )
    return entries | _missing(ids, entries)


async def load_personal_access_tokens(connection: Connection, ids: list[uuid.UUID]) -> Entries:
    entries: Entries = {}
    for row in await connection.fetch(_PERSONAL_ACCESS_TOKENS, ids):
        key = str(row["id"])
        if row["revoked_at"] is not None:
            entries[key] = rejected(REVOKED)
            continue
        entries[key] = identity_pb2.CachedCredential(
            principal=build_principal(
                kind=common_pb2.PRINCIPAL_KIND_PERSONAL_ACCESS_TOKEN,
                workspace_id=row["workspace_id"],
                role=RoleRow.from_record(row, "role_"),
                credential_id=row["id"],
                user_id=row["user_id"],
                email=row["email"],
            ),
            secret_hash=bytes(row["secret_hash"]),
            expires_at=_unix(row["expires_at"]),
        )
    return entries | _missing(ids, entries)


async def entries_for_users(connection: Connection, user_ids: list[uuid.UUID]) -> Entries:
    """Fresh entries of every live credential acting as these users."""
    grant_ids = await connection.fetch(
        "SELECT id FROM identity.grants "
        "WHERE user_id = ANY($1::uuid[]) AND revoked_at IS NULL AND expires_at > now()",
        user_ids,
    )
    token_ids = await connection.fetch(
        "SELECT id FROM identity.personal_access_tokens "
        "WHERE user_id = ANY($1::uuid[]) AND revoked_at IS NULL",
        user_ids,
    )
    entries = await load_grants(connection, [row["id"] for row in grant_ids])
    entries |= await load_personal_access_tokens(connection, [row["id"] for row in token_ids])
    return entries


async def entries_for_role(connection: Connection, role_id: uuid.UUID) -> Entries:
    """Fresh entries of every live credential whose permissions come from this role."""
    users = await connection.fetch("SELECT id FROM identity.users WHERE role_id = $1", role_id)
    keys = await connection.fetch(
        "SELECT id FROM identity.api_keys WHERE role_id = $1 AND revoked_at IS NULL", role_id
    )
    entries = await entries_for_users(connection, [row["id"] for row in users])
    entries |= await load_api_keys(connection, [row["id"] for row in keys])
    return entries


async def live_credentials_of_users(
    connection: Connection, user_ids: list[uuid.UUID], *, grants_only: bool = False
) -> list[str]:
    """Ids of the live grants (and personal access tokens) of these users, to revoke them."""
    rows = await connection.fetch(
        "SELECT id FROM identity.grants WHERE user_id = ANY($1::uuid[]) AND revoked_at IS NULL",
        user_ids,
    )
    ids = [str(row["id"]) for row in rows]
    if not grants_only:
        rows = await connection.fetch(
            "SELECT id FROM identity.personal_access_tokens "
            "WHERE user_id = ANY($1::uuid[]) AND revoked_at IS NULL",
            user_ids,
        )
        ids += [str(row["id"]) for row in rows]
    return ids
