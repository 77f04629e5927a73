"""Export jobs in GraphQL: `createExport` saves an export (checked like GET /rest/{object}/export
checks its parameters) and answers the job with a download URL; `exportJob` shows a job again
with a fresh URL. The download is `GET /rest/exports/{id}/download`, with the workspace's
credentials or the URL's short-lived file token (FILE_TOKEN_EXPIRES_IN, issued by identity to
users; API keys download with their own credential). See docs/api.md, "Export jobs".
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import Enum
from typing import Any
from urllib.parse import quote

import orjson
import strawberry
from strawberry.scalars import JSON

from crm.identity.v1 import identity_pb2
from crm.records.v1 import records_pb2
from crmkit.errors import InvalidArgument, PermissionDenied
from gateway.graphql.context import GraphQLContext
from gateway.graphql.parts import SchemaPart
from gateway.rest.export import EXPORT_PARAMS
from gateway.rest.params import parse_params

Info = strawberry.Info[GraphQLContext, None]


@strawberry.enum(description="The file format of an export.")
class ExportFormat(Enum):
    CSV = "csv"  # RFC 4180, UTF-8, a header row of field names
    NDJSON = "ndjson"  # one record JSON per line


_FORMATS = {
    ExportFormat.CSV: records_pb2.EXPORT_FORMAT_CSV,
    ExportFormat.NDJSON: records_pb2.EXPORT_FORMAT_NDJSON,
}
_FORMAT_OF = {value: name for name, value in _FORMATS.items()}


@strawberry.enum(description="Where an export job stands.")
class ExportJobState(Enum):
    READY = "READY"  # downloadable: each download streams a snapshot taken when it starts


@strawberry.input(description="One sort key of an export (id is always the last tie breaker).")
class ExportOrderBy:
    field: str
    direction: str = strawberry.field(default="ASC", description="ASC or DESC.")


@strawberry.type(description="A saved export, downloaded as a stream (nothing is stored).")
class ExportJob:
    id: uuid.UUID
    object: str = strawberry.field(description="Singular name of the exported object.")
    format: ExportFormat
    state: ExportJobState
    created_at: datetime
    download_url: str = strawberry.field(
        description="GET it with the workspace's credentials; when fileToken is set the URL "
        "carries it and needs no Authorization header until it expires."
    )
    file_token: str | None = strawberry.field(
        description="Signed access to this job's file only (users; null for API keys)."
    )
    file_token_expires_in: int | None = strawberry.field(description="Seconds.")


async def _job(info: Info, job: records_pb2.ExportJob) -> ExportJob:
    context = info.context
    token: identity_pb2.IssuedToken | None = None
    if context.principal.user_id:
        try:
            token = await context.ask(
                context.state.upstreams.auth.IssueToken,
                identity_pb2.IssueTokenRequest(
                    type=identity_pb2.IssueTokenRequest.TOKEN_TYPE_FILE, subject=job.id
                ),
            )
        except PermissionDenied:  # e.g. an OAuth token without the * scope: credentials only
            token = None
    url = f"{str(context.connection.base_url).rstrip('/')}/rest/exports/{job.id}/download"
    if token is not None:
        url += "?token=" + quote(token.token, safe="")
    return ExportJob(
        id=uuid.UUID(job.id),
        object=job.object,
        format=_FORMAT_OF[job.format],
        state=ExportJobState.READY,
        created_at=datetime.fromisoformat(job.created_at.replace("Z", "+00:00")),
        download_url=url,
        file_token=token.token if token is not None else None,
        file_token_expires_in=token.expires_in if token is not None else None,
    )


def _query_items(
    filter: Any, fields: list[str] | None, order_by: list[ExportOrderBy] | None
) -> list[tuple[str, str]]:
    """The arguments as REST query parameters, so both surfaces check them by one code."""
    items: list[tuple[str, str]] = []
    if filter is not None:
        items.append(("filter", orjson.dumps(filter).decode()))
    for entry in order_by or []:
        if not entry.field or "[" in entry.field or "]" in entry.field:
            raise InvalidArgument("orderBy: a field name is required", field="orderBy")
        items.append((f"orderBy[{entry.field}]", entry.direction))
    if fields is not None:
        if not fields:
            raise InvalidArgument("`fields` must name at least one field", field="fields")
        items.append(("fields", ",".join(fields)))
    return items


async def _create_export(
    info: Info,
    object: str,
    format: ExportFormat,
    filter: JSON | None = None,
    fields: list[str] | None = None,
    order_by: list[ExportOrderBy] | None = None,
    relation_field: str | None = None,
) -> ExportJob:
    context = info.context
    model, obj = await context.state.models.resolve_object(context.principal, object)
    items = _query_items(filter, fields, order_by)
    params = parse_params(items, model, obj, allowed=EXPORT_PARAMS)
    job = await context.ask(
        context.state.upstreams.records.CreateExportJob,
        records_pb2.ExportRecordsRequest(
            ref=records_pb2.ObjectRef(object=obj.singular, metadata_version=model.version),
            filter=params.filter,
            order_by=params.order_by,
            fields=params.fields,
            format=_FORMATS[format],
            relation_field=(relation_field or "").strip(),
        ),
    )
    return await _job(info, job)


async def _export_job(info: Info, id: uuid.UUID) -> ExportJob:
    context = info.context
    job = await context.ask(
        context.state.upstreams.records.GetExportJob,
        records_pb2.GetExportJobRequest(id=str(id)),
    )
    return await _job(info, job)


@strawberry.type
class ExportsQuery:
    export_job: ExportJob = strawberry.field(
        resolver=_export_job, description="An export job, with a fresh download URL."
    )


@strawberry.type
class ExportsMutation:
    create_export: ExportJob = strawberry.mutation(
        resolver=_create_export,
        description="Saves an export of `object` (filter: the JSON filter language of the REST "
        "API; fields, orderBy and relationField as in GET /rest/{object}/export) and answers "
        "the job, READY at once: its download streams every matching record.",
    )


EXPORTS_PART = SchemaPart(name="exports", query=ExportsQuery, mutation=ExportsMutation)
