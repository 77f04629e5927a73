"""The `Idempotency-Key` header of record writes (docs/api.md, "Idempotent writes").

The gateway checks the key and hashes the request (method, route and canonical body); both go
to the records service as gRPC metadata beside the principal. Records keeps the key, scoped to the
workspace and the credential, in the write's own transaction with the write's response, and
answers a retry from it (records.idempotency); the gateway renders that response exactly as the
first time, so the retry gets the same status and body.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson
import strawberry
from graphql import OperationType, print_ast
from graphql.language import FieldNode
from starlette.datastructures import Headers
from starlette.requests import Request

from crmkit.errors import InvalidArgument

HEADER = "Idempotency-Key"
KEY_METADATA = "x-idempotency-key"
HASH_METADATA = "x-idempotency-hash"
MAX_KEY_LENGTH = 255
_VALID = re.compile(r"[\x20-\x7e]{1,255}")

Metadata = list[tuple[str, str | bytes]]


def key_of(headers: Headers) -> str | None:
    """The request's key, checked: 1-255 printable ASCII characters."""
    value = headers.get(HEADER)
    if value is None:
        return None
    if not _VALID.fullmatch(value):
        raise InvalidArgument(
            f"{HEADER} must be 1 to {MAX_KEY_LENGTH} printable ASCII characters", field=HEADER
        )
    return value


def _metadata(key: str, *parts: bytes) -> Metadata:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return [(KEY_METADATA, key), (HASH_METADATA, digest.hexdigest())]


def _canonical(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str)


async def rest_metadata(request: Request) -> Metadata:
    """Metadata guarding a REST write; empty without the header. Call after the body was checked
    (it is valid JSON or empty)."""
    key = key_of(request.headers)
    if key is None:
        return []
    raw = await request.body()
    body = _canonical(orjson.loads(raw)) if raw.strip() else b""
    query = _canonical(sorted(request.query_params.multi_items()))
    return _metadata(key, request.method.encode(), request.url.path.encode(), query, body)


def graphql_metadata(info: strawberry.Info, headers: Headers | None) -> Metadata:
    """Metadata guarding a GraphQL record mutation; empty without the header. The key guards
    the whole HTTP request, so it is accepted only on an operation of one top-level mutation."""
    key = key_of(headers) if headers is not None else None
    if key is None:
        return []
    operation = info.operation
    selections = operation.selection_set.selections
    if (
        operation.operation != OperationType.MUTATION
        or len(selections) != 1
        or not isinstance(selections[0], FieldNode)
    ):
        raise InvalidArgument(
            f"{HEADER} is accepted only on an operation with a single top-level mutation",
            field=HEADER,
        )
    document = info.query if info.query is not None else print_ast(operation)
    name = operation.name.value if operation.name is not None else ""
    return _metadata(
        key,
        b"POST /graphql",
        document.encode(),
        name.encode(),
        _canonical(info.variable_values),
    )
