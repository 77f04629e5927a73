"""The Idempotency-Key header: checked, and the request hash ignores JSON key order only."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.datastructures import Headers
from starlette.requests import Request

from crm.common.v1 import common_pb2
from crmkit.errors import FailedPrecondition, InvalidArgument
from gateway import idempotency
from gateway.errors import graphql_extensions, rest_error_body


def _request(body: bytes, key: str = "k-1", path: str = "/rest/people") -> Request:
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "query_string": b"",
        "headers": [(b"idempotency-key", key.encode())],
    }
    sent = False

    async def receive() -> dict[str, object]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)


def _hash(body: object, **kwargs: str) -> str:
    metadata = asyncio.run(idempotency.rest_metadata(_request(json.dumps(body).encode(), **kwargs)))
    return str(dict(metadata)[idempotency.HASH_METADATA])


@pytest.mark.parametrize("value", ["", "x" * 256, "caf\u00e9", "a\tb"])
def test_a_malformed_key_is_refused_naming_the_header(value: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        idempotency.key_of(Headers({"Idempotency-Key": value}))
    assert caught.value.field == "Idempotency-Key"


def test_a_key_is_read_and_absent_is_none() -> None:
    assert idempotency.key_of(Headers({"Idempotency-Key": "x" * 255})) == "x" * 255
    assert idempotency.key_of(Headers({})) is None


def test_the_hash_ignores_key_order_but_not_values_or_route() -> None:
    first = _hash({"a": 1, "b": [1, 2]})
    assert _hash({"b": [1, 2], "a": 1}) == first
    assert _hash({"a": 1, "b": [2, 1]}) != first
    assert _hash({"a": 1, "b": [1, 2]}, path="/rest/companies") != first


def test_a_reused_key_maps_to_422_naming_the_header() -> None:
    error = FailedPrecondition(
        "used with a different request",
        field="Idempotency-Key",
        reason=common_pb2.ERROR_REASON_IDEMPOTENCY_KEY_REUSED,
    )
    body = rest_error_body(error)
    assert (body["statusCode"], body["error"]) == (422, "Unprocessable Entity")
    assert body["details"]["field"] == "Idempotency-Key"
    assert graphql_extensions(error)["code"] == "BAD_USER_INPUT"
