"""What the API says about itself agrees with what it does (issue 24's contradictions): delete
and restore move `updatedAt` (and their events carry it), record JSON has standard spacing,
`depth` is bounded as documented, the bearer scheme claims no token format it does not have, and
the OpenAPI document declares the JSON filter and relation-field filters so generators keep them."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from crmstack.stack import Stack
from tests.integration.api_helpers import Api
from tests.integration.events_client import listen, read_stream


@pytest.fixture(scope="module")
def api(client: httpx.Client) -> Api:
    return Api.signup(client)


def test_delete_and_restore_move_updated_at_and_their_events_carry_it(
    client: httpx.Client, local_stack: Stack
) -> None:
    api = Api.signup(client)
    listen(local_stack, api.session.workspace_id)  # its events are published
    person = api.create("people", {"firstName": "Ada"})
    updated = api.ok("PATCH", f"/rest/people/{person['id']}", json={"city": "London"})["data"]
    deleted = api.ok("DELETE", f"/rest/people/{person['id']}")["data"]
    restored = api.ok("PATCH", f"/rest/restore/people/{person['id']}")["data"]

    # ISO 8601 UTC with milliseconds: text order is time order.
    assert person["updatedAt"] <= updated["updatedAt"] <= deleted["deletedAt"]
    assert restored["updatedAt"] >= deleted["deletedAt"]
    assert restored["deletedAt"] is None

    events = read_stream(local_stack, api.session.workspace_id, 4)
    records = [json.loads(e.event.record_json) for e in events]
    stamps = [r["updatedAt"] for r in records]
    assert stamps == sorted(stamps), stamps
    assert records[2]["deletedAt"] == records[2]["updatedAt"] == deleted["deletedAt"]
    assert records[3]["updatedAt"] == restored["updatedAt"]
    assert records[3]["deletedAt"] is None


def test_record_json_has_standard_spacing(api: Api) -> None:
    company = api.create("companies", {"name": "Acme", "employees": 3})
    api.create("people", {"firstName": "Ada", "companyId": company["id"]})
    for path in (
        f"/rest/companies/{company['id']}?depth=2",
        "/rest/people?depth=1",
        "/rest/companies/groupBy?field=name",
    ):
        response = api.rest("GET", path)
        assert response.status_code == 200, response.text
        assert '" : ' not in response.text, response.text[:300]
    text = api.rest("GET", f"/rest/companies/{company['id']}").text
    assert f'{{"id": "{company["id"]}", ' in text, text[:200]


def test_depth_is_bounded_as_documented(api: Api) -> None:
    company = api.create("companies", {"name": "Depth"})
    api.create("people", {"firstName": "Ada", "companyId": company["id"]})
    document: dict[str, Any] = api.ok("GET", "/rest/open-api")
    paths = document["paths"]
    list_depth = next(
        p for p in paths["/rest/companies"]["get"]["parameters"] if p["name"] == "depth"
    )
    get_depth = next(
        p for p in paths["/rest/companies/{id}"]["get"]["parameters"] if p["name"] == "depth"
    )
    assert list_depth["schema"]["maximum"] == 1
    assert "2:" not in list_depth["description"]
    assert get_depth["schema"]["maximum"] == 2
    assert "2:" in get_depth["description"]

    assert api.bad("GET", "/rest/companies?depth=2")["details"]["field"] == "depth"
    assert api.ok("GET", "/rest/companies?depth=1")["data"]
    nested = api.ok("GET", f"/rest/companies/{company['id']}?depth=2")["data"]
    assert [p["firstName"] for p in nested["people"]] == ["Ada"]


def test_bearer_scheme_claims_no_format_and_takes_every_credential(
    api: Api, client: httpx.Client
) -> None:
    document: dict[str, Any] = api.ok("GET", "/rest/open-api")
    scheme = document["components"]["securitySchemes"]["bearerAuth"]
    assert scheme["scheme"] == "bearer"
    assert "bearerFormat" not in scheme  # sessions are JWTs, API keys crm_ak_..., PATs crm_pat_...
    assert "crm_ak_" in scheme["description"]
    key = api.data('mutation { createApiKey(input: {name: "k"}) { token } }')["createApiKey"]
    assert key["token"].startswith("crm_ak_")
    response = client.get("/rest/open-api", headers={"Authorization": f"Bearer {key['token']}"})
    assert response.status_code == 200


def test_json_filter_and_relation_filters_are_declared_for_generators(api: Api) -> None:
    document: dict[str, Any] = api.ok("GET", "/rest/open-api")
    parameters = {p["name"]: p for p in document["paths"]["/rest/people"]["get"]["parameters"]}
    json_filter = parameters["filter"]
    assert "content" not in json_filter
    assert json_filter["schema"]["type"] == "string"
    assert '"or"' in json_filter["description"]
    assert {
        "filter[company][name][startsWith]",
        "filter[company][employees][gte]",
        "filter[company][id][eq]",
        "filter[company][annualRecurringRevenue][amountMicros][gt]",
    } <= set(parameters)
    for name, parameter in parameters.items():
        assert "schema" in parameter, name
    company = api.create("companies", {"name": "Acme", "employees": 30})
    api.create("people", {"firstName": "Ada", "companyId": company["id"]})
    found = api.ok(
        "GET",
        "/rest/people",
        params={"filter[company][name][startsWith]": "Ac", "filter[company][employees][gte]": 30},
    )["data"]
    assert [p["firstName"] for p in found] == ["Ada"]
