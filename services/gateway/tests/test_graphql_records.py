"""Generated record operations: what they ask the records service, and what they answer."""

from __future__ import annotations

from typing import Any

import orjson

from crm.common.v1 import common_pb2
from crm.records.v1 import records_pb2
from crmkit.errors import InvalidArgument, NotFound
from crmkit.filters import to_json

Record = dict[str, Any]
ACME: Record = {"id": "11111111-1111-1111-1111-111111111111", "name": "Acme", "employees": 120}
GLOBEX: Record = {"id": "22222222-2222-2222-2222-222222222222", "name": "Globex", "employees": None}
ALICE: Record = {
    "id": "aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa",
    "firstName": "Alice",
    "createdAt": "2026-11-22T10:00:00.000Z",
    "updatedAt": "2026-11-22T10:00:00.000Z",
    "companyId": ACME["id"],
    "tags": ["LEAD"],
}
BOB: Record = {
    "id": "bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb",
    "firstName": "Bob",
    "createdAt": "2026-11-22T10:00:00.000Z",
    "updatedAt": "2026-11-22T10:00:00.000Z",
    "companyId": GLOBEX["id"],
    "tags": [],
}


def _page(records: list[dict[str, Any]], has_next: bool = False) -> records_pb2.ListRecordsResponse:
    cursors = [f"c-{r['id'][:4]}" for r in records]
    return records_pb2.ListRecordsResponse(
        records_json=orjson.dumps(records),
        cursors=cursors,
        page_info=common_pb2.PageInfo(
            has_next_page=has_next,
            start_cursor=cursors[0] if cursors else "",
            end_cursor=cursors[-1] if cursors else "",
        ),
        total_count=7,
    )


async def test_list_translates_filter_order_and_page(fakes: Any, run_graphql: Any) -> None:
    fakes.records.responses["ListRecords"] = _page([ALICE], has_next=True)
    body = await run_graphql(
        """query($after: String) {
          people(
            filter: {or: [{firstName: {startsWith: "Al"}}, {company: {name: {eq: "Acme"}}}],
                     email: {is: NULL}, companyId: {eq: "11111111-1111-1111-1111-111111111111"}}
            orderBy: [{lastName: DESC}, {firstName: ASC}]
            first: 10
            after: $after
          ) {
            totalCount
            edges { cursor node { id firstName tags } }
            pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
          }
        }""",
        {"after": "cursor-1"},
    )
    assert "errors" not in body, body
    people = body["data"]["people"]
    assert people["edges"] == [
        {"cursor": "c-aaaa", "node": {"id": ALICE["id"], "firstName": "Alice", "tags": ["LEAD"]}}
    ]
    assert people["pageInfo"] == {
        "hasNextPage": True,
        "hasPreviousPage": False,
        "startCursor": "c-aaaa",
        "endCursor": "c-aaaa",
    }
    assert people["totalCount"] == 7
    [request] = fakes.records.named("ListRecords")
    assert request.ref.object == "person"
    assert request.ref.metadata_version == 1
    assert request.first == 10
    assert request.after == "cursor-1"
    assert request.with_total_count
    assert request.depth == 0  # no relation selected
    assert [(o.field, o.direction) for o in request.order_by] == [
        ("lastName", common_pb2.SORT_DIRECTION_DESC),
        ("firstName", common_pb2.SORT_DIRECTION_ASC),
    ]
    assert to_json(request.filter) == {
        "and": [
            {"email": {"is": None}},
            {"company": {"id": {"eq": ACME["id"]}}},
            {"or": [{"firstName": {"startsWith": "Al"}}, {"company": {"name": {"eq": "Acme"}}}]},
        ]
    }


async def test_page_size_defaults_and_limits(fakes: Any, run_graphql: Any) -> None:
    fakes.records.responses["ListRecords"] = _page([])
    await run_graphql("{ people { edges { cursor } } }")
    await run_graphql("{ people(limit: 200) { edges { cursor } } }")
    assert [r.first for r in fakes.records.named("ListRecords")] == [50, 200]
    assert not fakes.records.named("ListRecords")[0].with_total_count
    body = await run_graphql("{ people(first: 201) { edges { cursor } } }")
    [error] = body["errors"]
    assert error["extensions"] == {"code": "BAD_USER_INPUT", "field": "first"}
    assert error["path"] == ["people"]
    assert len(fakes.records.named("ListRecords")) == 2


async def test_selected_many_to_one_comes_nested_in_the_same_call(
    fakes: Any, run_graphql: Any
) -> None:
    nested = [{**ALICE, "company": ACME}, {**BOB, "company": GLOBEX}]
    fakes.records.responses["ListRecords"] = _page(nested)
    body = await run_graphql("{ people { edges { node { firstName company { name } } } } }")
    names = [e["node"]["company"]["name"] for e in body["data"]["people"]["edges"]]
    assert names == ["Acme", "Globex"]
    assert fakes.records.named("ListRecords")[0].depth == 1
    assert [name for name, _ in fakes.records.calls] == ["ListRecords"]


async def test_relations_deeper_down_are_batched(fakes: Any, run_graphql: Any) -> None:
    """companies → people (one-to-many, one ListRelated for every company) → company
    (many-to-one, one GetRecordsByIds for every person): three calls whatever the counts."""
    fakes.records.responses["ListRecords"] = _page([ACME, GLOBEX])
    fakes.records.responses["ListRelated"] = lambda request: records_pb2.ListRelatedResponse(
        groups=[
            records_pb2.RelatedGroup(
                parent_id=ACME["id"], records_json=orjson.dumps([ALICE]), cursors=["x"]
            ),
            records_pb2.RelatedGroup(
                parent_id=GLOBEX["id"], records_json=orjson.dumps([BOB]), cursors=["y"]
            ),
        ]
    )
    fakes.records.responses["GetRecordsByIds"] = lambda request: records_pb2.RecordsResponse(
        records_json=orjson.dumps([c for c in (ACME, GLOBEX) if c["id"] in request.ids])
    )
    body = await run_graphql(
        """{ companies { edges { node { name
             people(first: 5, orderBy: {firstName: ASC}) {
               edges { node { firstName company { name } } } pageInfo { hasNextPage }
             } } } } }"""
    )
    assert "errors" not in body, body
    edges = body["data"]["companies"]["edges"]
    assert [e["node"]["people"]["edges"][0]["node"]["company"]["name"] for e in edges] == [
        "Acme",
        "Globex",
    ]
    assert sorted(name for name, _ in fakes.records.calls) == [
        "GetRecordsByIds",
        "ListRecords",
        "ListRelated",
    ]
    [related] = fakes.records.named("ListRelated")
    assert related.ref.object == "person"
    assert related.foreign_key_field == "company"
    assert sorted(related.parent_ids) == sorted([ACME["id"], GLOBEX["id"]])
    assert related.first_per_parent == 5
    [by_ids] = fakes.records.named("GetRecordsByIds")
    assert sorted(by_ids.ids) == sorted([ACME["id"], GLOBEX["id"]])


async def test_get_one_and_not_found(fakes: Any, run_graphql: Any) -> None:
    fakes.records.responses["GetRecord"] = records_pb2.RecordResponse(
        record_json=orjson.dumps(ACME)
    )
    body = await run_graphql(f'{{ company(id: "{ACME["id"]}") {{ id name employees }} }}')
    assert body == {"data": {"company": ACME}}
    fakes.records.responses["GetRecord"] = NotFound("no company with that id")
    body = await run_graphql(f'{{ company(id: "{GLOBEX["id"]}") {{ id }} }}')
    assert body["data"] == {"company": None}
    assert body["errors"][0]["extensions"]["code"] == "NOT_FOUND"
    assert body["errors"][0]["path"] == ["company"]


async def test_aggregate(fakes: Any, run_graphql: Any) -> None:
    result = {
        "count": 3,
        "sum": {"amount": {"amountMicros": 9_000_000}},
        "avg": {"amount": 3_000_000.0},
        "min": {},
        "max": {"amount": None},
    }
    fakes.records.responses["AggregateRecords"] = records_pb2.AggregateRecordsResponse(
        result_json=orjson.dumps(result)
    )
    body = await run_graphql(
        """{ opportunitiesAggregate(filter: {stage: {eq: WON}}) {
              count sum { amount } avg { amount } min { amount } max { amount } } }"""
    )
    assert body["data"]["opportunitiesAggregate"] == {
        "count": 3,
        "sum": {"amount": 9_000_000.0},
        "avg": {"amount": 3_000_000.0},
        "min": {"amount": None},
        "max": {"amount": None},
    }
    [request] = fakes.records.named("AggregateRecords")
    assert to_json(request.filter) == {"stage": {"eq": "WON"}}


async def test_mutations_send_json_records(fakes: Any, run_graphql: Any) -> None:
    created = {**ACME, "id": "33333333-3333-3333-3333-333333333333"}
    fakes.records.responses["CreateRecord"] = records_pb2.RecordResponse(
        record_json=orjson.dumps(created)
    )
    body = await run_graphql(
        """mutation { createOpportunity(data: {
             name: "Deal", stage: QUALIFIED, amount: {amountMicros: 5000000, currencyCode: "EUR"},
             closeDate: "2026-12-01", company: {connect: "11111111-1111-1111-1111-111111111111"}
           }) { id } }"""
    )
    assert body == {"data": {"createOpportunity": {"id": created["id"]}}}
    [request] = fakes.records.named("CreateRecord")
    assert request.ref.object == "opportunity"
    assert orjson.loads(request.data_json) == {
        "name": "Deal",
        "stage": "QUALIFIED",
        "amount": {"amountMicros": 5_000_000, "currencyCode": "EUR"},
        "closeDate": "2026-12-01",
        "company": {"connect": ACME["id"]},
    }

    fakes.records.responses["UpdateRecord"] = records_pb2.RecordResponse(
        record_json=orjson.dumps(created)
    )
    await run_graphql(
        f"""mutation {{ updateCompany(id: "{ACME["id"]}", data: {{employees: null, name: "A"}})
             {{ id }} }}"""
    )
    [update] = fakes.records.named("UpdateRecord")
    assert update.id == ACME["id"]
    assert orjson.loads(update.data_json) == {"employees": None, "name": "A"}


async def test_create_many_update_many_delete_restore(fakes: Any, run_graphql: Any) -> None:
    two = records_pb2.RecordsResponse(records_json=orjson.dumps([ACME, GLOBEX]))
    one = records_pb2.RecordResponse(record_json=orjson.dumps(ACME))
    for method in ("CreateRecords", "UpdateRecords", "DeleteRecords"):
        fakes.records.responses[method] = two
    for method in ("DeleteRecord", "RestoreRecord"):
        fakes.records.responses[method] = one
    body = await run_graphql(
        """mutation {
          createCompanies(data: [{name: "Acme"}, {name: "Globex"}]) { id }
          updateCompanies(filter: {employees: {lt: 10}}, data: {website: "x.test"}) { name }
          deleteCompanies(filter: {name: {eq: "Old"}}) { id }
          deleteCompany(id: "11111111-1111-1111-1111-111111111111") { id }
          restoreCompany(id: "11111111-1111-1111-1111-111111111111") { name }
        }"""
    )
    assert "errors" not in body, body
    assert [r["id"] for r in body["data"]["createCompanies"]] == [ACME["id"], GLOBEX["id"]]
    assert orjson.loads(fakes.records.named("CreateRecords")[0].data_json) == [
        {"name": "Acme"},
        {"name": "Globex"},
    ]
    update = fakes.records.named("UpdateRecords")[0]
    assert to_json(update.filter) == {"employees": {"lt": 10.0}}
    assert fakes.records.named("RestoreRecord")[0].id == ACME["id"]


async def test_update_many_refuses_an_empty_filter(fakes: Any, run_graphql: Any) -> None:
    body = await run_graphql('mutation { updateCompanies(filter: {}, data: {name: "x"}) { id } }')
    [error] = body["errors"]
    assert error["extensions"] == {"code": "BAD_USER_INPUT", "field": "filter"}
    assert error["path"] == ["updateCompanies"]
    assert not fakes.records.calls


async def test_missing_required_field_is_bad_user_input_naming_it(
    fakes: Any, run_graphql: Any
) -> None:
    body = await run_graphql('mutation { createCompany(data: {website: "a.test"}) { id } }')
    [error] = body["errors"]
    assert error["extensions"] == {"code": "BAD_USER_INPUT", "field": "name"}
    assert error["path"] == ["createCompany"]
    assert body["data"] is None
    body = await run_graphql(
        "mutation($d: [CompanyCreateInput!]!) { createCompanies(data: $d) { id } }",
        {"d": [{"name": "ok"}, {"website": "nameless.test"}]},
    )
    [error] = body["errors"]
    assert error["extensions"] == {"code": "BAD_USER_INPUT", "field": "[1].name"}
    assert error["path"] == ["createCompanies"]
    assert not fakes.records.calls


async def test_wrong_types_and_unknown_fields_name_the_field(fakes: Any, run_graphql: Any) -> None:
    cases = {
        'mutation { createCompany(data: {name: "a", employees: "many"}) { id } }': "employees",
        'mutation { createCompany(data: {name: "a", color: "red"}) { id } }': "color",
        'mutation { createOpportunity(data: {name: "a", stage: MAYBE}) { id } }': "stage",
        '{ person(id: "not-a-uuid") { id } }': "id",
        "{ people(filter: {nope: {eq: 1}}) { edges { cursor } } }": "filter.nope",
        '{ people(filter: {birthday: {gt: "1 May"}}) { edges { cursor } } }': "filter.birthday.gt",
    }
    for query, field in cases.items():
        body = await run_graphql(query)
        [error] = body["errors"]
        assert error["extensions"]["code"] == "BAD_USER_INPUT", (query, error)
        assert error["extensions"].get("field") == field, (query, error)
        assert error["path"], (query, error)
    assert not fakes.records.calls


async def test_service_errors_keep_their_field(fakes: Any, run_graphql: Any) -> None:
    fakes.records.responses["CreateRecords"] = InvalidArgument("not an email", field="[3].email")
    body = await run_graphql('mutation { createPeople(data: [{firstName: "a"}]) { id } }')
    [error] = body["errors"]
    assert error == {
        "message": "not an email",
        "extensions": {"code": "BAD_USER_INPUT", "field": "[3].email"},
        "locations": [{"line": 1, "column": 12}],
        "path": ["createPeople"],
    }


async def test_custom_object_operations_exist(fakes: Any, run_graphql: Any) -> None:
    fakes.records.responses["ListRecords"] = _page([{"id": ACME["id"], "name": "Rex", "from": "x"}])
    body = await run_graphql("{ pets { edges { node { id name from species } } } }")
    assert body["data"]["pets"]["edges"][0]["node"] == {
        "id": ACME["id"],
        "name": "Rex",
        "from": "x",
        "species": None,
    }
    assert fakes.records.named("ListRecords")[0].ref.object == "pet"


async def test_nulls_in_filters_mean_not_given(fakes: Any, run_graphql: Any) -> None:
    fakes.records.responses["ListRecords"] = _page([])
    fakes.records.responses["AggregateRecords"] = records_pb2.AggregateRecordsResponse(
        result_json=b'{"count": 0}'
    )
    body = await run_graphql(
        """{ peopleAggregate(filter: {
              company: null, companyId: {eq: "11111111-1111-1111-1111-111111111111"},
              and: null, or: [{firstName: null}], not: {email: {eq: null}},
              lastName: {eq: null, startsWith: "L", is: null}, jobTitle: {isNot: NULL},
              vip: {}
           }) { count } }"""
    )
    assert body == {"data": {"peopleAggregate": {"count": 0}}}, body
    [request] = fakes.records.named("AggregateRecords")
    members = to_json(request.filter)["and"]
    assert sorted(members, key=str) == sorted(
        [
            {"company": {"id": {"eq": ACME["id"]}}},
            {"lastName": {"startsWith": "L"}},
            {"jobTitle": {"isNot": None}},
        ],
        key=str,
    )
