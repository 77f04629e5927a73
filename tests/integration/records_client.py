"""Helpers for integration tests that call the metadata and records services over real gRPC."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import orjson

from crm.common.v1 import common_pb2
from crm.metadata.v1 import metadata_pb2 as md
from crm.metadata.v1 import metadata_pb2_grpc
from crm.records.v1 import records_pb2 as rp
from crm.records.v1 import records_pb2_grpc
from crmkit.errors import ServiceError, from_rpc_error
from crmkit.principal import PrincipalCodec, system_principal
from crmstack.stack import Stack

Op = common_pb2.FilterOperator


@dataclass
class Workspace:
    """A provisioned workspace and stubs that call as a given principal."""

    id: str
    schema: md.WorkspaceSchema
    metadata: metadata_pb2_grpc.MetadataServiceStub
    records: records_pb2_grpc.RecordsServiceStub
    codec: PrincipalCodec
    principal: common_pb2.Principal

    @property
    def call(self) -> list[tuple[str, str | bytes]]:
        return self.codec.metadata(self.principal)

    def as_principal(self, principal: common_pb2.Principal) -> Workspace:
        return Workspace(self.id, self.schema, self.metadata, self.records, self.codec, principal)

    def object_id(self, name: str) -> str:
        return next(o.id for o in self.schema.objects if o.name_singular == name)

    # -- records -------------------------------------------------------------------------------
    def create(self, obj: str, data: dict[str, Any], **kw: Any) -> dict[str, Any]:
        response = self.records.CreateRecord(
            rp.CreateRecordRequest(
                ref=rp.ObjectRef(object=obj), data_json=orjson.dumps(data), **kw
            ),
            metadata=self.call,
        )
        result: dict[str, Any] = orjson.loads(response.record_json)
        return result

    def create_many(self, obj: str, data: list[dict[str, Any]]) -> list[dict[str, Any]]:
        response = self.records.CreateRecords(
            rp.CreateRecordsRequest(ref=rp.ObjectRef(object=obj), data_json=orjson.dumps(data)),
            metadata=self.call,
        )
        result: list[dict[str, Any]] = orjson.loads(response.records_json)
        return result

    def get(self, obj: str, record_id: str, **kw: Any) -> dict[str, Any]:
        response = self.records.GetRecord(
            rp.GetRecordRequest(ref=rp.ObjectRef(object=obj), id=record_id, **kw),
            metadata=self.call,
        )
        result: dict[str, Any] = orjson.loads(response.record_json)
        return result

    def list(self, obj: str, **kw: Any) -> tuple[list[dict[str, Any]], rp.ListRecordsResponse]:
        response = self.records.ListRecords(
            rp.ListRecordsRequest(ref=rp.ObjectRef(object=obj), **kw), metadata=self.call
        )
        return orjson.loads(response.records_json), response

    def list_all(self, obj: str, page: int = 2, **kw: Any) -> Iterator[dict[str, Any]]:
        after = ""
        while True:
            rows, response = self.list(obj, first=page, after=after, **kw)
            yield from rows
            if not response.page_info.has_next_page:
                return
            after = response.page_info.end_cursor


def cond(field: str, op: common_pb2.FilterOperator, value: Any) -> common_pb2.Filter:
    return common_pb2.Filter(
        condition=common_pb2.Condition(field=field, operator=op, value_json=orjson.dumps(value))
    )


def all_of(*filters: common_pb2.Filter) -> common_pb2.Filter:
    return common_pb2.Filter(all=common_pb2.FilterGroup(filters=list(filters)))


def any_of(*filters: common_pb2.Filter) -> common_pb2.Filter:
    return common_pb2.Filter(any=common_pb2.FilterGroup(filters=list(filters)))


def error_of(exc: grpc.RpcError) -> ServiceError:
    return from_rpc_error(exc)


def provision(stack: Stack) -> Workspace:
    """A new workspace, provisioned through metadata, with stubs calling as its system principal."""
    codec = PrincipalCodec(stack.env["APP_SECRET"])
    workspace_id = str(uuid.uuid4())
    principal = system_principal(workspace_id)
    metadata = metadata_pb2_grpc.MetadataServiceStub(
        grpc.insecure_channel(stack.grpc_address("metadata"))
    )
    records = records_pb2_grpc.RecordsServiceStub(
        grpc.insecure_channel(stack.grpc_address("records"))
    )
    schema = metadata.ProvisionWorkspace(
        md.ProvisionWorkspaceRequest(workspace_id=workspace_id),
        metadata=codec.metadata(principal),
        timeout=60,
    )
    return Workspace(workspace_id, schema, metadata, records, codec, principal)


def user_principal(
    workspace_id: str,
    *,
    role: common_pb2.Role = common_pb2.ROLE_ADMIN,
    own_records_only: bool = False,
    actions: tuple[common_pb2.Action, ...] = (
        common_pb2.ACTION_READ,
        common_pb2.ACTION_WRITE,
        common_pb2.ACTION_DELETE,
    ),
    flags: tuple[common_pb2.Flag, ...] = (),
    objects: str = "*",
) -> common_pb2.Principal:
    return common_pb2.Principal(
        workspace_id=workspace_id,
        kind=common_pb2.PRINCIPAL_KIND_USER,
        user_id=str(uuid.uuid4()),
        role=role,
        permissions=[
            common_pb2.ObjectPermission(
                object=objects, actions=list(actions), own_records_only=own_records_only
            )
        ],
        flags=list(flags),
    )
