"""Identity's GraphQL operations (current user, members, roles, API keys, personal access tokens,
OAuth clients): a self-contained schema part, served on /graphql and /metadata.

Lists take `first` (default 50, at most 200) and `after` (the id of the last item already
seen) and answer a plain list, in creation order.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import Enum

import strawberry
from google.protobuf import empty_pb2
from google.protobuf.timestamp_pb2 import Timestamp

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2
from gateway.graphql.context import GraphQLContext
from gateway.graphql.parts import SchemaPart
from gateway.pagination import page_request

Info = strawberry.Info[GraphQLContext, None]


@strawberry.enum(description="What a permission allows on an object's records.")
class PermissionAction(Enum):
    READ = "READ"
    WRITE = "WRITE"
    DELETE = "DELETE"


@strawberry.enum(description="Workspace-wide permissions beside record access.")
class PermissionFlag(Enum):
    API_KEYS_AND_WEBHOOKS = "API_KEYS_AND_WEBHOOKS"
    WORKFLOWS = "WORKFLOWS"
    DATA_MODEL = "DATA_MODEL"
    WORKSPACE_MEMBERS = "WORKSPACE_MEMBERS"


_ACTIONS: dict[PermissionAction, common_pb2.Action] = {
    PermissionAction.READ: common_pb2.ACTION_READ,
    PermissionAction.WRITE: common_pb2.ACTION_WRITE,
    PermissionAction.DELETE: common_pb2.ACTION_DELETE,
}
_FLAGS: dict[PermissionFlag, common_pb2.Flag] = {
    PermissionFlag.API_KEYS_AND_WEBHOOKS: common_pb2.FLAG_API_KEYS_AND_WEBHOOKS,
    PermissionFlag.WORKFLOWS: common_pb2.FLAG_WORKFLOWS,
    PermissionFlag.DATA_MODEL: common_pb2.FLAG_DATA_MODEL,
    PermissionFlag.WORKSPACE_MEMBERS: common_pb2.FLAG_WORKSPACE_MEMBERS,
}
_ACTION_OF = {value: action for action, value in _ACTIONS.items()}
_FLAG_OF = {value: flag for flag, value in _FLAGS.items()}


def _action(value: common_pb2.Action) -> PermissionAction:
    return _ACTION_OF[value]


def _flag(value: common_pb2.Flag) -> PermissionFlag:
    return _FLAG_OF[value]


def _action_value(action: PermissionAction) -> common_pb2.Action:
    return _ACTIONS[action]


def _flag_value(flag: PermissionFlag) -> common_pb2.Flag:
    return _FLAGS[flag]


def _time(stamp: Timestamp) -> datetime:
    return stamp.ToDatetime(tzinfo=UTC)


def _optional_time(message: object, field: str) -> datetime | None:
    if not message.HasField(field):  # type: ignore[attr-defined]
        return None
    return _time(getattr(message, field))


def _timestamp(value: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(value if value.tzinfo else value.replace(tzinfo=UTC))
    return stamp


# -- types -------------------------------------------------------------------------------------
@strawberry.type(description="Actions allowed on the records of one object (`*`: every object).")
class ObjectPermission:
    object: str
    actions: list[PermissionAction]
    own_records_only: bool = strawberry.field(
        description="Only records whose ownerId is the caller (the built-in Member role)."
    )


def _permissions(
    items: list[identity_pb2.ObjectActions] | list[identity_pb2.RolePermission],
) -> list[ObjectPermission]:
    return [
        ObjectPermission(
            object=item.object,
            actions=[_action(action) for action in item.actions],
            own_records_only=item.own_records_only,
        )
        for item in items
    ]


@strawberry.type
class Workspace:
    id: uuid.UUID
    name: str


@strawberry.type(description="Who is calling: a user, an API key or an OAuth client for a user.")
class CurrentUser:
    id: uuid.UUID = strawberry.field(description="The user's id (the API key's id for API keys).")
    email: str | None
    first_name: str | None
    last_name: str | None
    role: str = strawberry.field(description="Role name: Admin, Member or a custom role's name.")
    kind: str = strawberry.field(
        description="USER, API_KEY, OAUTH or PERSONAL_ACCESS_TOKEN: the credential used."
    )
    permissions: list[ObjectPermission] = strawberry.field(
        description="Effective record permissions (OAuth scopes already applied)."
    )
    flags: list[PermissionFlag]
    workspace: Workspace


@strawberry.type
class WorkspaceMember:
    id: uuid.UUID
    email: str
    first_name: str
    last_name: str
    role_id: uuid.UUID
    role_name: str
    created_at: datetime

    @classmethod
    def of(cls, member: identity_pb2.Member) -> WorkspaceMember:
        return cls(
            id=uuid.UUID(member.user.id),
            email=member.user.email,
            first_name=member.user.first_name,
            last_name=member.user.last_name,
            role_id=uuid.UUID(member.role_id),
            role_name=member.role_name,
            created_at=_time(member.created_at),
        )


@strawberry.type
class Role:
    id: uuid.UUID
    name: str
    description: str
    is_builtin: bool
    permissions: list[ObjectPermission]
    flags: list[PermissionFlag]
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, role: identity_pb2.RoleDef) -> Role:
        return cls(
            id=uuid.UUID(role.id),
            name=role.name,
            description=role.description,
            is_builtin=role.is_builtin,
            permissions=_permissions(list(role.permissions)),
            flags=[_flag(flag) for flag in role.flags],
            created_at=_time(role.created_at),
            updated_at=_time(role.updated_at),
        )


@strawberry.type
class ApiKey:
    id: uuid.UUID
    name: str
    expires_at: datetime | None
    role_id: uuid.UUID
    role_name: str
    created_at: datetime
    token: str | None = strawberry.field(
        description="The key itself: only in createApiKey's answer, never again."
    )

    @classmethod
    def of(cls, key: identity_pb2.ApiKey) -> ApiKey:
        return cls(
            id=uuid.UUID(key.id),
            name=key.name,
            expires_at=_optional_time(key, "expires_at"),
            role_id=uuid.UUID(key.role_id),
            role_name=key.role_name,
            created_at=_time(key.created_at),
            token=key.token or None,
        )


@strawberry.type
class PersonalAccessToken:
    id: uuid.UUID
    name: str
    expires_at: datetime | None
    created_at: datetime
    token: str | None = strawberry.field(
        description="The token itself: only in createPersonalAccessToken's answer, never again."
    )

    @classmethod
    def of(cls, token: identity_pb2.PersonalAccessToken) -> PersonalAccessToken:
        return cls(
            id=uuid.UUID(token.id),
            name=token.name,
            expires_at=_optional_time(token, "expires_at"),
            created_at=_time(token.created_at),
            token=token.token or None,
        )


@strawberry.type
class OAuthClient:
    id: uuid.UUID
    client_id: str
    client_secret: str | None = strawberry.field(
        description="Only in createOAuthClient's answer, never again; null for public clients."
    )
    name: str
    redirect_uris: list[str]
    scopes: list[str]
    is_public: bool
    created_at: datetime

    @classmethod
    def of(cls, client: identity_pb2.OAuthClient) -> OAuthClient:
        return cls(
            id=uuid.UUID(client.id),
            client_id=client.client_id,
            client_secret=client.client_secret or None,
            name=client.name,
            redirect_uris=list(client.redirect_uris),
            scopes=list(client.scopes),
            is_public=client.is_public,
            created_at=_time(client.created_at),
        )


# -- inputs ------------------------------------------------------------------------------------
@strawberry.input
class AddWorkspaceMemberInput:
    email: str
    password: str
    first_name: str = ""
    last_name: str = ""
    role_id: uuid.UUID | None = strawberry.field(
        default=None, description="Default: the built-in Member role."
    )


@strawberry.input
class UpdateWorkspaceMemberRoleInput:
    user_id: uuid.UUID
    role_id: uuid.UUID


@strawberry.input
class RolePermissionInput:
    object: str = strawberry.field(description="An object's singular name, or * for every object.")
    actions: list[PermissionAction]


@strawberry.input
class CreateRoleInput:
    name: str
    description: str = ""
    permissions: list[RolePermissionInput] = strawberry.field(default_factory=list)
    flags: list[PermissionFlag] = strawberry.field(default_factory=list)


@strawberry.input
class UpdateRoleInput:
    id: uuid.UUID
    name: str | None = None
    description: str | None = None
    permissions: list[RolePermissionInput] | None = strawberry.field(
        default=None, description="When given, replaces every permission of the role."
    )
    flags: list[PermissionFlag] | None = strawberry.field(
        default=None, description="When given, replaces every flag of the role."
    )


@strawberry.input
class CreateApiKeyInput:
    name: str
    expires_at: datetime | None = strawberry.field(default=None, description="Default: never.")
    role_id: uuid.UUID | None = strawberry.field(
        default=None, description="Default: Admin (for Admins; others get their own role)."
    )


@strawberry.input
class CreatePersonalAccessTokenInput:
    name: str
    expires_at: datetime | None = strawberry.field(default=None, description="Default: never.")


@strawberry.input
class CreateOAuthClientInput:
    name: str
    redirect_uris: list[str]
    scopes: list[str] = strawberry.field(
        description="What the client may ask for: read:<object>, write:<object>, read:*, "
        "write:* or *."
    )
    is_public: bool = strawberry.field(
        default=False, description="Public clients (no secret) must use PKCE (S256)."
    )


def _role_permissions(items: list[RolePermissionInput]) -> list[identity_pb2.RolePermission]:
    return [
        identity_pb2.RolePermission(
            object=item.object, actions=[_action_value(action) for action in item.actions]
        )
        for item in items
    ]


# -- operations ------------------------------------------------------------------------------
async def _current_user(info: Info) -> CurrentUser:
    context = info.context
    user = await context.ask(context.state.upstreams.auth.GetCurrentUser, empty_pb2.Empty())
    return CurrentUser(
        id=uuid.UUID(user.id),
        email=user.email or None,
        first_name=user.first_name or None,
        last_name=user.last_name or None,
        role=user.role,
        kind=common_pb2.PrincipalKind.Name(user.kind).removeprefix("PRINCIPAL_KIND_"),
        permissions=_permissions(list(user.permissions)),
        flags=[_flag(flag) for flag in user.flags],
        workspace=Workspace(id=uuid.UUID(user.workspace.id), name=user.workspace.name),
    )


async def _workspace_members(
    info: Info, first: int | None = None, after: uuid.UUID | None = None
) -> list[WorkspaceMember]:
    context = info.context
    reply = await context.ask(
        context.state.upstreams.workspaces.ListMembers,
        identity_pb2.ListMembersRequest(page=page_request(first, after)),
    )
    return [WorkspaceMember.of(member) for member in reply.members]


async def _roles(
    info: Info, first: int | None = None, after: uuid.UUID | None = None
) -> list[Role]:
    context = info.context
    reply = await context.ask(
        context.state.upstreams.roles.ListRoles,
        identity_pb2.ListRolesRequest(page=page_request(first, after)),
    )
    return [Role.of(role) for role in reply.roles]


async def _role(info: Info, id: uuid.UUID) -> Role:
    context = info.context
    role = await context.ask(
        context.state.upstreams.roles.GetRole,
        identity_pb2.IdRequest(id=str(id)),
    )
    return Role.of(role)


async def _api_keys(
    info: Info, first: int | None = None, after: uuid.UUID | None = None
) -> list[ApiKey]:
    context = info.context
    reply = await context.ask(
        context.state.upstreams.credentials.ListApiKeys,
        identity_pb2.ListApiKeysRequest(page=page_request(first, after)),
    )
    return [ApiKey.of(key) for key in reply.api_keys]


async def _personal_access_tokens(
    info: Info, first: int | None = None, after: uuid.UUID | None = None
) -> list[PersonalAccessToken]:
    context = info.context
    reply = await context.ask(
        context.state.upstreams.credentials.ListPersonalAccessTokens,
        identity_pb2.ListPersonalAccessTokensRequest(page=page_request(first, after)),
    )
    return [PersonalAccessToken.of(token) for token in reply.tokens]


async def _oauth_clients(
    info: Info, first: int | None = None, after: uuid.UUID | None = None
) -> list[OAuthClient]:
    context = info.context
    reply = await context.ask(
        context.state.upstreams.oauth.ListOAuthClients,
        identity_pb2.ListOAuthClientsRequest(page=page_request(first, after)),
    )
    return [OAuthClient.of(client) for client in reply.clients]


async def _add_workspace_member(info: Info, input: AddWorkspaceMemberInput) -> WorkspaceMember:
    context = info.context
    member = await context.ask(
        context.state.upstreams.workspaces.AddWorkspaceMember,
        identity_pb2.AddWorkspaceMemberRequest(
            email=input.email,
            password=input.password,
            first_name=input.first_name,
            last_name=input.last_name,
            role_id=str(input.role_id) if input.role_id else "",
        ),
    )
    return WorkspaceMember.of(member)


async def _update_workspace_member_role(
    info: Info, input: UpdateWorkspaceMemberRoleInput
) -> WorkspaceMember:
    context = info.context
    member = await context.ask(
        context.state.upstreams.workspaces.UpdateMemberRole,
        identity_pb2.UpdateMemberRoleRequest(
            user_id=str(input.user_id), role_id=str(input.role_id)
        ),
    )
    return WorkspaceMember.of(member)


async def _remove_workspace_member(info: Info, user_id: uuid.UUID) -> uuid.UUID:
    context = info.context
    await context.ask(
        context.state.upstreams.workspaces.RemoveMember,
        identity_pb2.RemoveMemberRequest(user_id=str(user_id)),
    )
    return user_id


async def _create_role(info: Info, input: CreateRoleInput) -> Role:
    context = info.context
    role = await context.ask(
        context.state.upstreams.roles.CreateRole,
        identity_pb2.CreateRoleRequest(
            name=input.name,
            description=input.description,
            permissions=_role_permissions(input.permissions),
            flags=[_flag_value(flag) for flag in input.flags],
        ),
    )
    return Role.of(role)


async def _update_role(info: Info, input: UpdateRoleInput) -> Role:
    context = info.context
    request = identity_pb2.UpdateRoleRequest(id=str(input.id))
    if input.name is not None:
        request.name = input.name
    if input.description is not None:
        request.description = input.description
    if input.permissions is not None:
        request.replace_permissions = True
        request.permissions.extend(_role_permissions(input.permissions))
    if input.flags is not None:
        request.replace_flags = True
        request.flags.extend(_flag_value(flag) for flag in input.flags)
    role = await context.ask(context.state.upstreams.roles.UpdateRole, request)
    return Role.of(role)


async def _delete_role(info: Info, id: uuid.UUID) -> uuid.UUID:
    context = info.context
    await context.ask(
        context.state.upstreams.roles.DeleteRole,
        identity_pb2.IdRequest(id=str(id)),
    )
    return id


async def _create_api_key(info: Info, input: CreateApiKeyInput) -> ApiKey:
    context = info.context
    request = identity_pb2.CreateApiKeyRequest(
        name=input.name, role_id=str(input.role_id) if input.role_id else ""
    )
    if input.expires_at is not None:
        request.expires_at.CopyFrom(_timestamp(input.expires_at))
    key = await context.ask(context.state.upstreams.credentials.CreateApiKey, request)
    return ApiKey.of(key)


async def _delete_api_key(info: Info, id: uuid.UUID) -> uuid.UUID:
    context = info.context
    await context.ask(
        context.state.upstreams.credentials.DeleteApiKey,
        identity_pb2.IdRequest(id=str(id)),
    )
    return id


async def _create_personal_access_token(
    info: Info, input: CreatePersonalAccessTokenInput
) -> PersonalAccessToken:
    context = info.context
    request = identity_pb2.CreatePersonalAccessTokenRequest(name=input.name)
    if input.expires_at is not None:
        request.expires_at.CopyFrom(_timestamp(input.expires_at))
    token = await context.ask(
        context.state.upstreams.credentials.CreatePersonalAccessToken,
        request,
    )
    return PersonalAccessToken.of(token)


async def _delete_personal_access_token(info: Info, id: uuid.UUID) -> uuid.UUID:
    context = info.context
    await context.ask(
        context.state.upstreams.credentials.DeletePersonalAccessToken,
        identity_pb2.IdRequest(id=str(id)),
    )
    return id


async def _create_oauth_client(info: Info, input: CreateOAuthClientInput) -> OAuthClient:
    context = info.context
    client = await context.ask(
        context.state.upstreams.oauth.CreateOAuthClient,
        identity_pb2.CreateOAuthClientRequest(
            name=input.name,
            redirect_uris=input.redirect_uris,
            scopes=input.scopes,
            is_public=input.is_public,
        ),
    )
    return OAuthClient.of(client)


async def _delete_oauth_client(info: Info, id: uuid.UUID) -> uuid.UUID:
    context = info.context
    await context.ask(
        context.state.upstreams.oauth.DeleteOAuthClient,
        identity_pb2.IdRequest(id=str(id)),
    )
    return id


@strawberry.type
class IdentityQuery:
    current_user: CurrentUser = strawberry.field(
        resolver=_current_user,
        description="The caller: user, API key or OAuth token, and what it may do.",
    )
    workspace_members: list[WorkspaceMember] = strawberry.field(resolver=_workspace_members)
    roles: list[Role] = strawberry.field(resolver=_roles)
    role: Role = strawberry.field(resolver=_role)
    api_keys: list[ApiKey] = strawberry.field(resolver=_api_keys)
    personal_access_tokens: list[PersonalAccessToken] = strawberry.field(
        resolver=_personal_access_tokens
    )
    oauth_clients: list[OAuthClient] = strawberry.field(resolver=_oauth_clients)


@strawberry.type
class IdentityMutation:
    add_workspace_member: WorkspaceMember = strawberry.mutation(
        resolver=_add_workspace_member, description="Admin only: a new user in this workspace."
    )
    update_workspace_member_role: WorkspaceMember = strawberry.mutation(
        resolver=_update_workspace_member_role,
        description="Admin only: give a member another role (effective at once).",
    )
    remove_workspace_member: uuid.UUID = strawberry.mutation(
        resolver=_remove_workspace_member,
        description="Admin only: remove a member; their sessions end at once.",
    )
    create_role: Role = strawberry.mutation(
        resolver=_create_role, description="Admin only: a custom role."
    )
    update_role: Role = strawberry.mutation(
        resolver=_update_role, description="Admin only: change a custom role (effective at once)."
    )
    delete_role: uuid.UUID = strawberry.mutation(
        resolver=_delete_role, description="Admin only: delete a custom role no one has."
    )
    create_api_key: ApiKey = strawberry.mutation(
        resolver=_create_api_key,
        description="Needs API_KEYS_AND_WEBHOOKS. The token is shown only here.",
    )
    delete_api_key: uuid.UUID = strawberry.mutation(
        resolver=_delete_api_key,
        description="Needs API_KEYS_AND_WEBHOOKS. Later calls with it get 401.",
    )
    create_personal_access_token: PersonalAccessToken = strawberry.mutation(
        resolver=_create_personal_access_token,
        description="A token acting as you. It is shown only here.",
    )
    delete_personal_access_token: uuid.UUID = strawberry.mutation(
        resolver=_delete_personal_access_token
    )
    create_oauth_client: OAuthClient = strawberry.mutation(
        resolver=_create_oauth_client,
        name="createOAuthClient",
        description="Admin only. The client secret is shown only here.",
    )
    delete_oauth_client: uuid.UUID = strawberry.mutation(
        resolver=_delete_oauth_client,
        name="deleteOAuthClient",
        description="Admin only: its tokens stop working at once.",
    )


IDENTITY_PART = SchemaPart(
    name="identity", query=IdentityQuery, mutation=IdentityMutation, metadata=True
)
