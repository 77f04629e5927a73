"""GraphQL generated from the workspace's metadata: every record operation, relations,
introspection and errors in the spec's shape."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.integration.api_helpers import Api, Record


@pytest.fixture
def api(client: httpx.Client) -> Api:
    return Api.signup(client)


PEOPLE = """query($filter: PersonFilter, $orderBy: [PersonOrderBy!], $first: Int, $after: String) {
  people(filter: $filter, orderBy: $orderBy, first: $first, after: $after) {
    totalCount
    edges { cursor node { id firstName city company { name } } }
    pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
  }
}"""


def _first_names(api: Api, variables: dict[str, Any]) -> list[str]:
    data = api.data(PEOPLE, {"orderBy": [{"firstName": "ASC"}], **variables})
    return [edge["node"]["firstName"] for edge in data["people"]["edges"]]


def test_create_get_update_delete_restore(api: Api) -> None:
    created = api.data(
        """mutation { createCompany(data: {name: "Acme", employees: 12}) {
             id name employees createdAt deletedAt } }"""
    )["createCompany"]
    assert created["name"] == "Acme"
    assert created["employees"] == 12
    assert created["deletedAt"] is None
    company_id = created["id"]
    person = api.data(
        """mutation($company: UUID!) { createPerson(data: {
             firstName: "Ada", email: "ada@acme.test", company: {connect: $company}}) {
             id companyId company { id name } } }""",
        {"company": company_id},
    )["createPerson"]
    assert person["company"] == {"id": company_id, "name": "Acme"}

    got = api.data(
        "query($id: UUID!) { company(id: $id) { name people { edges { node { id } } } } }",
        {"id": company_id},
    )["company"]
    assert got["people"]["edges"] == [{"node": {"id": person["id"]}}]

    updated = api.data(
        'mutation($id: UUID!) { updateCompany(id: $id, data: {website: "acme.test"}) '
        "{ name website } }",
        {"id": company_id},
    )["updateCompany"]
    assert updated == {"name": "Acme", "website": "acme.test"}

    deleted = api.data(
        "mutation($id: UUID!) { deleteCompany(id: $id) { id deletedAt } }", {"id": company_id}
    )["deleteCompany"]
    assert deleted["deletedAt"] is not None
    assert api.data("{ companies { edges { node { id } } } }")["companies"]["edges"] == []
    missing = api.error("query($id: UUID!) { company(id: $id) { id } }", {"id": company_id})
    assert missing["extensions"]["code"] == "NOT_FOUND"
    assert missing["path"] == ["company"]

    restored = api.data(
        "mutation($id: UUID!) { restoreCompany(id: $id) { id deletedAt name } }",
        {"id": company_id},
    )["restoreCompany"]
    assert restored == {"id": company_id, "deletedAt": None, "name": "Acme"}


def test_filters_order_and_pages(api: Api) -> None:
    acme = api.data('mutation { createCompany(data: {name: "Acme"}) { id } }')["createCompany"]
    api.data(
        """mutation($acme: UUID!) { createPeople(data: [
             {firstName: "Ada", city: "London", companyId: $acme},
             {firstName: "Alan", city: "London", company: {connect: $acme}},
             {firstName: "Grace", city: "New York"},
             {firstName: "Linus"}
           ]) { id } }""",
        {"acme": acme["id"]},
    )
    cases: list[tuple[dict[str, Any], list[str]]] = [
        ({"firstName": {"eq": "Ada"}}, ["Ada"]),
        ({"firstName": {"neq": "Ada"}}, ["Alan", "Grace", "Linus"]),
        ({"firstName": {"in": ["Ada", "Linus"]}}, ["Ada", "Linus"]),
        ({"city": {"contains": "YORK"}}, ["Grace"]),
        ({"firstName": {"startsWith": "A"}}, ["Ada", "Alan"]),
        ({"city": {"endsWith": "don"}}, ["Ada", "Alan"]),
        ({"firstName": {"gt": "Alan"}}, ["Grace", "Linus"]),
        ({"firstName": {"gte": "Alan", "lt": "Linus"}}, ["Alan", "Grace"]),
        ({"firstName": {"lte": "Ada"}}, ["Ada"]),
        ({"city": {"is": "NULL"}}, ["Linus"]),
        ({"city": {"isNot": "NULL"}}, ["Ada", "Alan", "Grace"]),
        ({"city": {"eq": None}, "firstName": {"eq": "Ada"}}, ["Ada"]),  # null: not given
        ({"company": {"name": {"eq": "Acme"}}}, ["Ada", "Alan"]),
        ({"companyId": {"eq": acme["id"]}}, ["Ada", "Alan"]),
        ({"company": {"id": {"is": "NULL"}}}, ["Grace", "Linus"]),
        ({"or": [{"firstName": {"eq": "Ada"}}, {"city": {"eq": "New York"}}]}, ["Ada", "Grace"]),
        ({"and": [{"city": {"eq": "London"}}, {"firstName": {"endsWith": "n"}}]}, ["Alan"]),
        ({"not": {"city": {"eq": "London"}}}, ["Grace", "Linus"]),
    ]
    for flt, expected in cases:
        assert _first_names(api, {"filter": flt}) == expected, flt

    ordered = api.data(PEOPLE, {"orderBy": [{"city": "DESC"}, {"firstName": "DESC"}]})
    names = [edge["node"]["firstName"] for edge in ordered["people"]["edges"]]
    assert names == ["Linus", "Grace", "Alan", "Ada"]  # nulls first when descending

    first = api.data(PEOPLE, {"orderBy": {"firstName": "ASC"}, "first": 3})["people"]
    assert first["totalCount"] == 4
    assert [e["node"]["firstName"] for e in first["edges"]] == ["Ada", "Alan", "Grace"]
    assert first["pageInfo"]["hasNextPage"] is True
    assert first["pageInfo"]["endCursor"] == first["edges"][-1]["cursor"]
    second = api.data(
        PEOPLE,
        {"orderBy": {"firstName": "ASC"}, "first": 3, "after": first["pageInfo"]["endCursor"]},
    )["people"]
    assert [e["node"]["firstName"] for e in second["edges"]] == ["Linus"]
    assert second["pageInfo"]["hasNextPage"] is False
    assert second["pageInfo"]["hasPreviousPage"] is True
    limited = api.data("{ people(limit: 2) { edges { node { id } } } }")["people"]["edges"]
    assert len(limited) == 2
    without_edge_cursors = api.data(
        "{ people(orderBy: {firstName: ASC}, first: 3) "
        "{ edges { node { firstName } } pageInfo { endCursor } } }"
    )["people"]
    assert [e["node"]["firstName"] for e in without_edge_cursors["edges"]] == [
        "Ada",
        "Alan",
        "Grace",
    ]
    assert without_edge_cursors["pageInfo"]["endCursor"] == first["pageInfo"]["endCursor"]


def test_select_currency_and_aggregates(api: Api) -> None:
    api.data(
        """mutation { createOpportunities(data: [
             {name: "A", stage: WON, amount: 10, closeDate: "2026-01-10"},
             {name: "B", stage: WON, amount: 30, closeDate: "2026-02-10"},
             {name: "C", stage: LOST, amount: 5}
           ]) { id stage } }"""
    )
    won = api.data(
        "{ opportunities(filter: {stage: {eq: WON}}, orderBy: {name: ASC}) "
        "{ edges { node { name stage amount closeDate } } } }"
    )["opportunities"]["edges"]
    assert [edge["node"] for edge in won] == [
        {"name": "A", "stage": "WON", "amount": 10, "closeDate": "2026-01-10"},
        {"name": "B", "stage": "WON", "amount": 30, "closeDate": "2026-02-10"},
    ]
    aggregate = api.data(
        """{ opportunitiesAggregate(filter: {stage: {in: [WON, LOST]}}) {
             count sum { amount } avg { amount } min { amount } max { amount } } }"""
    )["opportunitiesAggregate"]
    assert aggregate == {
        "count": 3,
        "sum": {"amount": 45},
        "avg": {"amount": 15},
        "min": {"amount": 5},
        "max": {"amount": 30},
    }
    only_won = api.data(
        '{ opportunitiesAggregate(filter: {closeDate: {gte: "2026-02-01"}}) { count } }'
    )["opportunitiesAggregate"]
    assert only_won == {"count": 1}
    revenue = api.data(
        """mutation { createCompany(data: {name: "Rich",
             annualRecurringRevenue: {amountMicros: 5000000000, currencyCode: "EUR"}}) {
             annualRecurringRevenue { amountMicros currencyCode } } }"""
    )["createCompany"]["annualRecurringRevenue"]
    assert revenue == {"amountMicros": 5_000_000_000, "currencyCode": "EUR"}
    rich = api.data(
        "{ companies(filter: {annualRecurringRevenue: {amountMicros: {gt: 1000}, "
        'currencyCode: {eq: "EUR"}}}) { edges { node { name } } } }'
    )["companies"]["edges"]
    assert [edge["node"]["name"] for edge in rich] == ["Rich"]


def test_update_many_and_delete_many(api: Api) -> None:
    api.data(
        """mutation { createCompanies(data: [
             {name: "A", employees: 1}, {name: "B", employees: 2}, {name: "C", employees: 30}
           ]) { id } }"""
    )
    updated = api.data(
        'mutation { updateCompanies(filter: {employees: {lt: 10}}, data: {industry: "Tiny"}) '
        "{ name industry } }"
    )["updateCompanies"]
    assert sorted(c["name"] for c in updated) == ["A", "B"]
    assert {c["industry"] for c in updated} == {"Tiny"}
    deleted = api.data('mutation { deleteCompanies(filter: {industry: {eq: "Tiny"}}) { name } }')
    assert sorted(c["name"] for c in deleted["deleteCompanies"]) == ["A", "B"]
    left = api.data("{ companies { edges { node { name } } } }")["companies"]["edges"]
    assert [edge["node"]["name"] for edge in left] == ["C"]
    refused = api.error('mutation { updateCompanies(filter: {}, data: {name: "x"}) { id } }')
    assert refused["extensions"] == {"code": "BAD_USER_INPUT", "field": "filter"}
    assert refused["path"] == ["updateCompanies"]


def test_relations_are_batched_both_ways(api: Api) -> None:
    companies = api.data(
        """mutation { createCompanies(data: [{name: "Acme"}, {name: "Globex"}, {name: "Initech"}])
             { id name } }"""
    )["createCompanies"]
    people = [
        {"firstName": f"{company['name']}-{n}", "companyId": company["id"]}
        for company in companies
        for n in range(3)
    ]
    api.data(
        "mutation($people: [PersonCreateInput!]!) { createPeople(data: $people) { id } }",
        {"people": people},
    )
    data = api.data(
        """{ companies(orderBy: {name: ASC}) { edges { node { name
             people(orderBy: {firstName: DESC}, first: 2) {
               edges { node { firstName company { name } } } pageInfo { hasNextPage } } } } } }"""
    )
    for edge in data["companies"]["edges"]:
        node = edge["node"]
        names = [p["node"]["firstName"] for p in node["people"]["edges"]]
        assert names == [f"{node['name']}-2", f"{node['name']}-1"]
        assert {p["node"]["company"]["name"] for p in node["people"]["edges"]} == {node["name"]}
        assert node["people"]["pageInfo"]["hasNextPage"] is True


def test_a_person_s_company_nested_missing_deleted_and_unreadable(api: Api) -> None:
    """`company { name }` below people and a person: the company, null without one, null when
    it was deleted, and an error at the field (the rest answered) for a key whose role reads
    people but not companies, whichever execution answers it."""
    acme, gone = api.data(
        'mutation { createCompanies(data: [{name: "Acme"}, {name: "Gone"}]) { id } }'
    )["createCompanies"]
    people = api.data(
        "mutation($people: [PersonCreateInput!]!) { createPeople(data: $people) { id } }",
        {
            "people": [
                {"firstName": "Ada", "companyId": acme["id"]},
                {"firstName": "Bob"},
                {"firstName": "Cy", "companyId": gone["id"]},
            ]
        },
    )["createPeople"]
    api.data("mutation($id: UUID!) { deleteCompany(id: $id) { id } }", {"id": gone["id"]})
    query = (
        "{ people(orderBy: {firstName: ASC}) { edges { node { firstName company { name } } } } }"
    )
    nodes = [edge["node"] for edge in api.data(query)["people"]["edges"]]
    assert nodes == [
        {"firstName": "Ada", "company": {"name": "Acme"}},
        {"firstName": "Bob", "company": None},
        {"firstName": "Cy", "company": None},
    ]
    one = "query($id: UUID!) { person(id: $id) { firstName company { name } } }"
    assert api.data(one, {"id": people[0]["id"]})["person"]["company"] == {"name": "Acme"}

    role = api.data(
        """mutation { createRole(input: {name: "People readers",
             permissions: [{object: "person", actions: [READ]}]}) { id } }"""
    )["createRole"]
    token = api.data(
        'mutation($r: UUID) { createApiKey(input: {name: "people", roleId: $r}) { token } }',
        {"r": role["id"]},
    )["createApiKey"]["token"]
    response = api.http.post(
        "/graphql", json={"query": query}, headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    edges = body["data"]["people"]["edges"]
    assert [edge["node"]["firstName"] for edge in edges] == ["Ada", "Bob", "Cy"]
    assert [edge["node"]["company"] for edge in edges] == [None, None, None]
    assert body["errors"], body
    assert {tuple(error["path"]) for error in body["errors"]} <= {
        ("people", "edges", 0, "node", "company"),
        ("people", "edges", 2, "node", "company"),
    }
    assert body["errors"][0]["extensions"]["code"] == "FORBIDDEN"


def test_introspection_describes_the_workspace(api: Api) -> None:
    data = api.data(
        """{ __schema { queryType { fields { name } } mutationType { fields { name } } }
             person: __type(name: "Person") { fields { name type { name kind ofType { name } } } }
             stage: __type(name: "OpportunityStageEnum") { enumValues { name } } }"""
    )
    queries = {f["name"] for f in data["__schema"]["queryType"]["fields"]}
    assert {"people", "person", "peopleAggregate", "objects", "fields", "currentUser"} <= queries
    mutations = {f["name"] for f in data["__schema"]["mutationType"]["fields"]}
    assert {
        "createPerson",
        "createPeople",
        "updatePerson",
        "updatePeople",
        "deletePerson",
        "restorePerson",
        "createObject",
        "createField",
    } <= mutations
    fields = {f["name"]: f["type"] for f in data["person"]["fields"]}
    assert fields["id"]["kind"] == "NON_NULL"
    assert fields["id"]["ofType"]["name"] == "UUID"
    assert fields["company"]["name"] == "Company"
    assert fields["opportunities"]["ofType"]["name"] == "OpportunityConnection"
    stages = [value["name"] for value in data["stage"]["enumValues"]]
    assert stages[:2] == ["PROSPECTING", "QUALIFIED"]


def test_errors_have_the_spec_shape(api: Api) -> None:
    missing = api.error('mutation { createCompany(data: {website: "x.test"}) { id } }')
    assert missing["extensions"] == {"code": "BAD_USER_INPUT", "field": "name"}
    assert missing["path"] == ["createCompany"]
    variables = api.error(
        "mutation($data: CompanyCreateInput!) { createCompany(data: $data) { id } }",
        {"data": {"employees": 3}},
    )
    assert variables["extensions"] == {"code": "BAD_USER_INPUT", "field": "name"}
    assert variables["path"] == ["createCompany"]
    wrong = api.error('mutation { createPerson(data: {firstName: "x", email: "nope"}) { id } }')
    assert wrong["extensions"] == {"code": "BAD_USER_INPUT", "field": "email"}
    assert wrong["path"] == ["createPerson"]
    batch = api.error(
        "mutation($p: [PersonCreateInput!]!) { createPeople(data: $p) { id } }",
        {"p": [{"firstName": "a"}, {"firstName": "b", "email": "bad"}]},
    )
    assert batch["extensions"] == {"code": "BAD_USER_INPUT", "field": "[1].email"}
    assert api.data("{ people { totalCount } }")["people"]["totalCount"] == 0
    unknown = api.error("{ unicorns { edges { cursor } } }")
    assert unknown["extensions"]["code"] == "BAD_USER_INPUT"
    assert unknown["extensions"]["field"] == "unicorns"
    too_big = api.error("{ people(first: 500) { edges { cursor } } }")
    assert too_big["extensions"] == {"code": "BAD_USER_INPUT", "field": "first"}
    bad_cursor = api.error('{ people(after: "garbage") { edges { cursor } } }')
    assert bad_cursor["extensions"] == {"code": "BAD_USER_INPUT", "field": "after"}


def test_unauthenticated(client: httpx.Client) -> None:
    response = client.post("/graphql", json={"query": "{ people { totalCount } }"})
    assert response.status_code == 401
    assert response.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"


def test_workspaces_do_not_see_each_other(client: httpx.Client) -> None:
    mine, theirs = Api.signup(client), Api.signup(client)
    company: Record = mine.data('mutation { createCompany(data: {name: "Mine"}) { id } }')[
        "createCompany"
    ]
    assert theirs.data("{ companies { totalCount } }")["companies"]["totalCount"] == 0
    error = theirs.error("query($id: UUID!) { company(id: $id) { id } }", {"id": company["id"]})
    assert error["extensions"]["code"] == "NOT_FOUND"
