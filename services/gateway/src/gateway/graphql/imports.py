"""Import jobs on GraphQL (docs/api.md, "Import"): `importJob(id)`, `importJobs(first, after)`
(newest first) and `cancelImportJob(id)`. Uploads go through REST (`POST /rest/imports/{object}`);
the whole rejection list through `GET /rest/imports/{id}/rejections`."""

from __future__ import annotations

import uuid
from enum import Enum
from typing import Any

import orjson
import strawberry

from crm.records.v1 import records_pb2
from gateway.graphql.context import GraphQLContext
from gateway.graphql.parts import SchemaPart

Info = strawberry.Info[GraphQLContext, None]


@strawberry.enum(description="Where an import job stands.")
class ImportJobState(Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


@strawberry.type(description="A rejected row: its line in the file, the field and why.")
class ImportRejection:
    line: int
    field: str | None
    reason: str


@strawberry.type(description="An import job (POST /rest/imports/{object}).")
class ImportJob:
    id: uuid.UUID
    object: str
    format: str
    state: ImportJobState
    upsert: str | None
    emit_events: bool
    size_bytes: int
    rows_read: int
    rows_written: int
    rows_rejected: int
    first_rejections: list[ImportRejection] = strawberry.field(
        description="The first 10 rejected rows; GET /rest/imports/{id}/rejections has them all."
    )
    error: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None

    @classmethod
    def of(cls, raw: bytes | dict[str, Any]) -> ImportJob:
        job = orjson.loads(raw) if isinstance(raw, bytes) else raw
        return cls(
            id=uuid.UUID(job["id"]),
            object=job["object"],
            format=job["format"],
            state=ImportJobState(job["state"]),
            upsert=job["upsert"],
            emit_events=job["emitEvents"],
            size_bytes=job["sizeBytes"],
            rows_read=job["rowsRead"],
            rows_written=job["rowsWritten"],
            rows_rejected=job["rowsRejected"],
            first_rejections=[ImportRejection(**entry) for entry in job["firstRejections"]],
            error=job["error"],
            created_at=job["createdAt"],
            started_at=job["startedAt"],
            finished_at=job["finishedAt"],
        )


async def _import_job(info: Info, id: uuid.UUID) -> ImportJob:
    context = info.context
    response = await context.ask(
        context.state.upstreams.imports.GetImportJob, records_pb2.ImportJobRequest(id=str(id))
    )
    return ImportJob.of(response.job_json)


async def _import_jobs(
    info: Info, first: int | None = None, after: uuid.UUID | None = None
) -> list[ImportJob]:
    context = info.context
    request = records_pb2.ListImportJobsRequest(first=first or 0, after=str(after) if after else "")
    response = await context.ask(context.state.upstreams.imports.ListImportJobs, request)
    return [ImportJob.of(job) for job in orjson.loads(response.jobs_json)]


async def _cancel_import_job(info: Info, id: uuid.UUID) -> ImportJob:
    context = info.context
    response = await context.ask(
        context.state.upstreams.imports.CancelImportJob, records_pb2.ImportJobRequest(id=str(id))
    )
    return ImportJob.of(response.job_json)


@strawberry.type
class ImportsQuery:
    import_job: ImportJob = strawberry.field(resolver=_import_job)
    import_jobs: list[ImportJob] = strawberry.field(
        resolver=_import_jobs,
        description="Newest first; `first` (default 20, at most 100), `after` the id of the "
        "last job seen.",
    )


@strawberry.type
class ImportsMutation:
    cancel_import_job: ImportJob = strawberry.mutation(
        resolver=_cancel_import_job,
        description="Stops a queued or running job after its current batch; rows written stay.",
    )


IMPORTS_PART = SchemaPart(name="imports", query=ImportsQuery, mutation=ImportsMutation)
