"""GET /rest/{object}/{id}/history: a record's history, newest first (docs/api.md, "Record
history"). Parameters: limit, after (cursor), field (repeatable or comma-separated), since and
until (RFC 3339); field names and timestamps are checked by the records service."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from crm.records.v1 import records_pb2
from crmkit.errors import InvalidArgument
from gateway.pagination import page_info_json, page_size
from gateway.rest.routes import JSON, Target, _record_id, _target

HISTORY_PARAMS = frozenset({"limit", "after", "field", "since", "until"})
_REPEATABLE = frozenset({"field"})


def _query(request: Request) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for key, value in request.query_params.multi_items():
        if key not in HISTORY_PARAMS:
            raise InvalidArgument(f"unknown query parameter `{key}`", field=key)
        if key in values and key not in _REPEATABLE:
            raise InvalidArgument(f"`{key}` is given more than once", field=key)
        values.setdefault(key, []).append(value)
    return values


def _limit(values: dict[str, list[str]]) -> int:
    raw = values.get("limit")
    if raw is None:
        return page_size(None)
    text = raw[0].strip()
    if not text.lstrip("-").isdecimal() or len(text) > 12:
        raise InvalidArgument("`limit` must be an integer", field="limit")
    return page_size(int(text))


def history_request(target: Target, record_id: str, request: Request) -> Any:
    values = _query(request)
    fields = [name.strip() for raw in values.get("field", []) for name in raw.split(",")]
    if any(not name for name in fields):
        raise InvalidArgument("`field` names a field", field="field")
    return records_pb2.ListHistoryRequest(
        ref=target.ref(),
        id=record_id,
        first=_limit(values),
        after=values.get("after", [""])[0],
        fields=fields,
        since=values.get("since", [""])[0],
        until=values.get("until", [""])[0],
    )


async def record_history(request: Request) -> Response:
    """GET /rest/{object}/{id}/history: `{data: [entry], pageInfo}`."""
    target = await _target(request)
    record_id = _record_id(request)
    response = await target.call("ListHistory", history_request(target, record_id, request))
    body = (
        b'{"data":'
        + response.entries_json
        + b',"pageInfo":'
        + orjson.dumps(page_info_json(response.page_info))
        + b"}"
    )
    return Response(content=body, media_type=JSON)
