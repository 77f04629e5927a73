"""gRPC servicer of the records service: authenticate, authorize, delegate to the SQL modules."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import orjson
from google.protobuf.message import Message
from nats.aio.client import Client as NatsClient

from crm.common.v1 import common_pb2
from crm.records.v1 import records_pb2, records_pb2_grpc
from crmkit import authz
from crmkit.errors import InvalidArgument, NotFound, PermissionDenied, ResourceExhausted
from crmkit.principal import PrincipalCodec
from records import (
    aggregates,
    export,
    export_jobs,
    history,
    idempotency,
    inputs,
    migrator,
    reads,
    search,
    search_ddl,
    upserts,
    writes,
)
from records.cache import SchemaCache
from records.context import RequestContext
from records.create_groups import CreateGroups
from records.metrics import RecordsMetrics
from records.model import ObjectModel

Context = Any  # grpc.aio.ServicerContext (grpc is untyped)
M = TypeVar("M", bound=Message)


def _json(payload: bytes, field: str = "data") -> Any:
    if not payload:
        raise InvalidArgument(f"{field}: a JSON body is required", field=field)
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise InvalidArgument(f"{field}: malformed JSON", field=field) from None


def _require_filter(request: Any) -> common_pb2.Filter:
    if not request.HasField("filter") or request.filter.WhichOneof("node") is None:
        raise InvalidArgument("a filter is required (an empty filter is refused)", field="filter")
    node: common_pb2.Filter = request.filter
    return node


class RecordsServicer(records_pb2_grpc.RecordsServiceServicer):
    def __init__(
        self,
        pool: Any,
        cache: SchemaCache,
        principals: PrincipalCodec,
        metrics: RecordsMetrics,
        nats: NatsClient | None = None,
        count_cap: int = 10_000,
        idempotency_ttl: float = 24 * 3600.0,
        search_pool: Any = None,
        create_group_in_flight: int = 2,
    ) -> None:
        self._pool = pool
        self._creates = CreateGroups(pool, create_group_in_flight, metrics.create_rows.observe)
        # Searches run on sessions carrying search.SESSION_SETTINGS (app.serve's search pool).
        self._search_pool = search_pool if search_pool is not None else pool
        self._nats = nats
        self._count_cap = count_cap
        self._idempotency_ttl = idempotency_ttl
        self._metrics = metrics
        self._cache = cache
        self._principals = principals
        self._ids = inputs.RecordIds()
        # An export holds a pooled connection for as long as its client reads: at most half
        # the pool, so exports cannot starve every other request of this instance.
        self._export_slots = asyncio.Semaphore(max(1, pool.get_max_size() // 2))
        self._trigram = ""  # pg_trgm's schema, looked up on the first search

    async def _context(
        self, context: Context, ref: records_pb2.ObjectRef, action: int
    ) -> tuple[RequestContext, ObjectModel, authz.Access]:
        principal = self._principals.require(context)
        model = await self._cache.get(principal.workspace_id, ref.metadata_version)
        ctx = RequestContext(principal, model)
        obj = ctx.object(ref.object)
        return ctx, obj, ctx.require(obj, action)

    async def _write(
        self,
        context: Context,
        ctx: RequestContext,
        method: str,
        response_type: type[M],
        write: Callable[[Any], Awaitable[M]],
    ) -> M:
        """`write(connection)` on a pooled connection, guarded by the request's idempotency key
        when it carries one (records.idempotency)."""
        guard = idempotency.guard_of(context, ctx.principal, method)
        return await idempotency.run(self._pool, guard, self._idempotency_ttl, response_type, write)

    # -- schema ----------------------------------------------------------------------------------
    async def MigrateSchema(  # noqa: N802
        self, request: records_pb2.MigrateSchemaRequest, context: Context
    ) -> records_pb2.MigrateSchemaResponse:
        principal = self._principals.require(context)
        authz.require_flag(principal, common_pb2.FLAG_DATA_MODEL)
        if request.schema.workspace_id != principal.workspace_id:
            raise PermissionDenied("the schema belongs to another workspace")
        result = await migrator.migrate(self._pool, request.change_id, request.schema)
        outcome = "already_applied" if result.already_applied else "applied"
        if not result.already_applied and not result.statements:
            outcome = "unchanged"
        self._metrics.migrations.labels(outcome).inc()
        if result.model is not None:
            self._cache.put(result.model)
        if not result.already_applied and self._nats is not None:
            await migrator.announce_applied(
                self._nats, principal.workspace_id, result.applied_version
            )
        return records_pb2.MigrateSchemaResponse(
            applied_version=result.applied_version,
            already_applied=result.already_applied,
            statements=result.statements,
        )

    async def GetSchemaVersion(  # noqa: N802
        self, request: records_pb2.GetSchemaVersionRequest, context: Context
    ) -> records_pb2.GetSchemaVersionResponse:
        principal = self._principals.require(context)
        workspace_id = request.workspace_id or principal.workspace_id
        if workspace_id != principal.workspace_id:
            raise PermissionDenied("another workspace")
        version, change_id = await migrator.applied_version(self._pool, workspace_id)
        return records_pb2.GetSchemaVersionResponse(applied_version=version, change_id=change_id)

    # -- create ----------------------------------------------------------------------------------
    async def CreateRecord(  # noqa: N802
        self, request: records_pb2.CreateRecordRequest, context: Context
    ) -> records_pb2.RecordResponse:
        ctx, obj, access = await self._context(context, request.ref, authz.WRITE)
        names = reads.check_fields(obj, list(request.fields))
        prepared = inputs.prepare_create(obj, _json(request.data_json), "", access, self._ids)
        guard = idempotency.guard_of(context, ctx.principal, "CreateRecord")
        if guard is None:
            created = await self._creates.create(ctx, obj, prepared, names)
            return records_pb2.RecordResponse(record_json=created.record_json.encode())

        async def write(connection: Any) -> records_pb2.RecordResponse:
            written = await writes.create(connection, ctx, obj, [prepared], names)
            return records_pb2.RecordResponse(record_json=written[0].record_json.encode())

        return await idempotency.run(
            self._pool, guard, self._idempotency_ttl, records_pb2.RecordResponse, write
        )

    async def CreateRecords(  # noqa: N802
        self, request: records_pb2.CreateRecordsRequest, context: Context
    ) -> records_pb2.RecordsResponse:
        ctx, obj, access = await self._context(context, request.ref, authz.WRITE)
        names = reads.check_fields(obj, list(request.fields))
        batch = inputs.prepare_batch(obj, _json(request.data_json), access, self._ids)

        async def write(connection: Any) -> records_pb2.RecordsResponse:
            written = await writes.create(connection, ctx, obj, batch, names)
            return records_pb2.RecordsResponse(
                records_json=reads.json_array(item.record_json for item in written)
            )

        return await self._write(context, ctx, "CreateRecords", records_pb2.RecordsResponse, write)

    async def UpsertRecords(  # noqa: N802
        self, request: records_pb2.UpsertRecordsRequest, context: Context
    ) -> records_pb2.UpsertRecordsResponse:
        ctx, obj, access = await self._context(context, request.ref, authz.WRITE)
        names = reads.check_fields(obj, list(request.fields))
        item = upserts.match_field(obj, request.match_on)
        data = _json(request.data_json)
        single = isinstance(data, dict)
        if single:
            batch = [inputs.prepare_create(obj, data, "", access, self._ids)]
        else:
            batch = inputs.prepare_batch(obj, data, access, self._ids)

        async def write(connection: Any) -> records_pb2.UpsertRecordsResponse:
            done = await upserts.upsert(
                connection, ctx, obj, access, batch, item, names, batch=not single
            )
            return records_pb2.UpsertRecordsResponse(
                records_json=reads.json_array(entry.record_json for entry in done),
                created=[entry.created for entry in done],
            )

        return await self._write(
            context, ctx, "UpsertRecords", records_pb2.UpsertRecordsResponse, write
        )

    # -- read ------------------------------------------------------------------------------------
    async def GetRecord(  # noqa: N802
        self, request: records_pb2.GetRecordRequest, context: Context
    ) -> records_pb2.RecordResponse:
        ctx, obj, access = await self._context(context, request.ref, authz.READ)
        names = reads.check_fields(obj, list(request.fields))
        depth = reads.check_depth(request.depth)
        async with self._pool.acquire() as connection:
            found = await reads.get_record(
                connection, ctx, obj, access, request.id, names, depth, request.deleted
            )
        return records_pb2.RecordResponse(record_json=found.encode())

    async def GetRecordsByIds(  # noqa: N802
        self, request: records_pb2.GetRecordsByIdsRequest, context: Context
    ) -> records_pb2.RecordsResponse:
        ctx, obj, access = await self._context(context, request.ref, authz.READ)
        names = reads.check_fields(obj, list(request.fields))
        async with self._pool.acquire() as connection:
            found = await reads.get_by_ids(
                connection, ctx, obj, access, list(request.ids), names, request.deleted
            )
        return records_pb2.RecordsResponse(records_json=found)

    async def ListRecords(  # noqa: N802
        self, request: records_pb2.ListRecordsRequest, context: Context
    ) -> records_pb2.ListRecordsResponse:
        ctx, obj, access = await self._context(context, request.ref, authz.READ)
        async with self._pool.acquire() as connection:
            page = await reads.list_records(
                connection, ctx, obj, access, request, count_cap=self._count_cap
            )
        return records_pb2.ListRecordsResponse(
            records_json=page.records_json,
            cursors=page.cursors,
            page_info=page.page_info,
            total_count=page.total_count,
            total_count_is_estimate=page.total_count_is_estimate,
        )

    async def ListRelated(  # noqa: N802
        self, request: records_pb2.ListRelatedRequest, context: Context
    ) -> records_pb2.ListRelatedResponse:
        ctx, obj, access = await self._context(context, request.ref, authz.READ)
        async with self._pool.acquire() as connection:
            groups = await reads.list_related(connection, ctx, obj, access, request)
        return records_pb2.ListRelatedResponse(groups=groups)

    async def Search(  # noqa: N802
        self, request: records_pb2.SearchRequest, context: Context
    ) -> records_pb2.SearchResponse:
        principal = self._principals.require(context)
        model = await self._cache.get(principal.workspace_id, request.metadata_version)
        ctx = RequestContext(principal, model)
        async with self._search_pool.acquire() as connection:
            if not self._trigram:
                self._trigram = await search_ddl.trigram_schema(connection)
            return await search.search(connection, ctx, self._trigram, request)

    # -- update ----------------------------------------------------------------------------------
    async def UpdateRecord(  # noqa: N802
        self, request: records_pb2.UpdateRecordRequest, context: Context
    ) -> records_pb2.RecordResponse:
        ctx, obj, access = await self._context(context, request.ref, authz.WRITE)
        names = reads.check_fields(obj, list(request.fields))
        prepared = inputs.prepare_update(obj, _json(request.data_json), access)

        async def write(connection: Any) -> records_pb2.RecordResponse:
            written = await writes.update(
                connection, ctx, obj, access, prepared, names, record_id=request.id
            )
            return records_pb2.RecordResponse(
                record_json=written[0].record_json.encode(),
                changed_fields=written[0].changed_fields,
            )

        return await self._write(context, ctx, "UpdateRecord", records_pb2.RecordResponse, write)

    async def UpdateRecords(  # noqa: N802
        self, request: records_pb2.UpdateRecordsRequest, context: Context
    ) -> records_pb2.RecordsResponse:
        ctx, obj, access = await self._context(context, request.ref, authz.WRITE)
        node = _require_filter(request)
        names = reads.check_fields(obj, list(request.fields))
        prepared = inputs.prepare_update(obj, _json(request.data_json), access)

        async def write(connection: Any) -> records_pb2.RecordsResponse:
            written = await writes.update(connection, ctx, obj, access, prepared, names, node=node)
            return records_pb2.RecordsResponse(
                records_json=reads.json_array(item.record_json for item in written)
            )

        return await self._write(context, ctx, "UpdateRecords", records_pb2.RecordsResponse, write)

    # -- delete and restore ----------------------------------------------------------------------
    async def DeleteRecord(  # noqa: N802
        self, request: records_pb2.DeleteRecordRequest, context: Context
    ) -> records_pb2.RecordResponse:
        ctx, obj, access = await self._context(context, request.ref, authz.DELETE)

        async def write(connection: Any) -> records_pb2.RecordResponse:
            written = await writes.set_deleted(
                connection, ctx, obj, access, deleted=True, record_id=request.id
            )
            if not written:
                raise _not_found(obj, request.id)
            return records_pb2.RecordResponse(
                record_json=written[0].record_json.encode(), changed_fields=["deletedAt"]
            )

        return await self._write(context, ctx, "DeleteRecord", records_pb2.RecordResponse, write)

    async def DeleteRecords(  # noqa: N802
        self, request: records_pb2.DeleteRecordsRequest, context: Context
    ) -> records_pb2.RecordsResponse:
        ctx, obj, access = await self._context(context, request.ref, authz.DELETE)
        node = _require_filter(request)

        async def write(connection: Any) -> records_pb2.RecordsResponse:
            written = await writes.set_deleted(
                connection, ctx, obj, access, deleted=True, node=node
            )
            return records_pb2.RecordsResponse(
                records_json=reads.json_array(item.record_json for item in written)
            )

        return await self._write(context, ctx, "DeleteRecords", records_pb2.RecordsResponse, write)

    async def RestoreRecord(  # noqa: N802
        self, request: records_pb2.RestoreRecordRequest, context: Context
    ) -> records_pb2.RecordResponse:
        ctx, obj, access = await self._context(context, request.ref, authz.DELETE)

        async def write(connection: Any) -> records_pb2.RecordResponse:
            written = await writes.set_deleted(
                connection, ctx, obj, access, deleted=False, record_id=request.id
            )
            if written:
                return records_pb2.RecordResponse(
                    record_json=written[0].record_json.encode(), changed_fields=["deletedAt"]
                )
            # Restoring an active record changes nothing and answers it as it is.
            found = await reads.get_record(connection, ctx, obj, access, request.id, (), 0, 0)
            return records_pb2.RecordResponse(record_json=found.encode())

        return await self._write(context, ctx, "RestoreRecord", records_pb2.RecordResponse, write)

    # -- aggregates, duplicates, merge -----------------------------------------------------------
    async def AggregateRecords(  # noqa: N802
        self, request: records_pb2.AggregateRecordsRequest, context: Context
    ) -> records_pb2.AggregateRecordsResponse:
        ctx, obj, access = await self._context(context, request.ref, authz.READ)
        async with self._pool.acquire() as connection:
            result = await aggregates.aggregate(
                connection, ctx, obj, access, request, count_cap=self._count_cap
            )
        return records_pb2.AggregateRecordsResponse(result_json=result)

    async def GroupRecords(  # noqa: N802
        self, request: records_pb2.GroupRecordsRequest, context: Context
    ) -> records_pb2.GroupRecordsResponse:
        ctx, obj, access = await self._context(context, request.ref, authz.READ)
        async with self._pool.acquire() as connection:
            groups = await aggregates.group(connection, ctx, obj, access, request)
        return records_pb2.GroupRecordsResponse(groups_json=groups)

    async def FindDuplicates(  # noqa: N802
        self, request: records_pb2.FindDuplicatesRequest, context: Context
    ) -> records_pb2.ListRecordsResponse:
        ctx, obj, access = await self._context(context, request.ref, authz.READ)
        data = _json(request.data_json)
        async with self._pool.acquire() as connection:
            page = await aggregates.duplicates(connection, ctx, obj, access, request, data)
        return records_pb2.ListRecordsResponse(
            records_json=page.records_json, cursors=page.cursors, page_info=page.page_info
        )

    async def MergeRecords(  # noqa: N802
        self, request: records_pb2.MergeRecordsRequest, context: Context
    ) -> records_pb2.MergeRecordsResponse:
        ctx, obj, access = await self._context(context, request.ref, authz.WRITE)
        ctx.require(obj, authz.DELETE)

        async def write(connection: Any) -> records_pb2.MergeRecordsResponse:
            async with connection.transaction():
                merged = await writes.merge(
                    connection, ctx, obj, access, request.source_id, request.target_id
                )
            return records_pb2.MergeRecordsResponse(
                record_json=merged.target.encode(),
                source_record_json=merged.source.encode(),
                relations_repointed=merged.repointed,
            )

        return await self._write(
            context, ctx, "MergeRecords", records_pb2.MergeRecordsResponse, write
        )

    # -- history ---------------------------------------------------------------------------------
    async def ListHistory(  # noqa: N802
        self, request: records_pb2.ListHistoryRequest, context: Context
    ) -> records_pb2.ListHistoryResponse:
        ctx, obj, access = await self._context(context, request.ref, authz.READ)
        async with self._pool.acquire() as connection:
            page = await history.list_history(
                connection,
                ctx,
                obj,
                access,
                request.id,
                first=request.first,
                after=request.after,
                fields=list(request.fields),
                since=request.since,
                until=request.until,
            )
        return records_pb2.ListHistoryResponse(
            entries_json=page.entries_json, cursors=page.cursors, page_info=page.page_info
        )

    # -- export ----------------------------------------------------------------------------------
    async def ExportRecords(  # noqa: N802
        self, request: records_pb2.ExportRecordsRequest, context: Context
    ) -> AsyncIterator[records_pb2.ExportChunk]:
        if request.job_id:
            principal = self._principals.require(context)
            model = await self._cache.get(principal.workspace_id, 0)
            ctx = RequestContext(principal, model)
            job = await export_jobs.get(self._pool, ctx, request.job_id)
            request = export_jobs.saved_request(job)
        ctx, obj, access = await self._context(context, request.ref, authz.READ)
        query = export.build_query(ctx, obj, access, request)
        if self._export_slots.locked():
            raise ResourceExhausted(
                "too many exports are running on this records instance: retry shortly",
                field="export",
            )
        async with self._export_slots:
            async for chunk in export.stream(self._pool, query, request.format):
                yield chunk

    async def CreateExportJob(  # noqa: N802
        self, request: records_pb2.ExportRecordsRequest, context: Context
    ) -> records_pb2.ExportJob:
        ctx, obj, access = await self._context(context, request.ref, authz.READ)
        query = export.build_query(ctx, obj, access, request)
        async with self._pool.acquire() as connection:
            await connection.prepare(query.sql)  # refuses what the database would refuse
        return await export_jobs.create(self._pool, ctx, obj.name_singular, request)

    async def GetExportJob(  # noqa: N802
        self, request: records_pb2.GetExportJobRequest, context: Context
    ) -> records_pb2.ExportJob:
        principal = self._principals.require(context)
        model = await self._cache.get(principal.workspace_id, 0)
        ctx = RequestContext(principal, model)
        job = await export_jobs.get(self._pool, ctx, request.id)
        saved = export_jobs.saved_request(job)
        obj = ctx.object(saved.ref.object)
        ctx.require(obj, authz.READ)
        return job


def _not_found(obj: ObjectModel, record_id: str) -> NotFound:
    return NotFound(f"{obj.name_singular} {record_id} not found", field="id")
