"""POST /auth/signup, /auth/login, /auth/refresh, /auth/logout, /auth/password-reset and
/auth/password-reset/confirm: JSON in, JSON out, errors in the REST error body."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from crm.identity.v1 import identity_pb2
from crmkit.errors import ServiceError
from gateway.auth.client_ip import client_ip
from gateway.auth.http import NO_STORE, error_response, json_object, json_response, text
from gateway.rpc import call
from gateway.state import GatewayState, gateway_state

Handler = Callable[[Request], Awaitable[Response]]
SIGNUP_TIMEOUT_SECONDS = 60.0


def _user(user: identity_pb2.User) -> dict[str, str]:
    return {
        "id": user.id,
        "email": user.email,
        "firstName": user.first_name,
        "lastName": user.last_name,
    }


def _auth_body(result: identity_pb2.AuthResult) -> dict[str, Any]:
    return {
        "accessToken": result.access_token,
        "refreshToken": result.refresh_token,
        "user": _user(result.user),
    }


def _ip(request: Request, state: GatewayState) -> str:
    return client_ip(request, state.settings.trusted_proxies)


def _handled(handler: Callable[[Request, GatewayState], Awaitable[Response]]) -> Handler:
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request, gateway_state(request))
        except ServiceError as exc:
            return error_response(exc)

    endpoint.__name__ = handler.__name__
    return endpoint


async def _signup(request: Request, state: GatewayState) -> Response:
    body = await json_object(request)
    # Sign-up provisions the workspace's data model (DDL), which may take longer than a read.
    signup_call = functools.partial(state.upstreams.auth.SignUp, timeout=SIGNUP_TIMEOUT_SECONDS)
    result = await call(
        signup_call,
        identity_pb2.SignUpRequest(
            email=text(body, "email"),
            password=text(body, "password"),
            first_name=text(body, "firstName"),
            last_name=text(body, "lastName"),
            workspace_name=text(body, "workspaceName"),
            client_ip=_ip(request, state),
        ),
        [],
    )
    payload = _auth_body(result)
    payload["workspace"] = {"id": result.workspace.id, "name": result.workspace.name}
    return json_response(payload, 201, NO_STORE)


async def _login(request: Request, state: GatewayState) -> Response:
    body = await json_object(request)
    result = await call(
        state.upstreams.auth.Login,
        identity_pb2.LoginRequest(
            email=text(body, "email"),
            password=text(body, "password"),
            workspace_id=text(body, "workspaceId"),
            client_ip=_ip(request, state),
        ),
        [],
    )
    return json_response(_auth_body(result), 200, NO_STORE)


async def _refresh(request: Request, state: GatewayState) -> Response:
    body = await json_object(request)
    result = await call(
        state.upstreams.auth.Refresh,
        identity_pb2.RefreshRequest(
            refresh_token=text(body, "refreshToken"), client_ip=_ip(request, state)
        ),
        [],
    )
    return json_response(_auth_body(result), 200, NO_STORE)


async def _logout(request: Request, state: GatewayState) -> Response:
    body = await json_object(request)
    await call(
        state.upstreams.auth.Logout,
        identity_pb2.LogoutRequest(refresh_token=text(body, "refreshToken")),
        [],
    )
    return Response(status_code=204)


async def _password_reset(request: Request, state: GatewayState) -> Response:
    body = await json_object(request)
    await call(
        state.upstreams.auth.RequestPasswordReset,
        identity_pb2.PasswordResetRequest(email=text(body, "email"), client_ip=_ip(request, state)),
        [],
    )
    return json_response(
        {"message": "if this email belongs to an account, a reset email is on its way"}, 202
    )


async def _password_reset_confirm(request: Request, state: GatewayState) -> Response:
    body = await json_object(request)
    await call(
        state.upstreams.auth.ConfirmPasswordReset,
        identity_pb2.ConfirmPasswordResetRequest(
            token=text(body, "token"), password=text(body, "password")
        ),
        [],
    )
    return Response(status_code=204)


signup = _handled(_signup)
login = _handled(_login)
refresh = _handled(_refresh)
logout = _handled(_logout)
password_reset = _handled(_password_reset)
password_reset_confirm = _handled(_password_reset_confirm)
