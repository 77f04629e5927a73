"""AuthService: sign-up, login, sessions, password reset, credential resolution, current user."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
import uuid
from datetime import UTC, datetime, timedelta

import grpc
from google.protobuf import empty_pb2

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2, identity_pb2_grpc
from crm.metadata.v1 import metadata_pb2
from crmkit.errors import (
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    from_rpc_error,
)
from crmkit.principal import system_principal
from crmkit.tokens import (
    TokenType,
    accept_credential,
    decode_jwt,
    encode_jwt,
    grant_of,
    invalid_token,
)
from identity import mail, validation
from identity.access import require_user
from identity.authors import api_key_author, user_author
from identity.cache import lock_workspace
from identity.credentials import Entries, load_api_keys, load_grants, load_personal_access_tokens
from identity.deps import Deps
from identity.login import check_password, required
from identity.passwords import check_policy
from identity.principals import effective_permissions
from identity.roles import ADMIN, BUILTIN_DESCRIPTIONS, BUILTIN_NAMES, MEMBER
from identity.sessions import SESSION, Holder, TokenPair
from identity.users import UserRow, workspace_proto

PROVISION_TIMEOUT_SECONDS = 60.0
PROVISION_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0)  # seconds between attempts while UNAVAILABLE
DEADLINE_MARGIN_SECONDS = 1.0  # answer (and roll back) before the caller's deadline passes
log = logging.getLogger("identity.auth")
_KIND_LABELS = {
    identity_pb2.CREDENTIAL_KIND_ACCESS_TOKEN: "access_token",
    identity_pb2.CREDENTIAL_KIND_API_KEY: "api_key",
    identity_pb2.CREDENTIAL_KIND_PERSONAL_ACCESS_TOKEN: "personal_access_token",
}


def _auth_result(pair: TokenPair, user: UserRow) -> identity_pb2.AuthResult:
    return identity_pb2.AuthResult(
        access_token=pair.access_token,
        refresh_token=pair.refresh_token,
        user=user.to_proto(),
        access_expires_in=pair.access_expires_in,
    )


def _reset_token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class AuthServicer(identity_pb2_grpc.AuthServiceServicer):
    def __init__(self, deps: Deps) -> None:
        self._deps = deps

    # -- sign-up and login -------------------------------------------------------------------
    async def SignUp(  # noqa: N802
        self, request: identity_pb2.SignUpRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.AuthResult:
        deps = self._deps
        email = validation.email(request.email)
        check_policy(request.password)
        first_name = validation.name(request.first_name, "firstName", required=False)
        last_name = validation.name(request.last_name, "lastName", required=False)
        workspace_name = validation.name(request.workspace_name, "workspaceName", required=True)
        # Every sign-up counts (a hash and a schema each), per client IP and in total.
        await deps.limiter.begin([("signup-ip", request.client_ip), ("signup", "all")])
        password_hash = await deps.passwords.hash(request.password)
        workspace_id, admin_id, member_id, user_id = (uuid.uuid4() for _ in range(4))
        async with deps.pool.acquire() as connection, connection.transaction():
            await lock_workspace(connection, str(workspace_id), exclusive=False)
            workspace = await connection.fetchrow(
                "INSERT INTO identity.workspaces (id, name) VALUES ($1, $2) "
                "RETURNING id, name, created_at",
                workspace_id,
                workspace_name,
            )
            assert workspace is not None
            await connection.executemany(
                "INSERT INTO identity.roles (id, workspace_id, name, description, builtin) "
                "VALUES ($1, $2, $3, $4, $5)",
                [
                    (
                        admin_id,
                        workspace_id,
                        BUILTIN_NAMES[ADMIN],
                        BUILTIN_DESCRIPTIONS[ADMIN],
                        ADMIN,
                    ),
                    (
                        member_id,
                        workspace_id,
                        BUILTIN_NAMES[MEMBER],
                        BUILTIN_DESCRIPTIONS[MEMBER],
                        MEMBER,
                    ),
                ],
            )
            row = await connection.fetchrow(
                "INSERT INTO identity.users (id, workspace_id, email, password_hash, first_name, "
                "last_name, role_id) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING *",
                user_id,
                workspace_id,
                email,
                password_hash,
                first_name,
                last_name,
                admin_id,
            )
            assert row is not None
            user = UserRow.from_record(row)
            pair = await deps.sessions.open(connection, Holder(user.id, workspace_id, email))
            # The workspace exists only if its standard objects do: provision before committing.
            await self._provision(str(workspace_id), context)
        result = _auth_result(pair, user)
        result.workspace.CopyFrom(workspace_proto(workspace))
        return result

    async def _provision(self, workspace_id: str, context: grpc.aio.ServicerContext) -> None:
        """ProvisionWorkspace (idempotent), retried while a peer is briefly unavailable, and
        always answered within the caller's deadline, so that a sign-up the caller gave up on
        is rolled back rather than committed behind its back."""
        deps = self._deps
        remaining = context.time_remaining()
        deadline = time.monotonic() + (
            PROVISION_TIMEOUT_SECONDS if remaining is None else remaining - DEADLINE_MARGIN_SECONDS
        )
        for delay in (*PROVISION_RETRY_DELAYS, None):
            try:
                await deps.metadata.ProvisionWorkspace(
                    metadata_pb2.ProvisionWorkspaceRequest(workspace_id=workspace_id),
                    metadata=deps.codec.metadata(system_principal(workspace_id)),
                    timeout=max(0.1, deadline - time.monotonic()),
                )
                return
            except grpc.aio.AioRpcError as exc:
                retry = delay is not None and time.monotonic() + delay < deadline
                if exc.code() == grpc.StatusCode.UNAVAILABLE and retry:
                    log.warning("provisioning unavailable; retrying", extra={"delay": delay})
                    await asyncio.sleep(delay or 0)
                    continue
                error = from_rpc_error(exc)
                raise Unavailable(
                    f"the workspace could not be created: metadata service: {error.message}"
                ) from None

    async def Login(  # noqa: N802
        self, request: identity_pb2.LoginRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.AuthResult:
        deps = self._deps
        workspace_id = validation.optional_uuid(request.workspace_id, "workspaceId")
        user, _ = await check_password(
            deps,
            email=request.email,
            password=request.password,
            client_ip=request.client_ip,
            workspace_id=uuid.UUID(workspace_id) if workspace_id else None,
        )
        async with deps.pool.acquire() as connection, connection.transaction():
            await lock_workspace(connection, str(user.workspace_id), exclusive=False)
            pair = await deps.sessions.open(
                connection, Holder(user.id, user.workspace_id, user.email)
            )
        return _auth_result(pair, user)

    async def Refresh(  # noqa: N802
        self, request: identity_pb2.RefreshRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.AuthResult:
        deps = self._deps
        claims = deps.sessions.decode_refresh(required(request.refresh_token, "refreshToken"))
        pair, _ = await deps.sessions.rotate(deps.pool, claims, kind=SESSION)
        row = await deps.pool.fetchrow(
            "SELECT * FROM identity.users WHERE id = $1", uuid.UUID(claims.sub)
        )
        if row is None:
            raise invalid_token("invalid refresh token")
        return _auth_result(pair, UserRow.from_record(row))

    async def Logout(  # noqa: N802
        self, request: identity_pb2.LogoutRequest, context: grpc.aio.ServicerContext
    ) -> empty_pb2.Empty:
        deps = self._deps
        claims = deps.sessions.decode_refresh(required(request.refresh_token, "refreshToken"))
        async with deps.pool.acquire() as connection, connection.transaction():
            await lock_workspace(connection, claims.workspace_id, exclusive=True)
            grant_id = await connection.fetchval(
                "SELECT t.grant_id FROM identity.refresh_tokens t "
                "JOIN identity.grants g ON g.id = t.grant_id "
                "WHERE t.id = $1 AND g.user_id = $2 AND g.kind = 'session'",
                uuid.UUID(claims.jti),
                uuid.UUID(claims.sub),
            )
            if grant_id is None:
                raise invalid_token("invalid refresh token")
            await deps.sessions.revoke(connection, [grant_id], "logout")
        deps.metrics.revocations.labels("session").inc()
        return empty_pb2.Empty()

    # -- password reset ----------------------------------------------------------------------
    async def RequestPasswordReset(  # noqa: N802
        self, request: identity_pb2.PasswordResetRequest, context: grpc.aio.ServicerContext
    ) -> empty_pb2.Empty:
        deps = self._deps
        email = validation.email(request.email)
        try:
            # Every request counts here: this limit stops mail bombing, not password guessing.
            await deps.limiter.begin([("reset-ip", request.client_ip), ("reset-email", email)])
        except ResourceExhausted:
            return empty_pb2.Empty()  # same answer; no email beyond the limit
        lifetime = deps.settings.PASSWORD_RESET_TOKEN_EXPIRES_IN
        async with deps.pool.acquire() as connection, connection.transaction():
            rows = await connection.fetch(
                "SELECT u.id, u.first_name, w.name AS workspace_name FROM identity.users u "
                "JOIN identity.workspaces w ON w.id = u.workspace_id WHERE u.email = $1",
                email,
            )
            for row in rows:
                token = secrets.token_urlsafe(32)
                await connection.execute(
                    "INSERT INTO identity.password_reset_tokens (token_hash, user_id, expires_at) "
                    "VALUES ($1, $2, $3)",
                    _reset_token_hash(token),
                    row["id"],
                    datetime.now(UTC) + timedelta(seconds=lifetime),
                )
                await mail.enqueue(
                    connection,
                    recipient=email,
                    subject=f"Reset your password for {row['workspace_name']}",
                    body=self._reset_body(
                        row["first_name"], row["workspace_name"], token, lifetime
                    ),
                )
        return empty_pb2.Empty()

    def _reset_body(self, first_name: str, workspace: str, token: str, lifetime: int) -> str:
        base = self._deps.settings.PASSWORD_RESET_URL
        how = (
            f"Open this link to choose a new password:\n{base}?token={token}\n"
            if base
            else "Send it with your new password to POST /auth/password-reset/confirm.\n"
        )
        minutes = max(1, lifetime // 60)
        return (
            f"Hello {first_name or 'there'},\n\n"
            f'Someone asked to reset your password in the workspace "{workspace}".\n\n'
            f"Reset token: {token}\n\n{how}\n"
            f"The token works once and expires in {minutes} minute(s). "
            "If you did not ask for this, ignore this email: your password stays as it is.\n"
        )

    async def ConfirmPasswordReset(  # noqa: N802
        self, request: identity_pb2.ConfirmPasswordResetRequest, context: grpc.aio.ServicerContext
    ) -> empty_pb2.Empty:
        deps = self._deps
        token = required(request.token, "token")
        check_policy(request.password)
        password_hash = await deps.passwords.hash(request.password)
        row = await deps.pool.fetchrow(
            "SELECT t.user_id, t.expires_at, t.used_at, u.workspace_id "
            "FROM identity.password_reset_tokens t JOIN identity.users u ON u.id = t.user_id "
            "WHERE t.token_hash = $1",
            _reset_token_hash(token),
        )
        if row is None or row["used_at"] is not None:
            raise InvalidArgument(
                "invalid or already used reset token",
                field="token",
                reason=common_pb2.ERROR_REASON_TOKEN_INVALID,
            )
        if row["expires_at"] <= datetime.now(UTC):
            raise InvalidArgument(
                "reset token expired", field="token", reason=common_pb2.ERROR_REASON_TOKEN_EXPIRED
            )
        async with deps.pool.acquire() as connection, connection.transaction():
            await lock_workspace(connection, str(row["workspace_id"]), exclusive=True)
            used = await connection.execute(
                "UPDATE identity.password_reset_tokens SET used_at = now() "
                "WHERE token_hash = $1 AND used_at IS NULL",
                _reset_token_hash(token),
            )
            if used != "UPDATE 1":  # a concurrent confirmation won
                raise InvalidArgument(
                    "invalid or already used reset token",
                    field="token",
                    reason=common_pb2.ERROR_REASON_TOKEN_INVALID,
                )
            await connection.execute(
                "UPDATE identity.password_reset_tokens SET used_at = now() "
                "WHERE user_id = $1 AND used_at IS NULL",
                row["user_id"],
            )
            await connection.execute(
                "UPDATE identity.users SET password_hash = $2, updated_at = now() WHERE id = $1",
                row["user_id"],
                password_hash,
            )
            # A new password ends every session and OAuth grant (tokens may have leaked with it).
            grants = await connection.fetch(
                "SELECT id FROM identity.grants WHERE user_id = $1 AND revoked_at IS NULL",
                row["user_id"],
            )
            await deps.sessions.revoke(
                connection, [grant["id"] for grant in grants], "password reset"
            )
        return empty_pb2.Empty()

    # -- credentials -------------------------------------------------------------------------
    async def ResolveCredential(  # noqa: N802
        self, request: identity_pb2.ResolveCredentialRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.Principal:
        label = _KIND_LABELS.get(request.kind, "unknown")
        try:
            principal = await self._resolve(request)
        except Unauthenticated as exc:
            self._deps.metrics.credential_resolutions.labels(label, exc.reason_name).inc()
            raise
        self._deps.metrics.credential_resolutions.labels(label, "OK").inc()
        return principal

    async def _resolve(
        self, request: identity_pb2.ResolveCredentialRequest
    ) -> common_pb2.Principal:
        deps = self._deps
        claims = None
        secret: str | None = None
        if request.kind == identity_pb2.CREDENTIAL_KIND_ACCESS_TOKEN:
            claims = decode_jwt(deps.settings.APP_SECRET, request.secret, TokenType.ACCESS)
            credential_id = uuid.UUID(grant_of(claims.jti))
            workspace_id: str | None = claims.workspace_id
            table = "grants"
        elif request.kind in (
            identity_pb2.CREDENTIAL_KIND_API_KEY,
            identity_pb2.CREDENTIAL_KIND_PERSONAL_ACCESS_TOKEN,
        ):
            credential_id = _uuid_or_invalid(request.credential_id)
            secret = request.secret
            table = (
                "api_keys"
                if request.kind == identity_pb2.CREDENTIAL_KIND_API_KEY
                else "personal_access_tokens"
            )
            workspace = await deps.pool.fetchval(
                f"SELECT workspace_id FROM identity.{table} WHERE id = $1", credential_id
            )
            workspace_id = str(workspace) if workspace else None
        else:
            raise InvalidArgument("unknown credential kind", field="kind")
        async with deps.pool.acquire() as connection, connection.transaction():
            if workspace_id is not None:
                await lock_workspace(connection, workspace_id, exclusive=False)
            loaders = {
                "grants": load_grants,
                "api_keys": load_api_keys,
                "personal_access_tokens": load_personal_access_tokens,
            }
            entries: Entries = await loaders[table](connection, [credential_id])
            await deps.cache.fill(entries)
        return accept_credential(
            entries[str(credential_id)], now=time.time(), secret=secret, claims=claims
        )

    async def GetCurrentUser(  # noqa: N802
        self, request: empty_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> identity_pb2.CurrentUser:
        deps = self._deps
        principal = deps.codec.require(context)
        workspace = await deps.pool.fetchrow(
            "SELECT id, name, created_at FROM identity.workspaces WHERE id = $1",
            uuid.UUID(principal.workspace_id),
        )
        if workspace is None:
            raise NotFound("workspace not found")
        current = identity_pb2.CurrentUser(
            id=principal.user_id or principal.credential_id,
            email=principal.email,
            role=principal.role_name,
            permissions=effective_permissions(principal),
            workspace=workspace_proto(workspace),
            kind=principal.kind,
            flags=list(principal.flags),
        )
        if principal.user_id:
            user = await deps.pool.fetchrow(
                "SELECT email, first_name, last_name FROM identity.users "
                "WHERE id = $1 AND workspace_id = $2",
                uuid.UUID(principal.user_id),
                uuid.UUID(principal.workspace_id),
            )
            if user is None:
                raise Unauthenticated(
                    "user no longer exists", reason=common_pb2.ERROR_REASON_TOKEN_REVOKED
                )
            current.email = user["email"]
            current.first_name = user["first_name"]
            current.last_name = user["last_name"]
        return current

    async def IssueToken(  # noqa: N802
        self, request: identity_pb2.IssueTokenRequest, context: grpc.aio.ServicerContext
    ) -> identity_pb2.IssuedToken:
        deps = self._deps
        principal = deps.codec.require(context)
        user_id = require_user(principal)
        settings = deps.settings
        if request.type == identity_pb2.IssueTokenRequest.TOKEN_TYPE_LOGIN:
            token_type, lifetime, token_id = (
                TokenType.LOGIN,
                settings.LOGIN_TOKEN_EXPIRES_IN,
                str(uuid.uuid4()),
            )
        elif request.type == identity_pb2.IssueTokenRequest.TOKEN_TYPE_FILE:
            token_id = validation.uuid_text(request.subject, "subject")
            token_type, lifetime = TokenType.FILE, settings.FILE_TOKEN_EXPIRES_IN
        else:
            raise InvalidArgument("type must be LOGIN or FILE", field="type")
        token, _ = encode_jwt(
            settings.APP_SECRET,
            subject=user_id,
            workspace_id=principal.workspace_id,
            email=principal.email,
            token_type=token_type,
            token_id=token_id,
            lifetime_seconds=lifetime,
        )
        return identity_pb2.IssuedToken(token=token, expires_in=lifetime)

    async def ResolveAuthor(  # noqa: N802
        self, request: identity_pb2.ResolveAuthorRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.Principal:
        """The current principal of a webhook's or workflow's author, for the services that
        pass records on in their name (system principals only)."""
        principal = self._deps.codec.require(context)
        if principal.kind != common_pb2.PRINCIPAL_KIND_SYSTEM:
            raise PermissionDenied("permission denied: services only")
        workspace_id = uuid.UUID(principal.workspace_id)
        which = request.WhichOneof("author")
        if which == "user_id":
            author_id = uuid.UUID(validation.uuid_text(request.user_id, "userId"))
            found = await user_author(self._deps.pool, workspace_id, author_id)
        elif which == "api_key_id":
            author_id = uuid.UUID(validation.uuid_text(request.api_key_id, "apiKeyId"))
            found = await api_key_author(self._deps.pool, workspace_id, author_id)
        else:
            raise InvalidArgument("userId or apiKeyId is required", field="author")
        if found is None:
            raise NotFound("author not found", field="author")
        return found


def _uuid_or_invalid(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise invalid_token() from None
