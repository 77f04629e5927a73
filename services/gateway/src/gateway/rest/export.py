"""Exports over REST: `GET /rest/{object}/export` and the download of an export job,
`GET /rest/exports/{id}/download`, both passing the records service's stream of encoded chunks
through as a chunked response (constant memory: one chunk in flight, HTTP and HTTP/2 flow
control push back on the records service when the client reads slowly).

The first chunk is awaited before the response starts, so an unknown object, a bad format or a
bad filter is answered in the documented error shape; a failure after that can only cut the
response short (the chunked body then lacks its final chunk, which clients report).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2
from crm.records.v1 import records_pb2
from crmkit.errors import InvalidArgument, NotFound, Unauthenticated, from_rpc_error
from crmkit.principal import system_principal
from crmkit.tokens import TokenType, decode_jwt
from gateway.auth import authenticate
from gateway.ratelimit.http import admit_request
from gateway.rest.params import Params
from gateway.rest.routes import Target, _target, _uuid
from gateway.rpc import call
from gateway.state import GatewayState, gateway_state

EXPORT_PARAMS = frozenset({"filter", "orderBy", "fields", "format", "relationField"})
FORMATS = {"csv": records_pb2.EXPORT_FORMAT_CSV, "ndjson": records_pb2.EXPORT_FORMAT_NDJSON}
MEDIA_TYPES: dict[int, tuple[str, str]] = {
    records_pb2.EXPORT_FORMAT_CSV: ("text/csv; charset=utf-8", "csv"),
    records_pb2.EXPORT_FORMAT_NDJSON: ("application/x-ndjson", "ndjson"),
}


def _single(request: Request, name: str) -> str | None:
    found = request.query_params.getlist(name)
    if len(found) > 1:
        raise InvalidArgument(f"`{name}` is given more than once", field=name)
    return found[0] if found else None


def export_request(
    target: Target, params: Params, fmt: str | None, relation_field: str | None
) -> records_pb2.ExportRecordsRequest:
    """The records service's request for checked list parameters, `format` and `relationField`."""
    chosen = FORMATS.get((fmt or "").strip().lower())
    if chosen is None:
        raise InvalidArgument("`format` must be csv or ndjson", field="format")
    return records_pb2.ExportRecordsRequest(
        ref=target.ref(),
        filter=params.filter,
        order_by=params.order_by,
        fields=params.fields,
        format=chosen,
        relation_field=(relation_field or "").strip(),
    )


async def export_records(request: Request) -> Response:
    """GET /rest/{object}/export?format=csv|ndjson: every matching record, streamed."""
    target = await _target(request)
    params = await target.params(request, EXPORT_PARAMS)
    message = export_request(
        target, params, _single(request, "format"), _single(request, "relationField")
    )
    return await _stream(target.state, message, target.metadata, message.format, target.obj.plural)


async def download_export(request: Request) -> Response:
    """GET /rest/exports/{id}/download: an export job's file, with the workspace's credentials
    or `?token=<file token>` from the job (issued to its creator; read with their access)."""
    job_id = _uuid(request.path_params["id"], "id")
    token = request.query_params.get("token")
    state = gateway_state(request)
    if token is None:
        principal = await authenticate(request)
    else:
        principal = await _file_token_principal(state, token, job_id)
        await admit_request(request, principal)
    metadata = state.principals.metadata(principal)
    job = await call(
        state.upstreams.records.GetExportJob,
        records_pb2.GetExportJobRequest(id=job_id),
        metadata,
    )
    return await _stream(
        state, records_pb2.ExportRecordsRequest(job_id=job_id), metadata, job.format, job.object
    )


async def _file_token_principal(
    state: GatewayState, token: str, job_id: str
) -> common_pb2.Principal:
    claims = decode_jwt(state.settings.APP_SECRET, token, TokenType.FILE)
    if claims.jti != job_id:
        raise Unauthenticated(
            "invalid token: issued for another file", reason=common_pb2.ERROR_REASON_TOKEN_INVALID
        )
    # The creator's current access (a role change or removal since applies at once).
    try:
        author = await call(
            state.upstreams.auth.ResolveAuthor,
            identity_pb2.ResolveAuthorRequest(user_id=claims.sub),
            state.principals.metadata(system_principal(claims.workspace_id)),
        )
    except NotFound:
        raise Unauthenticated(
            "invalid token: its user is no longer a member of the workspace",
            reason=common_pb2.ERROR_REASON_TOKEN_REVOKED,
        ) from None
    principal: common_pb2.Principal = author
    return principal


async def _stream(
    state: GatewayState,
    message: records_pb2.ExportRecordsRequest,
    metadata: list[tuple[str, str | bytes]],
    fmt: int,
    name: str,
) -> Response:
    stream = state.upstreams.exports.ExportRecords(message, metadata=metadata)
    try:
        first = await stream.read()
    except grpc.aio.AioRpcError as exc:
        raise from_rpc_error(exc) from None
    if first is grpc.aio.EOF:  # the service always sends a first chunk
        stream.cancel()
        raise InvalidArgument("the export ended before it began", field="export")
    media_type, extension = MEDIA_TYPES[fmt]
    return StreamingResponse(
        _chunks(first, stream),
        media_type=media_type,
        headers={
            "Content-Disposition": f'attachment; filename="{name}.{extension}"',
            "Cache-Control": "no-store",
        },
    )


async def _chunks(first: records_pb2.ExportChunk, stream: Any) -> AsyncIterator[bytes]:
    try:
        if first.data:
            yield first.data
        while True:
            chunk = await stream.read()
            if chunk is grpc.aio.EOF:
                return
            yield chunk.data
    finally:
        stream.cancel()  # the client went away (or it ended): the snapshot is released
