"""GET /rest/search?q=&objects=&limit=&after=: ranked records of every readable object.

`{data: [{object, record, score, matchedFields}], pageInfo}`; one call to records' Search.
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from crm.records.v1 import records_pb2
from crmkit.errors import InvalidArgument
from gateway.auth import authenticate
from gateway.pagination import page_info_json
from gateway.rpc import call
from gateway.state import gateway_state

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
_PARAMS = frozenset({"q", "objects", "limit", "after"})
# Records names the request's fields; REST names its query parameters.
_PARAM_OF_FIELD = {"query": "q", "first": "limit"}


def _single(request: Request, name: str) -> str | None:
    values = request.query_params.getlist(name)
    if len(values) > 1:
        raise InvalidArgument(f"`{name}` is given more than once", field=name)
    return values[0] if values else None


def _limit(text: str | None) -> int:
    if text is None:
        return DEFAULT_LIMIT
    if not text.strip().isdecimal() or len(text) > 12:
        raise InvalidArgument("`limit` must be an integer", field="limit")
    value = int(text)
    if not 1 <= value <= MAX_LIMIT:
        raise InvalidArgument(
            f"`limit` must be between 1 and {MAX_LIMIT} (got {value})", field="limit"
        )
    return value


def hit_json(hit: records_pb2.SearchHit) -> bytes:
    """One result; the record's JSON bytes are spliced in as the records service wrote them."""
    head = orjson.dumps({"object": hit.object, "score": round(hit.score, 4)})[:-1]
    matched = orjson.dumps(list(hit.matched_fields))
    return head + b',"matchedFields":' + matched + b',"record":' + hit.record_json + b"}"


async def search(request: Request) -> Response:
    principal = await authenticate(request)
    state = gateway_state(request)
    unknown = sorted({key for key, _ in request.query_params.multi_items()} - _PARAMS)
    if unknown:
        raise InvalidArgument(f"unknown query parameter `{unknown[0]}`", field=unknown[0])
    query = _single(request, "q")
    if query is None or not query.strip():
        raise InvalidArgument("`q` is required and must not be empty", field="q")
    objects = [name.strip() for name in (_single(request, "objects") or "").split(",")]
    model = await state.models.get(principal)  # its version: records refreshes an older model
    message = records_pb2.SearchRequest(
        metadata_version=model.version,
        query=query,
        objects=[name for name in objects if name],
        first=_limit(_single(request, "limit")),
        after=_single(request, "after") or "",
    )
    metadata = state.principals.metadata(principal)
    try:
        response = await call(state.upstreams.records.Search, message, metadata)
    except InvalidArgument as exc:
        if exc.field in _PARAM_OF_FIELD:
            exc.field = _PARAM_OF_FIELD[exc.field]
        raise
    body = (
        b'{"data":['
        + b",".join(hit_json(hit) for hit in response.hits)
        + b'],"pageInfo":'
        + orjson.dumps(page_info_json(response.page_info))
        + b"}"
    )
    return Response(content=body, media_type="application/json")
