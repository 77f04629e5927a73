"""Writes over real gRPC: batch, update, soft delete, restore, merge, duplicates, aggregates,
group by, and the outbox rows each change writes in the same transaction."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import grpc
import orjson
import pytest

from crm.records.v1 import records_pb2 as rp
from crmstack.stack import Stack
from tests.integration.events_client import listen
from tests.integration.records_client import Op, Workspace, cond, error_of, provision


@pytest.fixture
def ws(stack: Stack | None) -> Workspace:
    if stack is None:
        pytest.skip("calls services over gRPC: needs the local launcher")
    workspace = provision(stack)
    listen(stack, workspace.id)  # so that its events are written (docs/events.md, "Who listens")
    return workspace


def outbox(stack: Stack, workspace_id: str) -> list[dict[str, Any]]:
    async def fetch() -> list[dict[str, Any]]:
        connection = await asyncpg.connect(stack.env["DATABASE_URL"])
        try:
            rows = await connection.fetch(
                "SELECT object, record_id::text, action, cause, record::text, "
                "previous_record::text, changed_fields, actor_kind, published_at "
                "FROM records.outbox WHERE workspace_id = $1 ORDER BY sequence",
                workspace_id,
            )
        finally:
            await connection.close()
        return [
            {**dict(row), "record": orjson.loads(row["record"]),
             "previous_record": orjson.loads(row["previous_record"] or "null")}
            for row in rows
        ]  # fmt: skip

    return asyncio.run(fetch())


def expect_error(code: grpc.StatusCode, field: str | None, call: Any, *args: Any) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        call(*args)
    assert caught.value.code() == code, caught.value.details()
    assert error_of(caught.value).field == field


def test_batch_is_all_or_nothing_and_names_the_index(ws: Workspace) -> None:
    rows = [{"firstName": "ok"}] * 3 + [{"firstName": "bad", "email": "not-an-email"}]
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, "[3].email", ws.create_many, "person", rows)
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT, "[1].name", ws.create_many, "company", [{"name": "a"}, {}]
    )
    missing = "00000000-0000-4000-8000-000000000000"
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        "[2].company",
        ws.create_many,
        "person",
        [{"firstName": "a"}, {"firstName": "b"}, {"company": {"connect": missing}}],
    )
    assert ws.list("person")[0] == []
    created = ws.create_many("person", [{"firstName": f"p{i}"} for i in range(1000)])
    assert [row["firstName"] for row in created[:3]] == ["p0", "p1", "p2"]
    _, response = ws.list("person", first=1, with_total_count=True)
    assert response.total_count == 1000
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, "data", ws.create_many, "person", [{}] * 1001)


def test_write_validation_names_the_field(ws: Workspace) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"name": "x", "employees": "many"}, "employees"),
        ({"name": "x", "nope": 1}, "nope"),
        ({"name": "x", "createdAt": "2026-01-01T00:00:00Z"}, "createdAt"),
        ({"name": "x", "annualRecurringRevenue": {"amountMicros": 1, "currencyCode": "eur"}},
         "annualRecurringRevenue.currencyCode"),
        ({"name": "x", "people": []}, "people"),
        ({"name": "a\u0000b"}, "name"),
        ({"name": None}, "name"),
    ]  # fmt: skip
    for data, field in cases:
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, field, ws.create, "company", data)
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT, "stage", ws.create, "opportunity",
        {"name": "x", "stage": "MAYBE"},
    )  # fmt: skip


def test_types_round_trip(ws: Workspace) -> None:
    company = ws.create(
        "company",
        {
            "name": "Typed",
            "employees": 12.5,
            "idealCustomerProfile": True,
            "annualRecurringRevenue": {"amountMicros": 2_500_000, "currencyCode": "EUR"},
        },
    )
    assert company["employees"] == 12.5
    assert company["idealCustomerProfile"] is True
    assert company["annualRecurringRevenue"] == {"amountMicros": 2500000, "currencyCode": "EUR"}
    deal = ws.create(
        "opportunity",
        {"name": "D", "closeDate": "2026-02-03", "company": {"connect": company["id"]}},
    )
    assert deal["stage"] == "PROSPECTING"  # the field's default
    assert deal["closeDate"] == "2026-02-03"
    task = ws.create("task", {"title": "T", "dueAt": "2026-02-03T10:11:12.345678+02:00"})
    assert task["dueAt"] == "2026-02-03T08:11:12.345Z"
    assert task["status"] == "TODO"


def test_update_one_reports_changed_fields(ws: Workspace, stack: Stack) -> None:
    person = ws.create("person", {"firstName": "Ada", "city": "London"})
    response = ws.records.UpdateRecord(
        rp.UpdateRecordRequest(
            ref=rp.ObjectRef(object="person"),
            id=person["id"],
            data_json=orjson.dumps({"firstName": "Ada", "city": "Paris"}),
        ),
        metadata=ws.call,
    )
    assert list(response.changed_fields) == ["city"]
    updated = orjson.loads(response.record_json)
    assert updated["city"] == "Paris"
    assert updated["updatedAt"] >= person["updatedAt"]
    events = outbox(stack, ws.id)
    assert [(e["action"], e["cause"]) for e in events] == [
        ("created", "write"),
        ("updated", "write"),
    ]
    assert events[1]["previous_record"]["city"] == "London"
    assert events[1]["record"]["city"] == "Paris"
    assert events[1]["changed_fields"] == ["city"]
    assert events[1]["actor_kind"] == "system"


def test_update_many_by_filter_and_empty_filter_refused(ws: Workspace) -> None:
    ws.create_many("person", [{"firstName": n, "city": "A"} for n in ("x", "y", "z")])
    response = ws.records.UpdateRecords(
        rp.UpdateRecordsRequest(
            ref=rp.ObjectRef(object="person"),
            filter=cond("firstName", Op.FILTER_OPERATOR_IN, ["x", "y"]),
            data_json=b'{"city": "B"}',
        ),
        metadata=ws.call,
    )
    assert {row["firstName"] for row in orjson.loads(response.records_json)} == {"x", "y"}
    rows, _ = ws.list("person", filter=cond("city", Op.FILTER_OPERATOR_EQ, "B"))
    assert len(rows) == 2
    with pytest.raises(grpc.RpcError) as caught:
        ws.records.UpdateRecords(
            rp.UpdateRecordsRequest(ref=rp.ObjectRef(object="person"), data_json=b'{"city": "C"}'),
            metadata=ws.call,
        )
    assert error_of(caught.value).field == "filter"


def test_soft_delete_hides_and_restore_brings_back(ws: Workspace, stack: Stack) -> None:
    person = ws.create("person", {"firstName": "Gone"})
    ref = rp.ObjectRef(object="person")
    deleted = ws.records.DeleteRecord(
        rp.DeleteRecordRequest(ref=ref, id=person["id"]), metadata=ws.call
    )
    assert orjson.loads(deleted.record_json)["deletedAt"] is not None
    assert ws.list("person")[0] == []
    expect_error(grpc.StatusCode.NOT_FOUND, "id", ws.get, "person", person["id"])
    assert ws.get("person", person["id"], deleted=rp.DELETED_SCOPE_INCLUDE)["id"] == person["id"]
    only_deleted, _ = ws.list("person", deleted=rp.DELETED_SCOPE_ONLY)
    assert [row["id"] for row in only_deleted] == [person["id"]]
    by_filter, _ = ws.list("person", filter=cond("deletedAt", Op.FILTER_OPERATOR_IS_NOT, None))
    assert [row["id"] for row in by_filter] == [person["id"]]
    with pytest.raises(grpc.RpcError) as caught:
        ws.records.DeleteRecord(rp.DeleteRecordRequest(ref=ref, id=person["id"]), metadata=ws.call)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    restored = ws.records.RestoreRecord(
        rp.RestoreRecordRequest(ref=ref, id=person["id"]), metadata=ws.call
    )
    assert orjson.loads(restored.record_json)["deletedAt"] is None
    assert [row["id"] for row in ws.list("person")[0]] == [person["id"]]
    events = outbox(stack, ws.id)
    assert [(e["action"], e["cause"]) for e in events] == [
        ("created", "write"), ("deleted", "write"), ("updated", "restore")
    ]  # fmt: skip


def test_merge_fills_nulls_repoints_relations_and_deletes_source(
    ws: Workspace, stack: Stack
) -> None:
    source = ws.create("company", {"name": "Source", "website": "https://s.test", "employees": 3})
    target = ws.create("company", {"name": "Target", "employees": 10})
    people = ws.create_many(
        "person", [{"firstName": f"p{i}", "companyId": source["id"]} for i in range(3)]
    )
    ws.create("opportunity", {"name": "Deal", "company": {"connect": source["id"]}})
    response = ws.records.MergeRecords(
        rp.MergeRecordsRequest(
            ref=rp.ObjectRef(object="company"), source_id=source["id"], target_id=target["id"]
        ),
        metadata=ws.call,
    )
    merged = orjson.loads(response.record_json)
    assert merged["name"] == "Target"  # target wins
    assert merged["employees"] == 10
    assert merged["website"] == "https://s.test"  # source fills the target's null
    assert response.relations_repointed == 4
    assert orjson.loads(response.source_record_json)["deletedAt"] is not None
    for person in people:
        assert ws.get("person", person["id"])["companyId"] == target["id"]
    nested = ws.get("company", target["id"], depth=2)
    assert len(nested["people"]) == 3
    assert len(nested["opportunities"]) == 1
    merge_events = [
        (e["object"], e["action"]) for e in outbox(stack, ws.id) if e["cause"] == "merge"
    ]
    assert ("company", "deleted") in merge_events
    assert ("company", "updated") in merge_events
    assert merge_events.count(("person", "updated")) == 3
    with pytest.raises(grpc.RpcError) as caught:
        ws.records.MergeRecords(
            rp.MergeRecordsRequest(
                ref=rp.ObjectRef(object="company"), source_id=source["id"], target_id=target["id"]
            ),
            metadata=ws.call,
        )
    assert error_of(caught.value).field == "sourceId"


def test_duplicates_match_case_insensitively(ws: Workspace) -> None:
    first = ws.create("person", {"firstName": "Ada", "email": "Ada@Example.test"})
    ws.create("person", {"firstName": "Other", "email": "other@example.test"})
    response = ws.records.FindDuplicates(
        rp.FindDuplicatesRequest(
            ref=rp.ObjectRef(object="person"), data_json=b'{"email": "ada@example.TEST"}'
        ),
        metadata=ws.call,
    )
    assert [row["id"] for row in orjson.loads(response.records_json)] == [first["id"]]
    excluded = ws.records.FindDuplicates(
        rp.FindDuplicatesRequest(
            ref=rp.ObjectRef(object="person"),
            data_json=orjson.dumps({"email": "ada@example.test", "id": first["id"]}),
        ),
        metadata=ws.call,
    )
    assert orjson.loads(excluded.records_json) == []


def test_aggregate_and_group_by(ws: Workspace) -> None:
    ws.create_many(
        "opportunity",
        [
            {"name": "a", "amount": 10, "stage": "WON"},
            {"name": "b", "amount": 30, "stage": "WON"},
            {"name": "c", "amount": 5, "stage": "LOST"},
            {"name": "d", "stage": "LOST"},
            {"name": "e", "amount": 7, "stage": "QUALIFIED"},
        ],
    )
    ref = rp.ObjectRef(object="opportunity")
    result = orjson.loads(
        ws.records.AggregateRecords(
            rp.AggregateRecordsRequest(ref=ref), metadata=ws.call
        ).result_json
    )
    assert result["count"] == 5
    assert result["sum"]["amount"] == 52
    assert result["avg"]["amount"] == 13
    assert result["min"]["amount"] == 5
    assert result["max"]["amount"] == 30
    filtered = orjson.loads(
        ws.records.AggregateRecords(
            rp.AggregateRecordsRequest(
                ref=ref,
                filter=cond("stage", Op.FILTER_OPERATOR_EQ, "WON"),
                aggregates=[rp.AggregateSpec(op=rp.AGGREGATE_OP_COUNT),
                            rp.AggregateSpec(op=rp.AGGREGATE_OP_SUM, field="amount")],
            ),
            metadata=ws.call,
        ).result_json
    )  # fmt: skip
    assert filtered == {"count": 2, "sum": {"amount": 40}}
    groups = orjson.loads(
        ws.records.GroupRecords(
            rp.GroupRecordsRequest(
                ref=ref, field="stage", filter=cond("amount", Op.FILTER_OPERATOR_GT, 6)
            ),
            metadata=ws.call,
        ).groups_json
    )
    assert groups == [
        {"stage": "WON", "count": 2, "sum": {"amount": 40, "probability": None}},
        {"stage": "QUALIFIED", "count": 1, "sum": {"amount": 7, "probability": None}},
    ]
    with pytest.raises(grpc.RpcError) as caught:
        ws.records.AggregateRecords(
            rp.AggregateRecordsRequest(
                ref=ref, aggregates=[rp.AggregateSpec(op=rp.AGGREGATE_OP_SUM, field="name")]
            ),
            metadata=ws.call,
        )
    assert error_of(caught.value).field == "name"


def test_unique_id_conflict_is_already_exists(ws: Workspace) -> None:
    person = ws.create("person", {"firstName": "A"})
    expect_error(grpc.StatusCode.ALREADY_EXISTS, "id", ws.create, "person", {"id": person["id"]})
