"""The one mapping from service errors to the spec's REST body and GraphQL extensions.code."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import orjson
from starlette.responses import Response

from crm.common.v1 import common_pb2
from crmkit.errors import ServiceError


@dataclass(frozen=True)
class ErrorMapping:
    http_status: int
    error: str  # the REST body's `error`: the HTTP reason phrase
    graphql_code: str


_MAPPINGS: dict[grpc.StatusCode, ErrorMapping] = {
    grpc.StatusCode.INVALID_ARGUMENT: ErrorMapping(400, "Bad Request", "BAD_USER_INPUT"),
    grpc.StatusCode.ALREADY_EXISTS: ErrorMapping(400, "Bad Request", "BAD_USER_INPUT"),
    grpc.StatusCode.FAILED_PRECONDITION: ErrorMapping(400, "Bad Request", "BAD_USER_INPUT"),
    grpc.StatusCode.OUT_OF_RANGE: ErrorMapping(400, "Bad Request", "BAD_USER_INPUT"),
    grpc.StatusCode.UNAUTHENTICATED: ErrorMapping(401, "Unauthorized", "UNAUTHENTICATED"),
    grpc.StatusCode.PERMISSION_DENIED: ErrorMapping(403, "Forbidden", "FORBIDDEN"),
    grpc.StatusCode.NOT_FOUND: ErrorMapping(404, "Not Found", "NOT_FOUND"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: ErrorMapping(
        429, "Too Many Requests", "RATE_LIMIT_EXCEEDED"
    ),
    grpc.StatusCode.UNAVAILABLE: ErrorMapping(503, "Service Unavailable", "SERVICE_UNAVAILABLE"),
    grpc.StatusCode.DEADLINE_EXCEEDED: ErrorMapping(504, "Gateway Timeout", "GATEWAY_TIMEOUT"),
}
_INTERNAL = ErrorMapping(500, "Internal Server Error", "INTERNAL_SERVER_ERROR")
# Seconds a client should wait before retrying a 503 (a dependency restarting or failing over).
UNAVAILABLE_RETRY_AFTER = "2"


# An Idempotency-Key reused with another request: 422, by its reason (docs/api.md).
_KEY_REUSED = ErrorMapping(422, "Unprocessable Entity", "BAD_USER_INPUT")


# An upsert's unique value held only by a soft-deleted record: 409 (docs/api.md, "Upsert").
_MATCHES_DELETED = ErrorMapping(409, "Conflict", "BAD_USER_INPUT")


def mapping_for(error: ServiceError) -> ErrorMapping:
    if error.reason == common_pb2.ERROR_REASON_IDEMPOTENCY_KEY_REUSED:
        return _KEY_REUSED
    if error.reason == common_pb2.ERROR_REASON_MATCHES_DELETED:
        return _MATCHES_DELETED
    return _MAPPINGS.get(error.code, _INTERNAL)


def rest_error_body(error: ServiceError) -> dict[str, Any]:
    """`{statusCode, message, error, details: {field, message}}`."""
    mapping = mapping_for(error)
    return {
        "statusCode": mapping.http_status,
        "message": error.message,
        "error": mapping.error,
        "details": {"field": error.field, "message": error.message},
    }


def rest_error_response(error: ServiceError, headers: Mapping[str, str] | None = None) -> Response:
    body = rest_error_body(error)
    if error.code == grpc.StatusCode.UNAVAILABLE:
        headers = {"Retry-After": retry_after(error), **(headers or {})}
    return Response(
        orjson.dumps(body),
        status_code=body["statusCode"],
        media_type="application/json",
        headers=headers,
    )


def graphql_extensions(error: ServiceError) -> dict[str, Any]:
    """`extensions` of a GraphQL error: code, and field when one is named."""
    extensions: dict[str, Any] = {"code": mapping_for(error).graphql_code}
    if error.field is not None:
        extensions["field"] = error.field
    extensions.update(error.metadata)
    if error.code == grpc.StatusCode.UNAVAILABLE:
        extensions["retryAfter"] = int(retry_after(error))
    return extensions


def retry_after(error: ServiceError) -> str:
    """Seconds to wait before retrying a refused or unavailable call."""
    return error.metadata.get("retryAfter") or UNAVAILABLE_RETRY_AFTER
