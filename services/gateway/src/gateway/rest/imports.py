"""REST import jobs (docs/api.md, "Import"): the upload is streamed to the records service in
chunks as it arrives (never held whole), which stores it and queues the job; jobs are shown,
listed, cancelled, and their rejections downloaded as CSV."""

from __future__ import annotations

import asyncio
import csv
import io
from collections.abc import AsyncIterator
from typing import Any

import grpc
import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from crm.records.v1 import records_pb2
from crmkit.errors import InvalidArgument, from_rpc_error
from gateway.auth import authenticate
from gateway.body_limit import refusal
from gateway.rest.routes import _target
from gateway.rpc import call
from gateway.state import gateway_state

JSON = "application/json"
_FORMATS = {"text/csv": "csv", "application/x-ndjson": "ndjson", "application/ndjson": "ndjson"}
_OPTIONS = frozenset({"format", "upsert", "events", "columns"})
CHUNK_BYTES = 256 * 1024


def _options(request: Request) -> records_pb2.ImportStart:
    query = request.query_params
    for name in query:
        if name not in _OPTIONS:
            raise InvalidArgument(f"unknown query parameter `{name}`", field=name)
    fmt = query.get("format")
    if fmt is None:
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        fmt = _FORMATS.get(content_type)
    if fmt not in ("csv", "ndjson"):
        raise InvalidArgument(
            "`format` is csv or ndjson (or send Content-Type text/csv or application/x-ndjson)",
            field="format",
        )
    events = query.get("events", "true")
    if events not in ("true", "false"):
        raise InvalidArgument("`events` is true or false", field="events")
    return records_pb2.ImportStart(
        format=fmt,
        upsert=query.get("upsert", ""),
        skip_events=events == "false",
        columns_json=query.get("columns", "").encode(),
    )


async def start_import(request: Request) -> Response:
    """POST /rest/imports/{object}: 202 `{data: job}` once the whole file is stored."""
    target = await _target(request)
    start = _options(request)
    start.ref.CopyFrom(target.ref())
    limit = gateway_state(request).settings.IMPORT_MAX_BYTES
    state: dict[str, Any] = {"size": 0, "over": False}

    async def upload() -> AsyncIterator[records_pb2.ImportUpload]:
        yield records_pb2.ImportUpload(start=start)
        pending = bytearray()
        async for piece in request.stream():
            state["size"] += len(piece)
            if state["size"] > limit:
                state["over"] = True
                state["call"].cancel()
                return
            pending += piece
            if len(pending) >= CHUNK_BYTES:
                yield records_pb2.ImportUpload(data=bytes(pending))
                pending.clear()
        if pending:
            yield records_pb2.ImportUpload(data=bytes(pending))

    stub = target.state.upstreams.imports
    state["call"] = stub.StartImport(upload(), metadata=target.metadata)
    try:
        response = await state["call"]
    except asyncio.CancelledError:
        if state["over"]:
            return refusal(request.url.path, limit)
        raise
    except grpc.aio.AioRpcError as exc:
        if state["over"]:
            return refusal(request.url.path, limit)
        raise from_rpc_error(exc) from None
    except ClientDisconnect:
        state["call"].cancel()
        raise
    return Response(b'{"data":' + response.job_json + b"}", status_code=202, media_type=JSON)


async def _principal_metadata(request: Request) -> list[tuple[str, str | bytes]]:
    principal = await authenticate(request)
    metadata: list[tuple[str, str | bytes]] = gateway_state(request).principals.metadata(principal)
    return metadata


async def _job(request: Request, method: str) -> Response:
    """`{data: job}` from the ImportService `method` called with the path's job id."""
    metadata = await _principal_metadata(request)
    stub = gateway_state(request).upstreams.imports
    job = records_pb2.ImportJobRequest(id=request.path_params["id"])
    response = await call(getattr(stub, method), job, metadata)
    return Response(b'{"data":' + response.job_json + b"}", media_type=JSON)


async def get_import(request: Request) -> Response:
    """GET /rest/imports/{id}: `{data: job}`."""
    return await _job(request, "GetImportJob")


async def list_imports(request: Request) -> Response:
    """GET /rest/imports?limit=&after=: `{data: [job], pageInfo: {hasNextPage, endCursor}}`,
    newest first."""
    metadata = await _principal_metadata(request)
    query = request.query_params
    for name in query:
        if name not in ("limit", "after"):
            raise InvalidArgument(f"unknown query parameter `{name}`", field=name)
    limit = query.get("limit", "20")
    if not limit.isdecimal():
        raise InvalidArgument("`limit` must be an integer", field="limit")
    stub = gateway_state(request).upstreams.imports
    response = await call(
        stub.ListImportJobs,
        records_pb2.ListImportJobsRequest(first=int(limit[:6]), after=query.get("after", "")),
        metadata,
    )
    jobs = orjson.loads(response.jobs_json)
    page = {"hasNextPage": response.has_next_page, "endCursor": jobs[-1]["id"] if jobs else None}
    return Response(
        b'{"data":' + response.jobs_json + b',"pageInfo":' + orjson.dumps(page) + b"}",
        media_type=JSON,
    )


async def cancel_import(request: Request) -> Response:
    """POST /rest/imports/{id}/cancel: `{data: job}` (state cancelled; rows written stay)."""
    return await _job(request, "CancelImportJob")


async def import_rejections(request: Request) -> Response:
    """GET /rest/imports/{id}/rejections: every rejected row as CSV `line,field,reason`."""
    metadata = await _principal_metadata(request)
    stub = gateway_state(request).upstreams.imports
    stream = stub.ListImportRejections(
        records_pb2.ImportJobRequest(id=request.path_params["id"]), metadata=metadata
    )
    try:
        first = await stream.read()
    except grpc.aio.AioRpcError as exc:
        raise from_rpc_error(exc) from None

    async def lines() -> AsyncIterator[bytes]:
        yield b"line,field,reason\r\n"
        message = first
        while message is not grpc.aio.EOF:
            buffer = io.StringIO()
            writer = csv.writer(buffer)
            for entry in orjson.loads(message.rejections_json):
                writer.writerow([entry["line"], entry["field"] or "", entry["reason"]])
            yield buffer.getvalue().encode()
            message = await stream.read()

    return StreamingResponse(lines(), media_type="text/csv; charset=utf-8")
