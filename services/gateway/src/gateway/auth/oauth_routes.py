"""GET/POST /auth/authorize (login and consent page) and POST /auth/token (RFC 6749).

Authorization errors go back to the client's redirect URI (with `state`) only once the client
and that URI are known good; otherwise the user sees an error page. The token endpoint takes
form-encoded (RFC 6749) or JSON (the spec) bodies, client credentials in the body or by HTTP
Basic, and answers errors with the OAuth body `{error, error_description}`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote_plus, urlencode, urlsplit, urlunsplit

import orjson
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from crm.identity.v1 import identity_pb2
from crmkit.errors import (
    InvalidArgument,
    ResourceExhausted,
    ServiceError,
    Unauthenticated,
    Unavailable,
)
from gateway.auth.client_ip import client_ip
from gateway.auth.consent import (
    COOKIE_PATH,
    CSRF_COOKIE,
    FORM_FIELDS,
    consent_page,
    csrf_valid,
    error_page,
    new_csrf,
)
from gateway.auth.http import NO_STORE, json_response
from gateway.rpc import call
from gateway.state import gateway_state


def _redirect_with(redirect_uri: str, params: Mapping[str, str]) -> RedirectResponse:
    """303 to redirect_uri with params added to its query (RFC 6749 section 4.1.2)."""
    parts = urlsplit(redirect_uri)
    extra = urlencode({key: value for key, value in params.items() if value})
    query = f"{parts.query}&{extra}" if parts.query else extra
    target = urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))
    return RedirectResponse(target, status_code=303, headers={"Cache-Control": "no-store"})


def _error_redirect(params: Mapping[str, str], error: ServiceError) -> Response:
    if error.metadata.get("redirect") == "true":
        return _redirect_with(
            params["redirect_uri"],
            {
                "error": error.metadata.get("oauthError", "invalid_request"),
                "error_description": error.message,
                "state": params.get("state", ""),
            },
        )
    if isinstance(error, Unavailable):
        return error_page("the service is temporarily unavailable; try again", 503)
    return error_page(error.message)


def _params(source: Mapping[str, Any]) -> dict[str, str]:
    return {name: str(source.get(name) or "") for name in FORM_FIELDS}


async def authorize_page(request: Request) -> Response:
    state = gateway_state(request)
    params = _params(request.query_params)
    try:
        valid = await call(
            state.upstreams.oauth.ValidateAuthorize,
            identity_pb2.ValidateAuthorizeRequest(
                client_id=params["client_id"],
                redirect_uri=params["redirect_uri"],
                response_type=params["response_type"],
                scope=params["scope"],
                code_challenge=params["code_challenge"],
                code_challenge_method=params["code_challenge_method"],
            ),
            [],
        )
    except ServiceError as exc:
        return _error_redirect(params, exc)
    csrf, nonce = new_csrf(state.settings.APP_SECRET, params, state.settings.LOGIN_TOKEN_EXPIRES_IN)
    page = consent_page(
        client_name=valid.client_name, scopes=list(valid.scopes), params=params, csrf=csrf
    )
    _set_csrf_cookie(request, page, nonce, state.settings.LOGIN_TOKEN_EXPIRES_IN)
    return page


def _set_csrf_cookie(request: Request, response: Response, nonce: str, lifetime: int) -> None:
    response.set_cookie(
        CSRF_COOKIE,
        nonce,
        max_age=lifetime,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


async def authorize_submit(request: Request) -> Response:
    state = gateway_state(request)
    form: FormData = await request.form()
    params = _params(form)
    csrf = str(form.get("csrf") or "")
    if not csrf_valid(state.settings.APP_SECRET, csrf, request.cookies.get(CSRF_COOKIE), params):
        return error_page("this sign-in form expired or was not sent from this site; start again")
    try:
        valid = await call(
            state.upstreams.oauth.ValidateAuthorize,
            identity_pb2.ValidateAuthorizeRequest(
                client_id=params["client_id"],
                redirect_uri=params["redirect_uri"],
                response_type=params["response_type"],
                scope=params["scope"],
                code_challenge=params["code_challenge"],
                code_challenge_method=params["code_challenge_method"],
            ),
            [],
        )
    except ServiceError as exc:
        return _error_redirect(params, exc)
    if form.get("decision") != "allow":
        return _redirect_with(
            params["redirect_uri"],
            {
                "error": "access_denied",
                "error_description": "the user denied the request",
                "state": params["state"],
            },
        )
    email = str(form.get("email") or "")
    try:
        code = await call(
            state.upstreams.oauth.Authorize,
            identity_pb2.AuthorizeRequest(
                client_id=params["client_id"],
                redirect_uri=params["redirect_uri"],
                scopes=[params["scope"]] if params["scope"] else [],
                code_challenge=params["code_challenge"],
                code_challenge_method=params["code_challenge_method"],
                email=email,
                password=str(form.get("password") or ""),
                client_ip=client_ip(request, state.settings.trusted_proxies),
            ),
            [],
        )
    except (Unauthenticated, InvalidArgument, ResourceExhausted) as exc:
        if "oauthError" in exc.metadata:
            return _error_redirect(params, exc)
        status = 429 if isinstance(exc, ResourceExhausted) else 401
        if isinstance(exc, InvalidArgument):
            status = 400
        again, nonce = new_csrf(
            state.settings.APP_SECRET, params, state.settings.LOGIN_TOKEN_EXPIRES_IN
        )
        page = consent_page(
            client_name=valid.client_name,
            scopes=list(valid.scopes),
            params=params,
            csrf=again,
            email=email,
            error=exc.message,
            status=status,
        )
        _set_csrf_cookie(request, page, nonce, state.settings.LOGIN_TOKEN_EXPIRES_IN)
        return page
    except ServiceError as exc:
        return _error_redirect(params, exc)
    return _redirect_with(params["redirect_uri"], {"code": code.code, "state": params["state"]})


# -- token endpoint ------------------------------------------------------------------------------
def _oauth_error(
    error: str, description: str, status: int = 400, headers: Mapping[str, str] | None = None
) -> Response:
    return json_response(
        {"error": error, "error_description": description}, status, {**NO_STORE, **(headers or {})}
    )


async def _token_params(request: Request) -> dict[str, str]:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        try:
            payload = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            raise InvalidArgument("request body is not valid JSON") from None
        if not isinstance(payload, dict):
            raise InvalidArgument("request body must be a JSON object")
        source: Mapping[str, Any] = payload
    elif content_type == "application/x-www-form-urlencoded":
        source = await request.form()
    else:
        raise InvalidArgument(
            "send application/x-www-form-urlencoded (or application/json) parameters"
        )
    params: dict[str, str] = {}
    for key, value in source.items():
        if not isinstance(value, str):
            raise InvalidArgument(f"{key} must be a string", field=key)
        params[key] = value
    return params


def _basic_credentials(header: str | None) -> tuple[str, str] | None:
    if not header or not header.lower().startswith("basic "):
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise Unauthenticated("malformed HTTP Basic credentials") from None
    client_id, separator, secret = decoded.partition(":")
    if not separator:
        raise Unauthenticated("malformed HTTP Basic credentials")
    # RFC 6749 section 2.3.1: both parts are form-urlencoded before Basic encoding.
    return unquote_plus(client_id), unquote_plus(secret)


async def token(request: Request) -> Response:
    state = gateway_state(request)
    basic_used = False
    try:
        params = await _token_params(request)
        basic = _basic_credentials(request.headers.get("authorization"))
        client_id, client_secret = params.get("client_id", ""), params.get("client_secret", "")
        if basic is not None:
            basic_used = True
            if client_secret or (client_id and client_id != basic[0]):
                raise InvalidArgument("use one client authentication method, not two")
            client_id, client_secret = basic
        response = await call(
            state.upstreams.oauth.ExchangeToken,
            identity_pb2.ExchangeTokenRequest(
                grant_type=params.get("grant_type", ""),
                code=params.get("code", ""),
                redirect_uri=params.get("redirect_uri", ""),
                client_id=client_id,
                client_secret=client_secret,
                code_verifier=params.get("code_verifier", ""),
                refresh_token=params.get("refresh_token", ""),
                client_ip=client_ip(request, state.settings.trusted_proxies),
            ),
            [],
        )
    except ServiceError as exc:
        return _token_error(exc, basic_used)
    body: dict[str, Any] = {
        "access_token": response.access_token,
        "token_type": response.token_type,
        "expires_in": response.expires_in,
        "refresh_token": response.refresh_token,
    }
    if response.scope:
        body["scope"] = response.scope
    return json_response(body, 200, NO_STORE)


def _token_error(error: ServiceError, basic_used: bool) -> Response:
    code = error.metadata.get("oauthError")
    if isinstance(error, ResourceExhausted):
        retry = error.metadata.get("retryAfter", "60")
        return _oauth_error("temporarily_unavailable", error.message, 429, {"Retry-After": retry})
    if code == "invalid_client" or (code is None and isinstance(error, Unauthenticated)):
        headers = {"WWW-Authenticate": 'Basic realm="crm"'} if basic_used else None
        return _oauth_error("invalid_client", error.message, 401, headers)
    if code is not None:
        return _oauth_error(code, error.message)
    if isinstance(error, InvalidArgument):
        return _oauth_error("invalid_request", error.message)
    if isinstance(error, Unavailable):
        return _oauth_error("temporarily_unavailable", error.message, 503)
    return _oauth_error("server_error", "internal server error", 500)
