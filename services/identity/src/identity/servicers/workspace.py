"""WorkspaceService: the workspace and its members (adding, role changes, removal)."""

from __future__ import annotations

import uuid

import asyncpg
import grpc
from google.protobuf import empty_pb2

from crm.identity.v1 import identity_pb2, identity_pb2_grpc
from crmkit.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from identity import validation
from identity.access import require_admin
from identity.cache import workspace_change
from identity.credentials import entries_for_users, live_credentials_of_users
from identity.db_types import Connection, Executor
from identity.deps import Deps
from identity.pagination import after_clause, page_info, read_page
from identity.passwords import check_policy
from identity.roles import ADMIN, MEMBER, RoleRow
from identity.users import USER_WITH_ROLE, UserRow, member_proto, workspace_proto

MAX_FIND_MEMBERS = 1000


def _uuid_or_none(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


async def find_role(
    connection: Executor,
    workspace_id: uuid.UUID,
    role_id: str,
    field: str = "roleId",
) -> RoleRow:
    """A role of this workspace by id; roles of other workspaces do not exist here."""
    row = await connection.fetchrow(
        "SELECT * FROM identity.roles WHERE id = $1 AND workspace_id = $2",
        uuid.UUID(validation.uuid_text(role_id, field)),
        workspace_id,
    )
    if row is None:
        raise NotFound("role not found", field=field)
    return RoleRow.from_record(row)


async def builtin_role(connection: Executor, workspace_id: uuid.UUID, builtin: str) -> RoleRow:
    row = await connection.fetchrow(
        "SELECT * FROM identity.roles WHERE workspace_id = $1 AND builtin = $2",
        workspace_id,
        builtin,
    )
    assert row is not None, "every workspace has its built-in roles"
    return RoleRow.from_record(row)


async def _member(
    connection: Connection, workspace_id: uuid.UUID, user_id: str, *, lock: bool = False
) -> tuple[UserRow, RoleRow]:
    row = await connection.fetchrow(
        USER_WITH_ROLE
        + " WHERE u.id = $1 AND u.workspace_id = $2"
        + (" FOR UPDATE OF u" if lock else ""),
        uuid.UUID(validation.uuid_text(user_id, "userId")),
        workspace_id,
    )
    if row is None:
        raise NotFound("member not found", field="userId")
    return UserRow.from_record(row), RoleRow.from_record(row, "role_")


async def _ensure_another_admin(
    connection: Connection, workspace_id: uuid.UUID, user_id: uuid.UUID
) -> None:
    others = await connection.fetchval(
        "SELECT count(*) FROM identity.users u JOIN identity.roles r ON r.id = u.role_id "
        "WHERE u.workspace_id = $1 AND r.builtin = 'admin' AND u.id <> $2",
        workspace_id,
        user_id,
    )
    if not others:
        raise FailedPrecondition("the workspace must keep at least one Admin", field="userId")


class WorkspaceServicer(identity_pb2_grpc.WorkspaceServiceServicer):
    def __init__(self, deps: Deps) -> None:
        self._deps = deps

    async def GetWorkspace(  # noqa: N802
        self, request: empty_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> identity_pb2.Workspace:
        principal = self._deps.codec.require(context)
        row = await self._deps.pool.fetchrow(
            "SELECT id, name, created_at FROM identity.workspaces WHERE id = $1",
            uuid.UUID(principal.workspace_id),
        )
        if row is None:
            raise NotFound("workspace not found")
        return workspace_proto(row)

    async def ListMembers(  # noqa: N802
        self, request: identity_pb2.ListMembersRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.ListMembersResponse:
        principal = self._deps.codec.require(context)
        page = read_page(request.page)
        rows = await self._deps.pool.fetch(
            USER_WITH_ROLE + " WHERE u.workspace_id = $1 "
            "AND " + after_clause("u", "users", "$2") + " "
            "ORDER BY u.created_at, u.id LIMIT $3",
            uuid.UUID(principal.workspace_id),
            page.after,
            page.size + 1,
        )
        items, info = page_info(rows, page)
        return identity_pb2.ListMembersResponse(
            members=[
                member_proto(UserRow.from_record(row), RoleRow.from_record(row, "role_"))
                for row in items
            ],
            page_info=info,
        )

    async def FindMembers(  # noqa: N802
        self, request: identity_pb2.FindMembersRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.FindMembersResponse:
        principal = self._deps.codec.require(context)
        if len(request.user_ids) > MAX_FIND_MEMBERS:
            raise InvalidArgument(f"at most {MAX_FIND_MEMBERS} user ids per call", field="userIds")
        ids = {parsed for parsed in map(_uuid_or_none, request.user_ids) if parsed is not None}
        if not ids:
            return identity_pb2.FindMembersResponse()
        rows = await self._deps.pool.fetch(
            "SELECT id::text FROM identity.users WHERE workspace_id = $1 AND id = ANY($2::uuid[])",
            uuid.UUID(principal.workspace_id),
            list(ids),
        )
        return identity_pb2.FindMembersResponse(user_ids=[row[0] for row in rows])

    async def AddWorkspaceMember(  # noqa: N802
        self, request: identity_pb2.AddWorkspaceMemberRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.Member:
        deps = self._deps
        principal = deps.codec.require(context)
        require_admin(principal)
        workspace_id = uuid.UUID(principal.workspace_id)
        email = validation.email(request.email)
        check_policy(request.password)
        first_name = validation.name(request.first_name, "firstName", required=False)
        last_name = validation.name(request.last_name, "lastName", required=False)
        role = (
            await find_role(deps.pool, workspace_id, request.role_id)
            if request.role_id
            else await builtin_role(deps.pool, workspace_id, MEMBER)
        )
        password_hash = await deps.passwords.hash(request.password)
        try:
            row = await deps.pool.fetchrow(
                "INSERT INTO identity.users (id, workspace_id, email, password_hash, first_name, "
                "last_name, role_id) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING *",
                uuid.uuid4(),
                workspace_id,
                email,
                password_hash,
                first_name,
                last_name,
                role.id,
            )
            assert row is not None
        except asyncpg.UniqueViolationError:
            raise AlreadyExists(
                "a member with this email already exists in the workspace", field="email"
            ) from None
        except asyncpg.ForeignKeyViolationError:  # the role was deleted meanwhile
            raise NotFound("role not found", field="roleId") from None
        return member_proto(UserRow.from_record(row), role)

    async def UpdateMemberRole(  # noqa: N802
        self, request: identity_pb2.UpdateMemberRoleRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.Member:
        deps = self._deps
        principal = deps.codec.require(context)
        require_admin(principal)
        workspace_id = uuid.UUID(principal.workspace_id)
        async with workspace_change(deps.pool, principal.workspace_id) as connection:
            user, current = await _member(connection, workspace_id, request.user_id, lock=True)
            role = await find_role(connection, workspace_id, request.role_id)
            if current.builtin == ADMIN and role.builtin != ADMIN:
                await _ensure_another_admin(connection, workspace_id, user.id)
            await connection.execute(
                "UPDATE identity.users SET role_id = $2, updated_at = now() WHERE id = $1",
                user.id,
                role.id,
            )
            await deps.cache.put(await entries_for_users(connection, [user.id]))
        return member_proto(user, role)

    async def RemoveMember(  # noqa: N802
        self, request: identity_pb2.RemoveMemberRequest, context: grpc.aio.ServicerContext
    ) -> empty_pb2.Empty:
        deps = self._deps
        principal = deps.codec.require(context)
        require_admin(principal)
        workspace_id = uuid.UUID(principal.workspace_id)
        async with workspace_change(deps.pool, principal.workspace_id) as connection:
            user, role = await _member(connection, workspace_id, request.user_id, lock=True)
            if role.builtin == ADMIN:
                await _ensure_another_admin(connection, workspace_id, user.id)
            revoked = await live_credentials_of_users(connection, [user.id])
            await deps.cache.revoke(revoked)
            await connection.execute("DELETE FROM identity.users WHERE id = $1", user.id)
        deps.metrics.revocations.labels("member_removed").inc(len(revoked))
        return empty_pb2.Empty()
