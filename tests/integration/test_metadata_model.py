"""Objects and fields through MetadataService over real gRPC, and their effect on records."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import nats
import orjson
import pytest

from crm.common.v1 import common_pb2
from crm.events.v1 import events_pb2
from crm.metadata.v1 import metadata_pb2 as md
from crm.records.v1 import records_pb2 as rp
from crmstack.stack import Stack
from tests.integration.records_client import (
    Op,
    Workspace,
    cond,
    error_of,
    provision,
    user_principal,
)


@pytest.fixture
def ws(stack: Stack | None) -> Workspace:
    if stack is None:
        pytest.skip("calls services over gRPC: needs the local launcher")
    return provision(stack)


def version(ws: Workspace) -> int:
    schema = ws.metadata.GetWorkspaceSchema(md.GetWorkspaceSchemaRequest(), metadata=ws.call)
    return int(schema.version)


def create_field(
    ws: Workspace, obj: str, name: str, field_type: Any, **kw: Any
) -> md.FieldMetadata:
    result: md.FieldMetadata = ws.metadata.CreateField(
        md.CreateFieldRequest(
            object_metadata_id=ws.object_id(obj), name=name, type=field_type, **kw
        ),
        metadata=ws.call,
    )
    return result


def refused(call: Any, request: Any, ws: Workspace) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, metadata=ws.call)
    error: grpc.RpcError = caught.value
    return error


def test_objects_and_fields_are_listed_with_pages(ws: Workspace) -> None:
    first = ws.metadata.ListObjects(
        md.ListObjectsRequest(page=common_pb2.PageRequest(first=2)), metadata=ws.call
    )
    assert [o.name_singular for o in first.objects] == ["person", "company"]
    assert first.total_count == 5
    assert first.page_info.has_next_page
    rest = ws.metadata.ListObjects(
        md.ListObjectsRequest(page=common_pb2.PageRequest(after=first.page_info.end_cursor)),
        metadata=ws.call,
    )
    assert [o.name_singular for o in rest.objects] == ["opportunity", "activity", "task"]
    fields = ws.metadata.ListFields(
        md.ListFieldsRequest(object_metadata_id=ws.object_id("company")), metadata=ws.call
    )
    names = [f.name for f in fields.fields]
    assert {"id", "name", "employees", "people", "createdAt", "deletedAt", "ownerId"} <= set(names)
    assert all(f.object_metadata_id == ws.object_id("company") for f in fields.fields)


def test_custom_object_and_fields_of_every_type_are_usable_at_once(ws: Workspace) -> None:
    project = ws.metadata.CreateObject(
        md.CreateObjectRequest(name_singular="project", name_plural="projects",
                               label_singular="Project", label_plural="Projects"),
        metadata=ws.call,
    )  # fmt: skip
    assert project.is_custom
    ws.schema.objects.append(project)
    fields: dict[str, Any] = {
        "budget": (md.FIELD_TYPE_CURRENCY, {"amountMicros": 5, "currencyCode": "USD"}),
        "score": (md.FIELD_TYPE_NUMBER, 4.5),
        "active": (md.FIELD_TYPE_BOOLEAN, True),
        "startsOn": (md.FIELD_TYPE_DATE, "2026-05-01"),
        "kickoffAt": (md.FIELD_TYPE_DATE_TIME, "2026-05-01T09:00:00.000Z"),
        "externalId": (md.FIELD_TYPE_UUID, "8f14e45f-ceea-467a-9af1-7d1f7b1b0f00"),
        "contactEmail": (md.FIELD_TYPE_EMAIL, "pm@example.test"),
        "hotline": (md.FIELD_TYPE_PHONE, "+33 1 23 45 67 89"),
        "site": (md.FIELD_TYPE_LINK, "https://example.test"),
        "extra": (md.FIELD_TYPE_RAW_JSON, {"nested": [1, "two"]}),
        "phase": (md.FIELD_TYPE_SELECT, "PLAN"),
        "tags": (md.FIELD_TYPE_MULTI_SELECT, ["RED", "BLUE"]),
        "summary": (md.FIELD_TYPE_TEXT, "text"),
    }
    for name, (field_type, _) in fields.items():
        options = []
        if field_type == md.FIELD_TYPE_SELECT:
            options = [md.SelectOption(value="PLAN"), md.SelectOption(value="BUILD")]
        if field_type == md.FIELD_TYPE_MULTI_SELECT:
            options = [md.SelectOption(value="RED"), md.SelectOption(value="BLUE")]
        create_field(ws, "project", name, field_type, options=options)
    lead = create_field(
        ws, "project", "lead", md.FIELD_TYPE_RELATION,
        relation=md.RelationSettings(target_object_metadata_id=ws.object_id("person")),
    )  # fmt: skip
    assert lead.relation.inverse_field_name == "projects"
    person = ws.create("person", {"firstName": "Lead"})
    record = ws.create(
        "project",
        {"name": "P", "lead": {"connect": person["id"]}, **{k: v for k, (_, v) in fields.items()}},
    )
    for name, (_, value) in fields.items():
        assert record[name] == value, name
    assert record["leadId"] == person["id"]
    rows, _ = ws.list(
        "projects", filter=cond("tags", Op.FILTER_OPERATOR_CONTAINS, "RED"),
        order_by=[common_pb2.OrderBy(field="budget")],
    )  # fmt: skip
    assert [row["id"] for row in rows] == [record["id"]]
    nested = ws.get("person", person["id"], depth=2)
    assert [p["id"] for p in nested["projects"]] == [record["id"]]


def test_records_refresh_when_the_caller_saw_a_newer_version(ws: Workspace) -> None:
    ws.create("person", {"firstName": "warm the cache"})
    created = create_field(ws, "person", "nickname", md.FIELD_TYPE_TEXT)
    current = version(ws)
    response = ws.records.CreateRecord(
        rp.CreateRecordRequest(
            ref=rp.ObjectRef(object="person", metadata_version=current),
            data_json=b'{"nickname": "Nick"}',
        ),
        metadata=ws.call,
    )
    assert orjson.loads(response.record_json)["nickname"] == "Nick"
    assert created.is_custom


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"name": "Bad Name", "type": md.FIELD_TYPE_TEXT}, "name"),
        ({"name": "and", "type": md.FIELD_TYPE_TEXT}, "name"),
        ({"name": "firstName", "type": md.FIELD_TYPE_TEXT}, "name"),
        ({"name": "companyId", "type": md.FIELD_TYPE_TEXT}, "name"),
        ({"name": "ok"}, "type"),
        ({"name": "ok", "type": md.FIELD_TYPE_SELECT}, "options"),
        ({"name": "ok", "type": md.FIELD_TYPE_SELECT,
          "options": [md.SelectOption(value="lower")]}, "options[0].value"),
        ({"name": "ok", "type": md.FIELD_TYPE_NUMBER, "default_value_json": b'"x"'},
         "defaultValue"),
        ({"name": "ok", "type": md.FIELD_TYPE_RELATION}, "relation.targetObjectMetadataId"),
    ],
)  # fmt: skip
def test_bad_field_definitions_name_the_field_and_change_nothing(
    ws: Workspace, request_fields: dict[str, Any], field: str
) -> None:
    before = version(ws)
    request = md.CreateFieldRequest(object_metadata_id=ws.object_id("person"), **request_fields)
    error = refused(ws.metadata.CreateField, request, ws)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_of(error).field == field
    assert version(ws) == before


@pytest.mark.parametrize(
    ("singular", "plural", "field"),
    [
        ("Project", "projects", "nameSingular"),
        ("project", "project", "namePlural"),
        ("person", "persons", "nameSingular"),
        ("human", "people", "namePlural"),
        ("batch", "batches", "nameSingular"),
        ("", "things", "nameSingular"),
    ],
)
def test_bad_object_definitions_are_refused(
    ws: Workspace, singular: str, plural: str, field: str
) -> None:
    request = md.CreateObjectRequest(name_singular=singular, name_plural=plural)
    error = refused(ws.metadata.CreateObject, request, ws)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_of(error).field == field


def test_data_model_changes_need_the_flag(ws: Workspace) -> None:
    member = ws.as_principal(user_principal(ws.id))
    member.metadata.ListObjects(md.ListObjectsRequest(), metadata=member.call)
    request = md.CreateObjectRequest(name_singular="thing", name_plural="things")
    error = refused(member.metadata.CreateObject, request, member)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    admin = ws.as_principal(user_principal(ws.id, flags=(common_pb2.FLAG_DATA_MODEL,)))
    admin.metadata.CreateObject(request, metadata=admin.call)


def test_rename_deactivate_and_reactivate_a_field(ws: Workspace) -> None:
    field = create_field(ws, "person", "nickname", md.FIELD_TYPE_TEXT)
    person = ws.create("person", {"firstName": "A", "nickname": "Nick"})
    ws.metadata.UpdateField(md.UpdateFieldRequest(id=field.id, name="alias", label="Alias"),
                            metadata=ws.call)  # fmt: skip
    assert ws.get("person", person["id"])["alias"] == "Nick"
    deleted = ws.metadata.DeleteField(md.DeleteFieldRequest(id=field.id), metadata=ws.call)
    assert not deleted.is_active
    assert "alias" not in ws.get("person", person["id"])
    with pytest.raises(grpc.RpcError) as caught:
        ws.create("person", {"alias": "x"})
    assert error_of(caught.value).field == "alias"
    ws.metadata.UpdateField(md.UpdateFieldRequest(id=field.id, is_active=True), metadata=ws.call)
    assert ws.get("person", person["id"])["alias"] == "Nick"  # the data was kept
    system = next(f for o in ws.schema.objects for f in o.fields if f.name == "createdAt")
    error = refused(ws.metadata.DeleteField, md.DeleteFieldRequest(id=system.id), ws)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_unique_field_over_duplicates_is_refused_and_changes_nothing(ws: Workspace) -> None:
    ws.create_many("person", [{"email": "same@x.test"}, {"email": "same@x.test"}])
    field = next(
        f for o in ws.schema.objects if o.name_singular == "person" for f in o.fields
        if f.name == "email"
    )  # fmt: skip
    before = version(ws)
    create = md.CreateFieldRequest(
        object_metadata_id=ws.object_id("person"), name="badge", type=md.FIELD_TYPE_TEXT,
        is_unique=True,
    )  # fmt: skip
    ws.metadata.CreateField(create, metadata=ws.call)
    ws.create("person", {"badge": "B1"})
    with pytest.raises(grpc.RpcError) as caught:
        ws.create("person", {"badge": "B1"})
    assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert error_of(caught.value).field == "badge"
    assert version(ws) > before
    assert field.name == "email"


def test_changes_are_announced_on_nats(ws: Workspace, stack: Stack) -> None:
    async def watch() -> events_pb2.MetadataChanged:
        client = await nats.connect(stack.env["NATS_URL"])
        try:
            subscription = await client.subscribe(f"crm.metadata.{ws.id}.changed")
            await asyncio.to_thread(create_field, ws, "company", "tier", md.FIELD_TYPE_TEXT)
            message = await subscription.next_msg(timeout=20)
            return events_pb2.MetadataChanged.FromString(message.data)
        finally:
            await client.close()

    announced = asyncio.run(watch())
    assert announced.workspace_id == ws.id
    assert announced.version == version(ws)


def test_rename_and_deactivate_a_custom_object(ws: Workspace) -> None:
    created = ws.metadata.CreateObject(
        md.CreateObjectRequest(name_singular="ticket", name_plural="tickets"), metadata=ws.call
    )
    record = ws.create("ticket", {"name": "T-1"})
    renamed = ws.metadata.UpdateObject(
        md.UpdateObjectRequest(id=created.id, name_singular="issue", name_plural="issues",
                               label_singular="Issue"),
        metadata=ws.call,
    )  # fmt: skip
    assert (renamed.name_singular, renamed.label_singular) == ("issue", "Issue")
    assert ws.get("issues", record["id"])["name"] == "T-1"  # the table was renamed, data kept
    with pytest.raises(grpc.RpcError) as caught:
        ws.get("ticket", record["id"])
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    ws.metadata.UpdateObject(
        md.UpdateObjectRequest(id=created.id, is_active=False), metadata=ws.call
    )
    with pytest.raises(grpc.RpcError) as caught:
        ws.get("issue", record["id"])
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    error = refused(
        ws.metadata.UpdateObject,
        md.UpdateObjectRequest(id=ws.object_id("person"), name_singular="human"),
        ws,
    )
    assert error_of(error).field == "nameSingular"
