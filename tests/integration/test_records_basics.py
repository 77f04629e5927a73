"""Milestone 1 through real gRPC: provision, schema, create, get, list."""

from __future__ import annotations

import grpc
import orjson
import pytest

from crm.metadata.v1 import metadata_pb2 as md
from crm.records.v1 import records_pb2 as rp
from crmstack.stack import Stack
from tests.integration.records_client import Workspace, error_of, provision


@pytest.fixture(scope="module")
def workspace(stack: Stack | None) -> Workspace:
    if stack is None:
        pytest.skip("calls services over gRPC: needs the local launcher")
    return provision(stack)


def test_provision_creates_the_standard_objects(workspace: Workspace) -> None:
    names = {o.name_singular: o for o in workspace.schema.objects}
    assert {"person", "company", "opportunity", "activity", "task"} <= set(names)
    stage = next(f for f in names["opportunity"].fields if f.name == "stage")
    assert stage.type == md.FIELD_TYPE_SELECT
    assert [o.value for o in stage.options][:2] == ["PROSPECTING", "QUALIFIED"]
    required = {
        (o.name_singular, f.name) for o in workspace.schema.objects for f in o.fields
        if not f.is_nullable and not f.is_system
    }  # fmt: skip
    assert {("company", "name"), ("opportunity", "name"), ("activity", "title")} <= required


def test_provision_is_idempotent(workspace: Workspace) -> None:
    again = workspace.metadata.ProvisionWorkspace(
        md.ProvisionWorkspaceRequest(workspace_id=workspace.id), metadata=workspace.call
    )
    assert again.version == workspace.schema.version
    schema = workspace.metadata.GetWorkspaceSchema(
        md.GetWorkspaceSchemaRequest(workspace_id=workspace.id), metadata=workspace.call
    )
    assert [o.id for o in schema.objects] == [o.id for o in workspace.schema.objects]


def test_create_get_and_list_a_record(workspace: Workspace) -> None:
    company = workspace.create("company", {"name": "Acme", "employees": 12})
    person = workspace.create(
        "person",
        {"firstName": "Ada", "email": "ada@acme.test", "company": {"connect": company["id"]}},
    )
    assert person["companyId"] == company["id"]
    assert person["createdAt"].endswith("Z")
    assert person["deletedAt"] is None
    nested = workspace.get("person", person["id"], depth=1)
    assert nested["company"]["name"] == "Acme"
    rows, response = workspace.list("people")
    assert [row["id"] for row in rows] == [person["id"]]
    assert response.page_info.has_next_page is False


def test_unknown_object_is_not_found(workspace: Workspace) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        workspace.create("spaceship", {"name": "x"})
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_of(caught.value).field == "object"


def test_related_records_for_many_parents_and_records_by_ids(workspace: Workspace) -> None:
    first = workspace.create("company", {"name": "First"})
    second = workspace.create("company", {"name": "Second"})
    workspace.create_many(
        "person",
        [{"firstName": f"a{i}", "companyId": first["id"]} for i in range(3)]
        + [{"firstName": "b0", "companyId": second["id"]}],
    )
    response = workspace.records.ListRelated(
        rp.ListRelatedRequest(
            ref=rp.ObjectRef(object="person"),
            foreign_key_field="company",
            parent_ids=[first["id"], second["id"]],
            first_per_parent=2,
        ),
        metadata=workspace.call,
    )
    groups = {g.parent_id: g for g in response.groups}
    assert [r["firstName"] for r in orjson.loads(groups[first["id"]].records_json)] == ["a0", "a1"]
    assert groups[first["id"]].has_next_page
    assert len(groups[first["id"]].cursors) == 2
    assert [r["firstName"] for r in orjson.loads(groups[second["id"]].records_json)] == ["b0"]
    assert not groups[second["id"]].has_next_page
    by_ids = workspace.records.GetRecordsByIds(
        rp.GetRecordsByIdsRequest(
            ref=rp.ObjectRef(object="company"), ids=[first["id"], second["id"]], fields=["name"]
        ),
        metadata=workspace.call,
    )
    assert sorted(orjson.loads(by_ids.records_json), key=lambda r: r["name"]) == [
        {"id": first["id"], "name": "First"},
        {"id": second["id"], "name": "Second"},
    ]
