from __future__ import annotations

import orjson
import pytest
from graphql import GraphQLError

from crmkit.errors import (
    AlreadyExists,
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    ServiceError,
    Unauthenticated,
    Unavailable,
)
from gateway.errors import graphql_extensions, rest_error_body, rest_error_response
from gateway.graphql.errors import format_graphql_error


@pytest.mark.parametrize(
    ("error", "status", "title", "code"),
    [
        (InvalidArgument("bad", field="email"), 400, "Bad Request", "BAD_USER_INPUT"),
        (AlreadyExists("taken", field="email"), 400, "Bad Request", "BAD_USER_INPUT"),
        (Unauthenticated("no"), 401, "Unauthorized", "UNAUTHENTICATED"),
        (PermissionDenied("no"), 403, "Forbidden", "FORBIDDEN"),
        (NotFound("gone"), 404, "Not Found", "NOT_FOUND"),
        (ResourceExhausted("slow down"), 429, "Too Many Requests", "RATE_LIMIT_EXCEEDED"),
        (Unavailable("down"), 503, "Service Unavailable", "SERVICE_UNAVAILABLE"),
        (DeadlineExceeded("too slow"), 504, "Gateway Timeout", "GATEWAY_TIMEOUT"),
        (Internal("boom"), 500, "Internal Server Error", "INTERNAL_SERVER_ERROR"),
    ],
)
def test_one_mapping_for_rest_and_graphql(
    error: ServiceError, status: int, title: str, code: str
) -> None:
    body = rest_error_body(error)
    assert body == {
        "statusCode": status,
        "message": error.message,
        "error": title,
        "details": {"field": error.field, "message": error.message},
    }
    assert graphql_extensions(error)["code"] == code
    response = rest_error_response(error)
    assert response.status_code == status
    assert orjson.loads(bytes(response.body)) == body


def test_unavailable_says_when_to_retry() -> None:
    error = Unavailable("database unavailable")
    assert rest_error_response(error).headers["retry-after"] == "2"
    assert graphql_extensions(error) == {"code": "SERVICE_UNAVAILABLE", "retryAfter": 2}
    assert "retry-after" not in rest_error_response(Internal("boom")).headers


def test_graphql_error_names_the_field() -> None:
    error = GraphQLError(
        "name is required",
        path=["createCompany"],
        original_error=InvalidArgument("name is required", field="name"),
    )
    assert format_graphql_error(error) == {
        "message": "name is required",
        "extensions": {"code": "BAD_USER_INPUT", "field": "name"},
        "path": ["createCompany"],
    }


def test_unexpected_graphql_error_hides_details() -> None:
    error = GraphQLError("db password is hunter2", original_error=RuntimeError("hunter2"))
    formatted = format_graphql_error(error)
    assert formatted["extensions"] == {"code": "INTERNAL_SERVER_ERROR"}
    assert "hunter2" not in formatted["message"]
