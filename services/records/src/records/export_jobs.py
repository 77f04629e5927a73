"""Export jobs: an export request saved in `records.export_jobs`, downloaded later (any number of
times) by streaming it like a direct export. The file is not materialized: each download reads
its own snapshot, taken when the download starts, under the downloader's current access."""

from __future__ import annotations

import uuid
from typing import Any

from crm.records.v1 import records_pb2
from crmkit.errors import NotFound
from records import values
from records.context import RequestContext

_INSERT = (
    "INSERT INTO records.export_jobs (id, workspace_id, object, format, request, created_by) "
    "VALUES ($1, $2, $3, $4, $5, $6) RETURNING to_char(created_at AT TIME ZONE 'UTC', "
    '\'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"\')'
)
_SELECT = (
    "SELECT object, format, request, to_char(created_at AT TIME ZONE 'UTC', "
    '\'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"\') FROM records.export_jobs '
    "WHERE id = $1 AND workspace_id = $2"
)


async def create(
    pool: Any, ctx: RequestContext, object_name: str, request: records_pb2.ExportRecordsRequest
) -> records_pb2.ExportJob:
    job_id = uuid.uuid4()
    principal = ctx.principal
    saved = records_pb2.ExportRecordsRequest()
    saved.CopyFrom(request)
    saved.ref.object = object_name
    saved.ref.metadata_version = 0
    payload = saved.SerializeToString()
    created_at = await pool.fetchval(
        _INSERT,
        job_id,
        uuid.UUID(principal.workspace_id),
        object_name,
        request.format,
        payload,
        principal.user_id or principal.credential_id,
    )
    return records_pb2.ExportJob(
        id=str(job_id),
        object=object_name,
        format=request.format,
        created_at=created_at,
        request=payload,
    )


async def get(pool: Any, ctx: RequestContext, job_id: str) -> records_pb2.ExportJob:
    canonical = values.canonical_uuid(job_id, "id")
    row = await pool.fetchrow(_SELECT, uuid.UUID(canonical), uuid.UUID(ctx.principal.workspace_id))
    if row is None:
        raise NotFound(f"export job {job_id} not found", field="id")
    return records_pb2.ExportJob(
        id=canonical, object=row[0], format=row[1], request=bytes(row[2]), created_at=row[3]
    )


def saved_request(job: records_pb2.ExportJob) -> records_pb2.ExportRecordsRequest:
    request = records_pb2.ExportRecordsRequest()
    request.ParseFromString(job.request)
    return request
