"""gRPC servicer of the metadata service.

Reads need a principal of the workspace; changes need the DATA_MODEL flag (Admins have it) and
go through the change protocol (`metadata.changes`).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from typing import Any

from crm.common.v1 import common_pb2
from crm.metadata.v1 import metadata_pb2 as md
from crm.metadata.v1 import metadata_pb2_grpc
from crmkit import authz
from crmkit.errors import InvalidArgument, NotFound, PermissionDenied
from crmkit.principal import PrincipalCodec
from metadata import definitions, store
from metadata.changes import ChangeRunner
from metadata.definitions import Definitions
from metadata.reconciler import Reconciler
from metadata.standard import standard_objects

Context = Any  # grpc.aio.ServicerContext (grpc is untyped)
DEFAULT_PAGE = 100
MAX_PAGE = 1000


def _page_size(page: common_pb2.PageRequest) -> int:
    if page.first == 0:
        return DEFAULT_PAGE
    if not 1 <= page.first <= MAX_PAGE:
        raise InvalidArgument(f"first must be between 1 and {MAX_PAGE}", field="first")
    return page.first


def _cursor(position: int) -> str:
    return base64.urlsafe_b64encode(f"p:{position}".encode()).decode().rstrip("=")


def _position(cursor: str) -> int:
    if not cursor:
        return 0
    try:
        text = base64.urlsafe_b64decode((cursor + "=" * (-len(cursor) % 4)).encode()).decode()
        kind, _, value = text.partition(":")
        if kind != "p":
            raise ValueError(kind)
        return int(value)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidArgument("after: invalid cursor", field="after") from None


class MetadataServicer(metadata_pb2_grpc.MetadataServiceServicer):
    def __init__(
        self,
        pool: Any,
        principals: PrincipalCodec,
        changes: ChangeRunner,
        reconciler: Reconciler,
    ) -> None:
        self._pool = pool
        self._principals = principals
        self._changes = changes
        self._reconciler = reconciler

    def _reader(self, context: Context) -> common_pb2.Principal:
        return self._principals.require(context)

    def _editor(self, context: Context) -> common_pb2.Principal:
        principal = self._principals.require(context)
        authz.require_flag(principal, common_pb2.FLAG_DATA_MODEL)
        return principal

    @staticmethod
    def _same_workspace(principal: common_pb2.Principal, workspace_id: str) -> str:
        if workspace_id and workspace_id != principal.workspace_id:
            raise PermissionDenied("the principal belongs to another workspace")
        return principal.workspace_id

    # -- workspace -------------------------------------------------------------------------------
    async def ProvisionWorkspace(  # noqa: N802
        self, request: md.ProvisionWorkspaceRequest, context: Context
    ) -> md.WorkspaceSchema:
        principal = self._editor(context)
        workspace_id = self._same_workspace(principal, request.workspace_id)

        async def provision(connection: Any, defs: Definitions) -> None:
            if defs.objects:
                raise _AlreadyProvisioned
            objects = standard_objects(workspace_id)
            for item in objects:
                await store.insert_object(connection, workspace_id, item)
            # Fields after every object: relations reference objects by id.
            await store.insert_fields(
                connection, workspace_id, [field for item in objects for field in item.fields]
            )

        with contextlib.suppress(_AlreadyProvisioned):
            await self._changes.run(workspace_id, provision, provision=True)
        async with self._pool.acquire() as connection:
            return await store.schema(connection, workspace_id)

    async def GetWorkspaceSchema(  # noqa: N802
        self, request: md.GetWorkspaceSchemaRequest, context: Context
    ) -> md.WorkspaceSchema:
        workspace_id = self._same_workspace(self._reader(context), request.workspace_id)
        async with self._pool.acquire() as connection:
            version = await store.workspace_version(connection, workspace_id)
            if version is None:
                raise NotFound("this workspace has no data model yet")
            if request.known_version and version <= request.known_version:
                return md.WorkspaceSchema(workspace_id=workspace_id, version=version)
            return await store.schema(connection, workspace_id)

    # -- objects ---------------------------------------------------------------------------------
    async def ListObjects(  # noqa: N802
        self, request: md.ListObjectsRequest, context: Context
    ) -> md.ListObjectsResponse:
        principal = self._reader(context)
        size = _page_size(request.page)
        after = _position(request.page.after)
        async with self._pool.acquire() as connection:
            objects = await store.load_objects(connection, principal.workspace_id)
            positions = await _positions(connection, "objects", principal.workspace_id)
        visible = [o for o in objects if request.include_inactive or o.is_active]
        remaining = [o for o in visible if positions[o.id] > after]
        page = remaining[:size]
        return md.ListObjectsResponse(
            objects=page,
            page_info=_page_info(page, positions, len(remaining) > size, after > 0),
            total_count=len(visible),
        )

    async def GetObject(  # noqa: N802
        self, request: md.GetObjectRequest, context: Context
    ) -> md.ObjectMetadata:
        principal = self._reader(context)
        async with self._pool.acquire() as connection:
            objects = await store.load_objects(connection, principal.workspace_id)
        for item in objects:
            if item.id == request.id:
                return item
        raise NotFound(f"object {request.id!r} not found", field="id")

    async def CreateObject(  # noqa: N802
        self, request: md.CreateObjectRequest, context: Context
    ) -> md.ObjectMetadata:
        principal = self._editor(context)

        async def create(connection: Any, defs: Definitions) -> md.ObjectMetadata:
            item = definitions.new_object(defs, request)
            await store.insert_object(connection, principal.workspace_id, item)
            await store.insert_fields(connection, principal.workspace_id, list(item.fields))
            return item

        created = await self._changes.run(principal.workspace_id, create)
        return await self._object(principal.workspace_id, created.id)

    async def UpdateObject(  # noqa: N802
        self, request: md.UpdateObjectRequest, context: Context
    ) -> md.ObjectMetadata:
        principal = self._editor(context)

        async def update(connection: Any, defs: Definitions) -> None:
            changed = definitions.apply_object_update(defs, request)
            await store.update_object(connection, changed)
            label = definitions.indexed_label(changed)
            if label is not None:
                await store.update_field(connection, label)

        await self._changes.run(principal.workspace_id, update)
        return await self._object(principal.workspace_id, request.id)

    async def _object(self, workspace_id: str, object_id: str) -> md.ObjectMetadata:
        async with self._pool.acquire() as connection:
            objects = await store.load_objects(connection, workspace_id)
        return next(item for item in objects if item.id == object_id)

    # -- fields ----------------------------------------------------------------------------------
    async def ListFields(  # noqa: N802
        self, request: md.ListFieldsRequest, context: Context
    ) -> md.ListFieldsResponse:
        principal = self._reader(context)
        size = _page_size(request.page)
        after = _position(request.page.after)
        async with self._pool.acquire() as connection:
            objects = await store.load_objects(connection, principal.workspace_id)
            positions = await _positions(connection, "fields", principal.workspace_id)
        if request.object_metadata_id and not any(
            o.id == request.object_metadata_id for o in objects
        ):
            raise NotFound(
                f"object {request.object_metadata_id!r} not found", field="objectMetadataId"
            )
        fields = [
            f
            for o in objects
            if not request.object_metadata_id or o.id == request.object_metadata_id
            for f in o.fields
            if request.include_inactive or f.is_active
        ]
        fields.sort(key=lambda f: positions[f.id])
        remaining = [f for f in fields if positions[f.id] > after]
        page = remaining[:size]
        return md.ListFieldsResponse(
            fields=page,
            page_info=_page_info(page, positions, len(remaining) > size, after > 0),
            total_count=len(fields),
        )

    async def CreateField(  # noqa: N802
        self, request: md.CreateFieldRequest, context: Context
    ) -> md.FieldMetadata:
        principal = self._editor(context)

        async def create(connection: Any, defs: Definitions) -> md.FieldMetadata:
            created, rows = definitions.new_fields(defs, request)
            await store.insert_fields(connection, principal.workspace_id, rows)
            return created

        created = await self._changes.run(principal.workspace_id, create)
        return await self._field(principal.workspace_id, created.id)

    async def UpdateField(  # noqa: N802
        self, request: md.UpdateFieldRequest, context: Context
    ) -> md.FieldMetadata:
        principal = self._editor(context)

        async def update(connection: Any, defs: Definitions) -> None:
            for changed in definitions.apply_field_update(defs, request):
                await store.update_field(connection, changed)

        await self._changes.run(principal.workspace_id, update)
        return await self._field(principal.workspace_id, request.id)

    async def DeleteField(  # noqa: N802
        self, request: md.DeleteFieldRequest, context: Context
    ) -> md.FieldMetadata:
        return await self.UpdateField(
            md.UpdateFieldRequest(id=request.id, is_active=False), context
        )

    async def _field(self, workspace_id: str, field_id: str) -> md.FieldMetadata:
        async with self._pool.acquire() as connection:
            objects = await store.load_objects(connection, workspace_id)
        return next(f for o in objects for f in o.fields if f.id == field_id)

    # -- repair ----------------------------------------------------------------------------------
    async def Reconcile(  # noqa: N802
        self, request: md.ReconcileRequest, context: Context
    ) -> md.ReconcileResponse:
        principal = self._editor(context)
        if not request.workspace_id and principal.kind != common_pb2.PRINCIPAL_KIND_SYSTEM:
            raise PermissionDenied("reconciling every workspace needs a system principal")
        if request.workspace_id:
            self._same_workspace(principal, request.workspace_id)
        checked, repaired = await self._reconciler.reconcile_all(request.workspace_id)
        return md.ReconcileResponse(workspaces_checked=checked, workspaces_repaired=repaired)


class _AlreadyProvisioned(Exception):
    pass


async def _positions(connection: Any, table: str, workspace_id: str) -> dict[str, int]:
    rows = await connection.fetch(
        f"SELECT id::text, position FROM metadata.{table} WHERE workspace_id = $1", workspace_id
    )
    return {row[0]: int(row[1]) for row in rows}


def _page_info(
    page: list[Any], positions: dict[str, int], has_next: bool, has_previous: bool
) -> common_pb2.PageInfo:
    return common_pb2.PageInfo(
        has_next_page=has_next,
        has_previous_page=has_previous,
        start_cursor=_cursor(positions[page[0].id]) if page else "",
        end_cursor=_cursor(positions[page[-1].id]) if page else "",
    )
