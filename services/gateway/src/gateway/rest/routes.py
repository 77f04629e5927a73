"""REST handlers: plain Starlette endpoints, one gRPC call each, records passed through as the
JSON bytes the records service returns (spliced into the response body, never re-encoded).

Every handler authenticates first, resolves `{object}` against the cached data model (a miss
re-checks the model once: a custom object is usable in the very next request), checks the
parameters, then makes its one call with the caller's principal. Errors are ServiceErrors,
answered by the app's one mapper in the spec's body.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from crm.common.v1 import common_pb2
from crm.records.v1 import records_pb2
from crmkit.errors import InvalidArgument, NotFound
from gateway import idempotency
from gateway.auth import authenticate
from gateway.datamodel.model import DataModel, ObjectModel
from gateway.owners import check_owners
from gateway.pagination import page_info_json
from gateway.rest import params as p
from gateway.rest.params import Params, UnknownField, parse_params
from gateway.rpc import call
from gateway.state import GatewayState, gateway_state

MAX_BATCH = 1000
MAX_CHECKED_QUERIES = 256  # per data model (gateway.datamodel.model.DataModel.checked_queries)
MAX_BODY_BYTES = 16 * 1024 * 1024
JSON = "application/json"


class Target:
    """The request's principal, state and object, resolved once."""

    __slots__ = ("_metadata", "model", "obj", "principal", "state")

    def __init__(
        self,
        state: GatewayState,
        principal: common_pb2.Principal,
        model: DataModel,
        obj: ObjectModel,
    ) -> None:
        self.state = state
        self.principal = principal
        self.model = model
        self.obj = obj
        self._metadata: list[tuple[str, str | bytes]] | None = None

    @property
    def metadata(self) -> list[tuple[str, str | bytes]]:
        """The signed principal for upstream calls (signed once per request)."""
        if self._metadata is None:
            self._metadata = self.state.principals.metadata(self.principal)
        return self._metadata

    def ref(self) -> records_pb2.ObjectRef:
        return records_pb2.ObjectRef(object=self.obj.singular, metadata_version=self.model.version)

    async def call(self, method: str, request: Any) -> Any:
        return await call(getattr(self.state.upstreams.records, method), request, self.metadata)

    async def write(self, request: Request, method: str, message: Any) -> Any:
        """A write call, guarded by the request's Idempotency-Key when it has one."""
        guard = await idempotency.rest_metadata(request)
        return await call(
            getattr(self.state.upstreams.records, method), message, self.metadata + guard
        )

    async def params(self, request: Request, allowed: Collection[str], **options: Any) -> Params:
        """The query parameters, checked; an unknown field re-checks the data model once. The
        same query string is parsed once per data model (answers are never changed by their
        callers), at most MAX_CHECKED_QUERIES of them."""
        key = (request.scope["query_string"], self.obj.singular, allowed, *sorted(options.items()))
        known: Params | None = self.model.checked_queries.get(key)
        if known is not None:
            return known
        items = request.query_params.multi_items()
        try:
            params = parse_params(items, self.model, self.obj, allowed=allowed, **options)
        except UnknownField:
            self.model = await self.state.models.refresh(self.principal)
            found = self.model.object(self.obj.singular)
            if found is None:
                raise NotFound(f"unknown object `{self.obj.plural}`", field="object") from None
            self.obj = found
            params = parse_params(items, self.model, self.obj, allowed=allowed, **options)
        checked = self.model.checked_queries
        if len(checked) >= MAX_CHECKED_QUERIES:
            checked.clear()
        checked[key] = params
        return params


async def _target(request: Request) -> Target:
    principal = await authenticate(request)
    state = gateway_state(request)
    model, obj = await state.models.resolve_object(principal, request.path_params["object"])
    return Target(state, principal, model, obj)


def _json(body: bytes, status: int = 200) -> Response:
    return Response(content=body, status_code=status, media_type=JSON)


def _data(payload: bytes, status: int = 200) -> Response:
    """`{"data": <payload>}` around JSON bytes from the records service."""
    return _json(b'{"data":' + payload + b"}", status)


def _record_id(request: Request) -> str:
    return _uuid(request.path_params["id"], "id")


def _uuid(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"`{name}` must be a UUID", field=name)
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidArgument(f"`{name}` must be a UUID", field=name) from None


async def _body(request: Request, check: Callable[[Any], None]) -> bytes:
    """The raw JSON body after `check(parsed)` accepted its shape (the bytes go upstream
    as they came)."""
    raw, _ = await _parsed_body(request, check)
    return raw


async def _owned_body(
    request: Request, target: Target, check: Callable[[Any], None], *, batch: bool = False
) -> bytes:
    """`_body` of a write, its `ownerId` values checked against the workspace's members."""
    raw, parsed = await _parsed_body(request, check)
    records = parsed if batch else [parsed]
    await check_owners(target.state, target.principal, target.metadata, records, batch=batch)
    return raw


async def _parsed_body(request: Request, check: Callable[[Any], None]) -> tuple[bytes, Any]:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise InvalidArgument(f"the body exceeds {MAX_BODY_BYTES} bytes", field="body")
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidArgument("the body is not valid JSON", field="body") from None
    check(parsed)
    return raw, parsed


def _an_object(parsed: Any) -> None:
    if not isinstance(parsed, dict):
        raise InvalidArgument("the body must be a JSON object of record fields", field="body")


def _a_non_empty_object(parsed: Any) -> None:
    _an_object(parsed)
    if not parsed:
        raise InvalidArgument("the body must name at least one field", field="body")


def _a_batch(parsed: Any) -> None:
    if not isinstance(parsed, list):
        raise InvalidArgument("the body must be a JSON array of records", field="body")
    if not parsed:
        raise InvalidArgument("the batch is empty", field="body")
    if len(parsed) > MAX_BATCH:
        raise InvalidArgument(
            f"a batch holds at most {MAX_BATCH} records (got {len(parsed)})", field="body"
        )
    for index, item in enumerate(parsed):
        if not isinstance(item, dict):
            raise InvalidArgument(f"record [{index}] must be a JSON object", field=f"[{index}]")


def _list_body(response: Any) -> bytes:
    body: bytes = (
        b'{"data":'
        + response.records_json
        + b',"pageInfo":'
        + orjson.dumps(page_info_json(response.page_info))
        + b"}"
    )
    return body


# -- handlers -----------------------------------------------------------------------------------


async def list_records(request: Request) -> Response:
    """GET /rest/{object}: `{data: [record], pageInfo}`."""
    target = await _target(request)
    params = await target.params(request, p.LIST_PARAMS)
    response = await target.call(
        "ListRecords",
        records_pb2.ListRecordsRequest(
            ref=target.ref(),
            filter=params.filter,
            order_by=params.order_by,
            first=params.limit,
            after=params.after,
            fields=params.fields,
            depth=params.depth,
            page_cursors_only=True,
        ),
    )
    return _json(_list_body(response))


async def create_record(request: Request) -> Response:
    """POST /rest/{object}: 201 `{data: record}`; with `?upsert=<field>` 200 when the record
    holding the field's value was updated instead."""
    target = await _target(request)
    params = await target.params(request, p.CREATE_PARAMS)
    body = await _owned_body(request, target, _an_object)
    if params.upsert:
        upserted = await _upsert(request, target, body, params.upsert)
        return _data(upserted.records_json[1:-1], 201 if upserted.created[0] else 200)
    response = await target.write(
        request, "CreateRecord", records_pb2.CreateRecordRequest(ref=target.ref(), data_json=body)
    )
    return _data(response.record_json, 201)


async def get_record(request: Request) -> Response:
    """GET /rest/{object}/{id}: `{data: record}`, many-to-one relations nested (depth 1)."""
    target = await _target(request)
    record_id = _record_id(request)
    params = await target.params(request, p.GET_PARAMS, default_depth=1, max_depth=p.MAX_GET_DEPTH)
    response = await target.call(
        "GetRecord",
        records_pb2.GetRecordRequest(
            ref=target.ref(), id=record_id, fields=params.fields, depth=params.depth
        ),
    )
    return _data(response.record_json)


async def update_record(request: Request) -> Response:
    """PATCH /rest/{object}/{id}: `{data: {id, <changed fields>, updatedAt}}`."""
    target = await _target(request)
    record_id = _record_id(request)
    await target.params(request, ())
    body = await _owned_body(request, target, _an_object)
    response = await target.write(
        request,
        "UpdateRecord",
        records_pb2.UpdateRecordRequest(ref=target.ref(), id=record_id, data_json=body),
    )
    record = orjson.loads(response.record_json)
    changed: dict[str, Any] = {"id": record.get("id")}
    for name in response.changed_fields:
        changed[name] = record.get(name)
    changed["updatedAt"] = record.get("updatedAt")
    return _json(orjson.dumps({"data": changed}))


async def delete_record(request: Request) -> Response:
    """DELETE /rest/{object}/{id}: soft delete, `{data: {id, deletedAt}}`."""
    target = await _target(request)
    record_id = _record_id(request)
    await target.params(request, ())
    response = await target.write(
        request, "DeleteRecord", records_pb2.DeleteRecordRequest(ref=target.ref(), id=record_id)
    )
    record = orjson.loads(response.record_json)
    return _json(
        orjson.dumps({"data": {"id": record.get("id"), "deletedAt": record.get("deletedAt")}})
    )


async def restore_record(request: Request) -> Response:
    """PATCH /rest/restore/{object}/{id}: `{data: record}` (active again, deletedAt null)."""
    target = await _target(request)
    record_id = _record_id(request)
    await target.params(request, ())
    response = await target.write(
        request, "RestoreRecord", records_pb2.RestoreRecordRequest(ref=target.ref(), id=record_id)
    )
    return _data(response.record_json)


async def _upsert(
    request: Request, target: Target, body: bytes, match_on: str
) -> records_pb2.UpsertRecordsResponse:
    response: records_pb2.UpsertRecordsResponse = await target.write(
        request,
        "UpsertRecords",
        records_pb2.UpsertRecordsRequest(ref=target.ref(), data_json=body, match_on=match_on),
    )
    return response


async def create_batch(request: Request) -> Response:
    """POST /rest/batch/{object}: up to 1000 records, all or nothing; 201 `{data: [record]}`.
    With `?upsert=<field>`: 200 `{data: [record], meta: {created, updated}}`."""
    target = await _target(request)
    params = await target.params(request, p.CREATE_PARAMS)
    body = await _owned_body(request, target, _a_batch, batch=True)
    if params.upsert:
        upserted = await _upsert(request, target, body, params.upsert)
        created = sum(upserted.created)
        meta = orjson.dumps({"created": created, "updated": len(upserted.created) - created})
        return _json(b'{"data":' + upserted.records_json + b',"meta":' + meta + b"}")
    response = await target.write(
        request, "CreateRecords", records_pb2.CreateRecordsRequest(ref=target.ref(), data_json=body)
    )
    return _data(response.records_json, 201)


async def find_duplicates(request: Request) -> Response:
    """POST /rest/{object}/duplicates: records matching the body's fields (text compared
    case-insensitively), `{data: [record], pageInfo}`."""
    target = await _target(request)
    params = await target.params(request, p.DUPLICATE_PARAMS)
    body = await _body(request, _a_non_empty_object)
    response = await target.call(
        "FindDuplicates",
        records_pb2.FindDuplicatesRequest(
            ref=target.ref(),
            data_json=body,
            first=params.limit,
            after=params.after,
            fields=params.fields,
        ),
    )
    return _json(_list_body(response))


async def merge_records(request: Request) -> Response:
    """PATCH /rest/{object}/merge {sourceId, targetId}: `{data: <merged target>, meta:
    {sourceId, sourceDeletedAt, relationsRepointed}}`."""
    target = await _target(request)
    await target.params(request, ())
    body = orjson.loads(await _body(request, _an_object))
    unknown = sorted(set(body) - {"sourceId", "targetId"})
    if unknown:
        raise InvalidArgument(f"unknown field `{unknown[0]}`", field=unknown[0])
    source_id = _uuid(body.get("sourceId"), "sourceId")
    target_id = _uuid(body.get("targetId"), "targetId")
    if source_id == target_id:
        raise InvalidArgument("a record cannot be merged into itself", field="sourceId")
    response = await target.write(
        request,
        "MergeRecords",
        records_pb2.MergeRecordsRequest(ref=target.ref(), source_id=source_id, target_id=target_id),
    )
    source = orjson.loads(response.source_record_json) if response.source_record_json else {}
    meta = orjson.dumps(
        {
            "sourceId": source_id,
            "sourceDeletedAt": source.get("deletedAt"),
            "relationsRepointed": response.relations_repointed,
        }
    )
    return _json(b'{"data":' + response.record_json + b',"meta":' + meta + b"}")


async def group_records(request: Request) -> Response:
    """GET /rest/{object}/groupBy?field=: `{data: [{<field>: value, count, sum: {...}}]}`."""
    target = await _target(request)
    params = await target.params(request, p.GROUP_PARAMS)
    response = await target.call(
        "GroupRecords",
        records_pb2.GroupRecordsRequest(
            ref=target.ref(),
            field=params.group_field,
            filter=params.filter,
            limit=params.limit,
        ),
    )
    return _data(response.groups_json)
