"""Small helpers of the /auth routes: JSON bodies and token responses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response

from crmkit.errors import InvalidArgument, ServiceError
from gateway.errors import rest_error_response

T = TypeVar("T")
NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}


async def json_object(request: Request) -> dict[str, Any]:
    try:
        payload = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        raise InvalidArgument("request body is not valid JSON") from None
    if not isinstance(payload, dict):
        raise InvalidArgument("request body must be a JSON object")
    return payload


def text(body: Mapping[str, Any], field: str) -> str:
    """A string field of the body ("" when absent), or InvalidArgument naming it."""
    value = body.get(field)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidArgument(f"{field} must be a string", field=field)
    return value


def json_response(
    body: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        orjson.dumps(body), status_code=status, media_type="application/json", headers=headers
    )


def error_response(error: ServiceError) -> Response:
    """The REST error body, with Retry-After when a limit refused the call."""
    retry_after = error.metadata.get("retryAfter")
    return rest_error_response(error, {"Retry-After": retry_after} if retry_after else None)
