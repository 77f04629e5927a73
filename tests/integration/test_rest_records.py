"""REST: the spec's table for records, through the gateway to the records service."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.integration.api_helpers import Api, Record


@pytest.fixture
def api(client: httpx.Client) -> Api:
    return Api.signup(client)


def _ids(body: Record) -> list[str]:
    return [record["id"] for record in body["data"]]


def test_crud_shapes(api: Api) -> None:
    company = api.create("companies", {"name": "Acme", "employees": 120})
    assert company["name"] == "Acme"
    assert company["employees"] == 120
    assert company["deletedAt"] is None
    person = api.create(
        "people",
        {"firstName": "Ada", "email": "ada@acme.test", "company": {"connect": company["id"]}},
    )
    assert person["companyId"] == company["id"]

    got = api.ok("GET", f"/rest/people/{person['id']}")
    assert got["data"]["company"]["name"] == "Acme"  # depth 1 by default: relations nested
    flat = api.ok("GET", f"/rest/people/{person['id']}?depth=0")["data"]
    assert "company" not in flat
    assert flat["companyId"] == company["id"]
    deep = api.ok("GET", f"/rest/companies/{company['id']}?depth=2")["data"]
    assert [p["id"] for p in deep["people"]] == [person["id"]]
    only = api.ok("GET", f"/rest/people/{person['id']}?fields=firstName,email&depth=0")["data"]
    assert set(only) == {"id", "firstName", "email"}

    patched = api.ok("PATCH", f"/rest/people/{person['id']}", json={"jobTitle": "CTO"})
    assert set(patched["data"]) == {"id", "jobTitle", "updatedAt"}
    assert patched["data"]["jobTitle"] == "CTO"
    assert patched["data"]["updatedAt"] >= person["updatedAt"]
    unchanged = api.ok("PATCH", f"/rest/people/{person['id']}", json={"jobTitle": "CTO"})
    assert set(unchanged["data"]) == {"id", "updatedAt"}
    moved = api.ok("PATCH", f"/rest/people/{person['id']}", json={"company": {"disconnect": True}})
    assert moved["data"]["companyId"] is None
    assert set(moved["data"]) == {"id", "companyId", "updatedAt"}

    deleted = api.ok("DELETE", f"/rest/people/{person['id']}")
    assert set(deleted["data"]) == {"id", "deletedAt"}
    assert deleted["data"]["id"] == person["id"]
    assert deleted["data"]["deletedAt"] is not None


def test_soft_delete_hides_and_restore_brings_back(api: Api) -> None:
    kept = api.create("companies", {"name": "Kept"})
    gone = api.create("companies", {"name": "Gone"})
    api.ok("DELETE", f"/rest/companies/{gone['id']}")
    assert _ids(api.ok("GET", "/rest/companies")) == [kept["id"]]
    api.bad("GET", f"/rest/companies/{gone['id']}", 404)
    deleted = api.ok("GET", "/rest/companies?filter[deletedAt][isNot]=null")
    assert _ids(deleted) == [gone["id"]]
    restored = api.ok("PATCH", f"/rest/restore/companies/{gone['id']}")
    assert restored["data"]["id"] == gone["id"]
    assert restored["data"]["deletedAt"] is None
    assert restored["data"]["name"] == "Gone"
    assert sorted(_ids(api.ok("GET", "/rest/companies"))) == sorted([kept["id"], gone["id"]])


def _seed_people(api: Api) -> dict[str, Record]:
    acme = api.create("companies", {"name": "Acme", "employees": 100})
    globex = api.create("companies", {"name": "Globex", "employees": 5})
    people = {
        "ada": {"firstName": "Ada", "lastName": "Lovelace", "email": "ada@acme.test",
                "jobTitle": "CTO", "city": "London", "company": {"connect": acme["id"]}},
        "alan": {"firstName": "Alan", "lastName": "Turing", "email": "alan@acme.test",
                 "jobTitle": "Researcher", "company": {"connect": acme["id"]}},
        "grace": {"firstName": "Grace", "lastName": "Hopper", "email": "grace@globex.test",
                  "jobTitle": "Admiral", "city": "New York", "companyId": globex["id"]},
        "linus": {"firstName": "Linus", "lastName": "Torvalds", "email": None, "city": "Portland"},
    }  # fmt: skip
    created = {key: api.create("people", value) for key, value in people.items()}
    created["acme"], created["globex"] = acme, globex
    return created


def _names(api: Api, query: str) -> list[str]:
    body = api.ok("GET", f"/rest/people?orderBy[firstName]=ASC&{query}")
    return [record["firstName"] for record in body["data"]]


def test_every_filter_operator(api: Api) -> None:
    seeded = _seed_people(api)
    acme = seeded["acme"]["id"]
    cases: list[tuple[str, list[str]]] = [
        ("filter[firstName][eq]=Ada", ["Ada"]),
        ("filter[firstName][neq]=Ada", ["Alan", "Grace", "Linus"]),
        ("filter[firstName][in]=Ada,Grace", ["Ada", "Grace"]),
        ('filter[firstName][in]=["Alan","Linus"]', ["Alan", "Linus"]),
        ("filter[email][contains]=ACME", ["Ada", "Alan"]),
        ("filter[firstName][startsWith]=A", ["Ada", "Alan"]),
        ("filter[firstName][startsWith]=a", []),
        ("filter[email][endsWith]=globex.test", ["Grace"]),
        ("filter[lastName][gt]=Lovelace", ["Alan", "Linus"]),
        ("filter[lastName][gte]=Turing", ["Alan"]),
        ("filter[lastName][lt]=Hopper", []),
        ("filter[lastName][lte]=Hopper", ["Grace"]),
        ("filter[email][is]=null", ["Linus"]),
        ("filter[email][isNot]=NULL", ["Ada", "Alan", "Grace"]),
        ("filter[city][is]=null&filter[email][isNot]=null", ["Alan"]),
        (f"filter[company][id][eq]={acme}", ["Ada", "Alan"]),
        (f"filter[companyId][eq]={acme}", ["Ada", "Alan"]),
        ("filter[company][name][startsWith]=Glo", ["Grace"]),
        ("filter[company][employees][gte]=50", ["Ada", "Alan"]),
        ("filter[company][id][is]=null", ["Linus"]),
        ("filter[firstName]=Grace", ["Grace"]),
        ('filter={"or":[{"firstName":{"eq":"Ada"}},{"city":{"eq":"Portland"}}]}', ["Ada", "Linus"]),
        ('filter={"not":{"city":{"eq":"London"}}}', ["Alan", "Grace", "Linus"]),
        (
            'filter={"and":[{"company":{"name":{"eq":"Acme"}}},{"jobTitle":{"contains":"cto"}}]}',
            ["Ada"],
        ),
    ]
    for query, expected in cases:
        assert _names(api, query) == sorted(expected), query


def test_number_and_date_filters(api: Api) -> None:
    for name, employees in (("Small", 5), ("Mid", 50), ("Big", 500)):
        api.create("companies", {"name": name, "employees": employees})
    body = api.ok("GET", "/rest/companies?filter[employees][gte]=50&orderBy[employees]=DESC")
    assert [c["name"] for c in body["data"]] == ["Big", "Mid"]
    body = api.ok("GET", "/rest/companies?filter[employees][in]=5,500&orderBy[name]=ASC")
    assert [c["name"] for c in body["data"]] == ["Big", "Small"]
    opportunity = api.create(
        "opportunities", {"name": "Deal", "closeDate": "2026-03-01", "stage": "QUALIFIED"}
    )
    for query, found in (
        ("filter[closeDate][gte]=2026-03-01", True),
        ("filter[closeDate][gt]=2026-03-01", False),
        ("filter[closeDate][lt]=2026-03-02T08:00:00Z", True),
        ("filter[closeDate][eq]=2026-03-01T23:00:00Z", True),
        ("filter[createdAt][gt]=2000-01-01", True),
        ("filter[stage][eq]=QUALIFIED", True),
        ("filter[stage][in]=WON,LOST", False),
    ):
        ids = _ids(api.ok("GET", f"/rest/opportunities?{query}"))
        assert (opportunity["id"] in ids) is found, query


def test_order_by_several_fields_and_cursor_pages_with_ties(api: Api) -> None:
    # Ten people, three cities: many ties in the first sort key.
    for index in range(10):
        api.create("people", {"firstName": f"P{index:02d}", "city": ["A", "B", "C"][index % 3]})
    order = "orderBy[city]=DESC&orderBy[firstName]=ASC"
    everything = api.ok("GET", f"/rest/people?{order}&limit=50")
    expected = [p["firstName"] for p in everything["data"]]
    assert expected[:4] == ["P02", "P05", "P08", "P01"]
    seen: list[str] = []
    after = ""
    pages = 0
    while True:
        query = f"/rest/people?{order}&limit=3" + (f"&after={after}" if after else "")
        page = api.ok("GET", query)
        seen.extend(p["firstName"] for p in page["data"])
        pages += 1
        assert page["pageInfo"]["hasPreviousPage"] is bool(after)
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = page["pageInfo"]["endCursor"]
    assert seen == expected
    assert pages == 4


def test_limit_default_max_and_beyond(api: Api) -> None:
    api.ok("POST", "/rest/batch/companies", 201, json=[{"name": f"C{i}"} for i in range(60)])
    assert len(api.ok("GET", "/rest/companies")["data"]) == 50
    assert len(api.ok("GET", "/rest/companies?limit=200")["data"]) == 60
    assert api.bad("GET", "/rest/companies?limit=201")["details"]["field"] == "limit"
    assert api.bad("GET", "/rest/companies?limit=0")["details"]["field"] == "limit"
    assert api.bad("GET", "/rest/companies?limit=ten")["details"]["field"] == "limit"


def test_fields_restrict_list_records(api: Api) -> None:
    api.create("companies", {"name": "Acme", "employees": 3})
    body = api.ok("GET", "/rest/companies?fields=name,employees")
    assert body["data"] == [{"id": body["data"][0]["id"], "name": "Acme", "employees": 3}]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("filter[nope][eq]=1", "nope"),
        ("filter[company][nope][eq]=1", "company.nope"),
        ("filter[firstName][like]=A", "firstName"),
        ("filter[firstName][gt][x]=A", "firstName"),
        ("filter[email][is]=nobody", "email"),
        ("filter[company][id][eq]=not-a-uuid", "company.id"),
        ("filter[createdAt][gt]=yesterday", "createdAt"),
        ("filter[opportunities][eq]=x", "opportunities"),
        ("filter={not json", "filter"),
        ('filter={"firstName":{"near":"x"}}', "firstName"),
        ("orderBy[nope]=ASC", "nope"),
        ("orderBy[firstName]=UP", "firstName"),
        ("after=not-a-cursor", "after"),
        ("fields=firstName,nope", "nope"),
        ("depth=3", "depth"),
        ("filters[firstName][eq]=x", "filters[firstName][eq]"),
    ],
)
def test_bad_list_parameters_name_the_field(api: Api, query: str, field: str) -> None:
    body = api.bad("GET", f"/rest/people?{query}")
    assert body["details"]["field"] == field, body
    assert body["error"] == "Bad Request"


def test_wrong_values_in_filters(api: Api) -> None:
    assert api.bad("GET", "/rest/companies?filter[employees][gt]=many")["details"]["field"] == (
        "employees"
    )
    body = api.bad("GET", "/rest/opportunities?filter[stage][eq]=MAYBE")
    assert body["details"]["field"] == "stage"
    body = api.bad("GET", "/rest/companies?filter[idealCustomerProfile][eq]=perhaps")
    assert body["details"]["field"] == "idealCustomerProfile"


def test_unknown_object_and_record(api: Api) -> None:
    body = api.bad("GET", "/rest/unicorns", 404)
    assert body["details"]["field"] == "object"
    api.bad("POST", "/rest/unicorns", 404, json={})
    api.bad("GET", f"/rest/people/{uuid.uuid4()}", 404)
    assert api.bad("GET", "/rest/people/not-a-uuid")["details"]["field"] == "id"
    api.bad("PATCH", f"/rest/people/{uuid.uuid4()}", 404, json={"firstName": "x"})
    api.bad("DELETE", f"/rest/people/{uuid.uuid4()}", 404)
    api.bad("PATCH", f"/rest/restore/people/{uuid.uuid4()}", 404)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{nope", "body"),
        (b"[1, 2]", "body"),
        (b'{"nope": 1}', "nope"),
        (b'{"employees": "many", "name": "x"}', "employees"),
        (b'{"website": "x.test"}', "name"),
        (b'{"name": "x", "createdAt": "2026-01-01T00:00:00Z"}', "createdAt"),
    ],
)
def test_bad_bodies_name_the_field(api: Api, body: bytes, field: str) -> None:
    response = api.http.post(
        "/rest/companies", content=body, headers={**api.headers, "content-type": "application/json"}
    )
    assert response.status_code == 400, response.text
    assert response.json()["details"]["field"] == field, response.text
    assert api.ok("GET", "/rest/companies")["data"] == []  # nothing was written


def test_batch_is_all_or_nothing_and_names_the_index(api: Api) -> None:
    created = api.ok(
        "POST", "/rest/batch/people", 201, json=[{"firstName": f"B{i}"} for i in range(1000)]
    )
    assert len(created["data"]) == 1000
    assert created["data"][0]["firstName"] == "B0"
    records: list[dict[str, Any]] = [{"firstName": "ok"} for _ in range(5)]
    records[3] = {"firstName": "bad", "email": "not an email"}
    body = api.bad("POST", "/rest/batch/people", json=records)
    assert body["details"]["field"] == "[3].email"
    count = len(api.ok("GET", "/rest/people?filter[firstName][eq]=ok")["data"])
    assert count == 0
    assert api.bad("POST", "/rest/batch/people", json=[])["details"]["field"] == "body"
    too_many = [{"firstName": "x"}] * 1001
    assert api.bad("POST", "/rest/batch/people", json=too_many)["details"]["field"] == "body"
    assert api.bad("POST", "/rest/batch/people", json=[{}, 3])["details"]["field"] == "[1]"


def test_duplicates_match_case_insensitively(api: Api) -> None:
    first = api.create("people", {"firstName": "Ada", "email": "Ada@Acme.test"})
    second = api.create("people", {"firstName": "ADA", "email": "ada@acme.TEST"})
    api.create("people", {"firstName": "Ada", "email": "other@acme.test"})
    body = api.ok("POST", "/rest/people/duplicates", json={"email": "ADA@ACME.TEST"})
    assert sorted(_ids(body)) == sorted([first["id"], second["id"]])
    assert body["pageInfo"]["hasNextPage"] is False
    excluding = api.ok(
        "POST", "/rest/people/duplicates", json={"email": "ada@acme.test", "id": first["id"]}
    )
    assert _ids(excluding) == [second["id"]]
    assert api.bad("POST", "/rest/people/duplicates", json={})["details"]["field"] == "body"


def test_merge_repoints_relations_and_soft_deletes_the_source(api: Api) -> None:
    target = api.create("companies", {"name": "Acme", "website": None, "employees": 10})
    source = api.create("companies", {"name": "ACME Inc", "website": "acme.test", "employees": 99})
    person = api.create("people", {"firstName": "Ada", "company": {"connect": source["id"]}})
    deal = api.create("opportunities", {"name": "Deal", "company": {"connect": source["id"]}})
    merged = api.ok(
        "PATCH",
        "/rest/companies/merge",
        json={"sourceId": source["id"], "targetId": target["id"]},
    )
    assert merged["data"]["id"] == target["id"]
    assert merged["data"]["name"] == "Acme"  # the target wins
    assert merged["data"]["employees"] == 10
    assert merged["data"]["website"] == "acme.test"  # the source fills the target's nulls
    assert merged["meta"]["sourceId"] == source["id"]
    assert merged["meta"]["sourceDeletedAt"] is not None
    assert merged["meta"]["relationsRepointed"] == 2
    assert api.ok("GET", f"/rest/people/{person['id']}")["data"]["companyId"] == target["id"]
    assert api.ok("GET", f"/rest/opportunities/{deal['id']}")["data"]["companyId"] == target["id"]
    api.bad("GET", f"/rest/companies/{source['id']}", 404)
    body = api.bad(
        "PATCH", "/rest/companies/merge", json={"sourceId": target["id"], "targetId": target["id"]}
    )
    assert body["details"]["field"] == "sourceId"
    assert api.bad("PATCH", "/rest/companies/merge", json={"sourceId": "x"})["details"][
        "field"
    ] == ("sourceId")


def test_group_by_counts_and_sums_with_the_list_filters(api: Api) -> None:
    for stage, amount in (("WON", 10), ("WON", 5), ("LOST", 7), ("QUALIFIED", 1)):
        api.create("opportunities", {"name": f"{stage}-{amount}", "stage": stage, "amount": amount})
    body = api.ok("GET", "/rest/opportunities/groupBy?field=stage")
    groups = {group["stage"]: group for group in body["data"]}
    assert groups["WON"]["count"] == 2
    assert groups["WON"]["sum"]["amount"] == 15
    assert groups["LOST"]["sum"]["amount"] == 7
    filtered = api.ok("GET", "/rest/opportunities/groupBy?field=stage&filter[amount][gte]=5")
    assert {g["stage"]: g["count"] for g in filtered["data"]} == {"WON": 2, "LOST": 1}
    assert api.bad("GET", "/rest/opportunities/groupBy")["details"]["field"] == "field"
    assert api.bad("GET", "/rest/opportunities/groupBy?field=nope")["details"]["field"] == "nope"


def test_workspaces_are_isolated(client: httpx.Client) -> None:
    mine, theirs = Api.signup(client), Api.signup(client)
    company = mine.create("companies", {"name": "Mine"})
    assert theirs.ok("GET", "/rest/companies")["data"] == []
    theirs.bad("GET", f"/rest/companies/{company['id']}", 404)
    theirs.bad("PATCH", f"/rest/companies/{company['id']}", 404, json={"name": "x"})
    theirs.bad("DELETE", f"/rest/companies/{company['id']}", 404)
    assert mine.ok("GET", f"/rest/companies/{company['id']}")["data"]["name"] == "Mine"


def test_every_route_needs_a_credential(client: httpx.Client) -> None:
    some_id = str(uuid.uuid4())
    for method, path in (
        ("GET", "/rest/people"),
        ("POST", "/rest/people"),
        ("GET", f"/rest/people/{some_id}"),
        ("PATCH", f"/rest/people/{some_id}"),
        ("DELETE", f"/rest/people/{some_id}"),
        ("POST", "/rest/batch/people"),
        ("POST", "/rest/people/duplicates"),
        ("PATCH", "/rest/people/merge"),
        ("GET", "/rest/people/groupBy?field=city"),
        ("PATCH", f"/rest/restore/people/{some_id}"),
        ("GET", "/rest/open-api"),
    ):
        response = client.request(method, path, json={})
        assert response.status_code == 401, (method, path, response.text)
        assert response.json()["error"] == "Unauthorized"
