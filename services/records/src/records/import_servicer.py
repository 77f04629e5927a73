"""gRPC ImportService: store an upload and queue its job; show, list and cancel jobs; stream their
rejections. The jobs run in records.import_worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from crm.records.v1 import records_pb2, records_pb2_grpc
from crmkit import authz
from crmkit.errors import InvalidArgument, ResourceExhausted, ServiceError
from crmkit.principal import PrincipalCodec
from records import import_columns, import_jobs, upserts
from records.cache import SchemaCache
from records.context import RequestContext
from records.import_source import CHUNK_BYTES, CSV, FORMATS, UploadCheck
from records.inputs import RecordIds

Context = Any

_INSERT_JOB = (
    "INSERT INTO records.import_jobs (id, workspace_id, object, format, state, options, "
    "principal, size_bytes) VALUES ($1, $2, $3, $4, 'queued', $5, $6, 0)"
)
_ACTIVE_JOBS = (
    "SELECT count(*) FROM records.import_jobs WHERE workspace_id = $1 "
    "AND state IN ('queued', 'running')"
)


class ImportServicer(records_pb2_grpc.ImportServiceServicer):
    def __init__(
        self,
        pool: Any,
        cache: SchemaCache,
        principals: PrincipalCodec,
        *,
        max_concurrent: int,
    ) -> None:
        self._pool = pool
        self._cache = cache
        self._principals = principals
        self._max_concurrent = max_concurrent
        self._ids = RecordIds()

    async def StartImport(  # noqa: N802
        self, request_iterator: AsyncIterator[records_pb2.ImportUpload], context: Context
    ) -> records_pb2.ImportJobResponse:
        try:
            return await self._start(request_iterator, context)
        except ServiceError:
            # The caller may still be sending: an answer before the end of its stream races
            # with its writes (the gateway then saw a broken call, not this error). Read on.
            async for _ in request_iterator:
                pass
            raise

    async def _start(
        self, request_iterator: AsyncIterator[records_pb2.ImportUpload], context: Context
    ) -> records_pb2.ImportJobResponse:
        principal = self._principals.require(context)
        first = await anext(aiter(request_iterator), None)
        if first is None or not first.HasField("start"):
            raise InvalidArgument("the upload starts with its options", field="file")
        start = first.start
        model = await self._cache.get(principal.workspace_id, start.ref.metadata_version)
        ctx = RequestContext(principal, model)
        obj = ctx.object(start.ref.object)
        ctx.require(obj, authz.WRITE)
        if start.format not in FORMATS:
            raise InvalidArgument("format is csv or ndjson", field="format")
        if start.upsert:
            upserts.match_field(obj, start.upsert)
        mapping = _mapping(start.columns_json)
        check = UploadCheck(start.format)
        job_id = self._ids.new()
        async with self._pool.acquire() as connection, connection.transaction():
            await self._check_capacity(connection, principal.workspace_id)
            await connection.execute(
                _INSERT_JOB,
                job_id,
                principal.workspace_id,
                obj.name_singular,
                start.format,
                {"upsert": start.upsert, "events": not start.skip_events},
                principal.SerializeToString(),
            )
            seq = 0
            pending = bytearray()

            async def store(data: bytes) -> None:
                nonlocal seq
                await connection.execute(
                    "INSERT INTO records.import_chunks (job_id, seq, data) VALUES ($1, $2, $3)",
                    job_id,
                    seq,
                    data,
                )
                seq += 1

            async for message in _with_first(first, request_iterator):
                if not message.data:
                    continue
                check.feed(message.data)
                pending += message.data
                if len(pending) >= CHUNK_BYTES:
                    await store(bytes(pending))
                    pending.clear()
            check.finish()
            if pending:
                await store(bytes(pending))
            columns = None
            if start.format == CSV:
                targets = import_columns.header_targets(model, obj, check.header or [], mapping)
                columns = [None if t is None else t.path for t in targets]
            # Counted again under the workspace's lock: two uploads cannot both take the last slot.
            await self._check_capacity(connection, principal.workspace_id, lock=True)
            await connection.execute(
                "UPDATE records.import_jobs SET size_bytes = $2, "
                "options = options || jsonb_build_object('columns', $3::jsonb) WHERE id = $1",
                job_id,
                check.size,
                columns,
            )
            job = await import_jobs.get(connection, principal.workspace_id, job_id)
        return records_pb2.ImportJobResponse(job_json=orjson.dumps(job))

    async def _check_capacity(self, connection: Any, workspace_id: str, lock: bool = False) -> None:
        if lock:
            await connection.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended('import:' || $1, 0))", workspace_id
            )
        # The job being uploaded is counted once it is inserted (the second check).
        running = await connection.fetchval(_ACTIVE_JOBS, workspace_id) - (1 if lock else 0)
        if running >= self._max_concurrent:
            raise ResourceExhausted(
                f"this workspace already runs {running} imports (at most {self._max_concurrent}"
                " at once); retry when one has finished",
                field="file",
            )

    async def GetImportJob(  # noqa: N802
        self, request: records_pb2.ImportJobRequest, context: Context
    ) -> records_pb2.ImportJobResponse:
        principal = self._principals.require(context)
        async with self._pool.acquire() as connection:
            job = await import_jobs.get(connection, principal.workspace_id, request.id)
        return records_pb2.ImportJobResponse(job_json=orjson.dumps(job))

    async def ListImportJobs(  # noqa: N802
        self, request: records_pb2.ListImportJobsRequest, context: Context
    ) -> records_pb2.ImportJobsResponse:
        principal = self._principals.require(context)
        async with self._pool.acquire() as connection:
            jobs, more = await import_jobs.page(
                connection, principal.workspace_id, request.first, request.after
            )
        return records_pb2.ImportJobsResponse(jobs_json=orjson.dumps(jobs), has_next_page=more)

    async def CancelImportJob(  # noqa: N802
        self, request: records_pb2.ImportJobRequest, context: Context
    ) -> records_pb2.ImportJobResponse:
        principal = self._principals.require(context)
        async with self._pool.acquire() as connection:
            current = await import_jobs.get(connection, principal.workspace_id, request.id)
            model = await self._cache.get(principal.workspace_id)
            ctx = RequestContext(principal, model)
            ctx.require(ctx.object(current["object"]), authz.WRITE)
            job = await import_jobs.cancel(connection, principal.workspace_id, request.id)
        return records_pb2.ImportJobResponse(job_json=orjson.dumps(job))

    async def ListImportRejections(  # noqa: N802
        self, request: records_pb2.ImportJobRequest, context: Context
    ) -> AsyncIterator[records_pb2.ImportRejectionsChunk]:
        principal = self._principals.require(context)
        async with self._pool.acquire() as connection:
            async for chunk in import_jobs.rejections(
                connection, principal.workspace_id, request.id
            ):
                yield records_pb2.ImportRejectionsChunk(rejections_json=chunk)


async def _with_first(
    first: records_pb2.ImportUpload, rest: AsyncIterator[records_pb2.ImportUpload]
) -> AsyncIterator[records_pb2.ImportUpload]:
    yield first
    async for message in rest:
        yield message


def _mapping(raw: bytes) -> dict[str, Any] | None:
    if not raw:
        return None
    try:
        mapping = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidArgument("columns: malformed JSON", field="columns") from None
    if not isinstance(mapping, dict):
        raise InvalidArgument(
            'columns is a JSON object {"<column>": "<field>" | null}', field="columns"
        )
    return mapping
