"""RoleService: built-in and custom roles; a change reaches every live credential at once."""

from __future__ import annotations

import uuid

import asyncpg
import grpc
from google.protobuf import empty_pb2

from crm.identity.v1 import identity_pb2, identity_pb2_grpc
from crmkit.errors import AlreadyExists, FailedPrecondition, InvalidArgument
from identity.access import require_admin
from identity.cache import workspace_change
from identity.credentials import entries_for_role
from identity.deps import Deps
from identity.pagination import after_clause, page_info, read_page
from identity.roles import (
    RoleRow,
    flag_names,
    permissions_json,
    role_name,
    to_proto,
)
from identity.servicers.workspace import find_role

MAX_DESCRIPTION = 500


def _description(value: str) -> str:
    cleaned = value.strip()
    if len(cleaned) > MAX_DESCRIPTION:
        raise InvalidArgument(
            f"description must have at most {MAX_DESCRIPTION} characters", field="description"
        )
    return cleaned


class RoleServicer(identity_pb2_grpc.RoleServiceServicer):
    def __init__(self, deps: Deps) -> None:
        self._deps = deps

    async def ListRoles(  # noqa: N802
        self, request: identity_pb2.ListRolesRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.ListRolesResponse:
        principal = self._deps.codec.require(context)
        page = read_page(request.page)
        rows = await self._deps.pool.fetch(
            "SELECT x.* FROM identity.roles x WHERE x.workspace_id = $1 "
            "AND " + after_clause("x", "roles", "$2") + " "
            "ORDER BY x.created_at, x.id LIMIT $3",
            uuid.UUID(principal.workspace_id),
            page.after,
            page.size + 1,
        )
        items, info = page_info(rows, page)
        return identity_pb2.ListRolesResponse(
            roles=[to_proto(RoleRow.from_record(row)) for row in items], page_info=info
        )

    async def GetRole(  # noqa: N802
        self, request: identity_pb2.IdRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.RoleDef:
        principal = self._deps.codec.require(context)
        role = await find_role(
            self._deps.pool, uuid.UUID(principal.workspace_id), request.id, field="id"
        )
        return to_proto(role)

    async def CreateRole(  # noqa: N802
        self, request: identity_pb2.CreateRoleRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.RoleDef:
        principal = self._deps.codec.require(context)
        require_admin(principal)
        name = role_name(request.name)
        try:
            row = await self._deps.pool.fetchrow(
                "INSERT INTO identity.roles (id, workspace_id, name, description, permissions, "
                "flags) VALUES ($1, $2, $3, $4, $5, $6) RETURNING *",
                uuid.uuid4(),
                uuid.UUID(principal.workspace_id),
                name,
                _description(request.description),
                permissions_json(request.permissions),
                flag_names(request.flags),
            )
            assert row is not None
        except asyncpg.UniqueViolationError:
            raise AlreadyExists(f"a role named {name} already exists", field="name") from None
        return to_proto(RoleRow.from_record(row))

    async def UpdateRole(  # noqa: N802
        self, request: identity_pb2.UpdateRoleRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.RoleDef:
        deps = self._deps
        principal = deps.codec.require(context)
        require_admin(principal)
        workspace_id = uuid.UUID(principal.workspace_id)
        async with workspace_change(deps.pool, principal.workspace_id) as connection:
            role = await find_role(connection, workspace_id, request.id, field="id")
            if role.builtin is not None:
                raise FailedPrecondition("built-in roles cannot be changed", field="id")
            name = role_name(request.name) if request.HasField("name") else role.name
            description = (
                _description(request.description)
                if request.HasField("description")
                else role.description
            )
            permissions = (
                permissions_json(request.permissions)
                if request.replace_permissions or request.permissions
                else role.permissions
            )
            flags = (
                flag_names(request.flags) if request.replace_flags or request.flags else role.flags
            )
            try:
                row = await connection.fetchrow(
                    "UPDATE identity.roles SET name = $2, description = $3, permissions = $4, "
                    "flags = $5, updated_at = now() WHERE id = $1 RETURNING *",
                    role.id,
                    name,
                    description,
                    permissions,
                    flags,
                )
                assert row is not None
            except asyncpg.UniqueViolationError:
                raise AlreadyExists(f"a role named {name} already exists", field="name") from None
            await deps.cache.put(await entries_for_role(connection, role.id))
        return to_proto(RoleRow.from_record(row))

    async def DeleteRole(  # noqa: N802
        self, request: identity_pb2.IdRequest, context: grpc.aio.ServicerContext
    ) -> empty_pb2.Empty:
        deps = self._deps
        principal = deps.codec.require(context)
        require_admin(principal)
        workspace_id = uuid.UUID(principal.workspace_id)
        async with workspace_change(deps.pool, principal.workspace_id) as connection:
            role = await find_role(connection, workspace_id, request.id, field="id")
            if role.builtin is not None:
                raise FailedPrecondition("built-in roles cannot be deleted", field="id")
            members = await connection.fetchval(
                "SELECT count(*) FROM identity.users WHERE role_id = $1", role.id
            )
            keys = await connection.fetchval(
                "SELECT count(*) FROM identity.api_keys WHERE role_id = $1 AND revoked_at IS NULL",
                role.id,
            )
            if members or keys:
                raise FailedPrecondition(
                    f"the role is assigned to {members} member(s) and {keys} API key(s); "
                    "assign them another role first",
                    field="id",
                )
            await connection.execute("DELETE FROM identity.api_keys WHERE role_id = $1", role.id)
            await connection.execute("DELETE FROM identity.roles WHERE id = $1", role.id)
        return empty_pb2.Empty()
