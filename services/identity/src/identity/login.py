"""Checking an email and password: same answer and same cost whether or not the email exists."""

from __future__ import annotations

import uuid

from crm.common.v1 import common_pb2
from crmkit.errors import InvalidArgument, Unauthenticated
from identity.deps import Deps
from identity.passwords import MAX_LENGTH
from identity.roles import RoleRow
from identity.users import USER_WITH_ROLE, UserRow

WRONG_CREDENTIALS = "invalid email or password"


def required(value: str, field: str) -> str:
    if not value.strip():
        raise InvalidArgument(f"{field} is required", field=field)
    return value


async def check_password(
    deps: Deps,
    *,
    email: str,
    password: str,
    client_ip: str,
    workspace_id: uuid.UUID | None = None,
) -> tuple[UserRow, RoleRow]:
    """The account these credentials open, under brute-force limits, or Unauthenticated."""
    email = required(email, "email").strip().lower()
    required(password, "password")
    if len(password) > MAX_LENGTH:  # never a valid password: refused before any hashing
        raise InvalidArgument(
            f"password must have at most {MAX_LENGTH} characters", field="password"
        )
    # Per (email, IP), not per email: a guesser elsewhere cannot lock the owner out (OWASP).
    attempt = await deps.limiter.begin([("ip", client_ip), ("email-ip", f"{email} {client_ip}")])
    query = USER_WITH_ROLE + " WHERE u.email = $1"
    args: list[object] = [email]
    if workspace_id is not None:
        query += " AND u.workspace_id = $2"
        args.append(workspace_id)
    rows = await deps.pool.fetch(query + " ORDER BY u.created_at", *args)
    matches: list[tuple[UserRow, RoleRow]] = []
    if not rows:
        await deps.passwords.burn(password)
    for row in rows:
        user = UserRow.from_record(row)
        if await deps.passwords.verify(user.password_hash, password):
            matches.append((user, RoleRow.from_record(row, "role_")))
    if not matches:
        deps.metrics.logins.labels("failed").inc()
        raise Unauthenticated(WRONG_CREDENTIALS, reason=common_pb2.ERROR_REASON_TOKEN_INVALID)
    await deps.limiter.succeeded(attempt)
    if len(matches) > 1:
        names = ", ".join(f"{user.workspace_id}" for user, _ in matches)
        raise InvalidArgument(
            f"this email has accounts in several workspaces; pass workspaceId (one of {names})",
            field="workspaceId",
        )
    user, role = matches[0]
    if deps.passwords.needs_rehash(user.password_hash):
        await deps.pool.execute(
            "UPDATE identity.users SET password_hash = $2, updated_at = now() WHERE id = $1",
            user.id,
            await deps.passwords.hash(password),
        )
    deps.metrics.logins.labels("succeeded").inc()
    return user, role
