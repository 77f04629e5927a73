"""Authorization and isolation: own-records-only roles, missing permissions, other workspaces."""

from __future__ import annotations

import grpc
import orjson
import pytest

from crm.common.v1 import common_pb2
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


@pytest.fixture(scope="module")
def ws(stack: Stack | None) -> Workspace:
    if stack is None:
        pytest.skip("calls services over gRPC: needs the local launcher")
    return provision(stack)


def test_member_sees_and_changes_only_own_records(ws: Workspace) -> None:
    alice = ws.as_principal(
        user_principal(ws.id, role=common_pb2.ROLE_MEMBER, own_records_only=True)
    )
    bob = ws.as_principal(user_principal(ws.id, role=common_pb2.ROLE_MEMBER, own_records_only=True))
    mine = alice.create("person", {"firstName": "Mine"})
    assert mine["ownerId"] == alice.principal.user_id
    theirs = bob.create("person", {"firstName": "Theirs"})
    assert [row["id"] for row in alice.list("people")[0]] == [mine["id"]]
    for call in (
        lambda: alice.get("person", theirs["id"]),
        lambda: alice.records.UpdateRecord(
            rp.UpdateRecordRequest(ref=rp.ObjectRef(object="person"), id=theirs["id"],
                                   data_json=b'{"firstName": "hacked"}'),
            metadata=alice.call,
        ),
        lambda: alice.records.DeleteRecord(
            rp.DeleteRecordRequest(ref=rp.ObjectRef(object="person"), id=theirs["id"]),
            metadata=alice.call,
        ),
    ):  # fmt: skip
        with pytest.raises(grpc.RpcError) as caught:
            call()
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    updated = alice.records.UpdateRecords(
        rp.UpdateRecordsRequest(
            ref=rp.ObjectRef(object="person"),
            filter=cond("firstName", Op.FILTER_OPERATOR_IN, ["Mine", "Theirs"]),
            data_json=b'{"city": "Paris"}',
        ),
        metadata=alice.call,
    )
    assert [row["id"] for row in orjson.loads(updated.records_json)] == [mine["id"]]
    assert ws.get("person", theirs["id"])["firstName"] == "Theirs"  # admin still sees it
    with pytest.raises(grpc.RpcError) as caught:
        alice.create("person", {"firstName": "x", "ownerId": bob.principal.user_id})
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_read_only_role_cannot_write(ws: Workspace) -> None:
    reader = ws.as_principal(user_principal(ws.id, actions=(common_pb2.ACTION_READ,)))
    reader.list("people")
    with pytest.raises(grpc.RpcError) as caught:
        reader.create("person", {"firstName": "x"})
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_nested_relations_need_read_on_the_related_object(ws: Workspace) -> None:
    company = ws.create("company", {"name": "Hidden"})
    person = ws.create("person", {"firstName": "P", "company": {"connect": company["id"]}})
    people_only = ws.as_principal(user_principal(ws.id, objects="person"))
    nested = people_only.get("person", person["id"], depth=1)
    assert "company" not in nested
    assert nested["companyId"] == company["id"]
    rows, _ = people_only.list(
        "person", filter=cond("company.name", Op.FILTER_OPERATOR_EQ, "Hidden")
    )
    assert rows == []


def test_workspaces_are_isolated(ws: Workspace, stack: Stack) -> None:
    other = provision(stack)
    record = ws.create("company", {"name": "Private"})
    with pytest.raises(grpc.RpcError) as caught:
        other.get("company", record["id"])
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert other.list("companies")[0] == []
    # A principal of the other workspace connecting to this workspace's record: not found.
    with pytest.raises(grpc.RpcError) as caught:
        other.create("person", {"firstName": "x", "company": {"connect": record["id"]}})
    assert error_of(caught.value).field == "company"
