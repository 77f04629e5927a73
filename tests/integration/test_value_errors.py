"""Values PostgreSQL cannot store or compute are the client's 400, never a 500."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.api_helpers import Api


@pytest.fixture
def api(client: httpx.Client) -> Api:
    return Api.signup(client)


def test_nul_character_in_text_is_bad_request_and_stores_nothing(api: Api) -> None:
    body = api.bad("POST", "/rest/people", json={"firstName": "Ada\u0000", "lastName": "L"})
    assert "NUL" in body["message"]
    assert api.ok("GET", "/rest/people")["data"] == []


def test_nul_character_in_a_settings_name_is_bad_request(api: Api) -> None:
    error = api.error(
        "mutation($name: String!) { createPersonalAccessToken(input: {name: $name}) { id } }",
        {"name": "token\u0000"},
    )
    assert error["extensions"]["code"] == "BAD_USER_INPUT"


def test_a_sum_beyond_double_precision_is_bad_request(api: Api) -> None:
    for name in ("Huge", "Huger"):
        api.create("companies", {"name": name, "employees": 1e308})
    body = api.bad("GET", "/rest/companies/groupBy", params={"field": "idealCustomerProfile"})
    assert "out of range" in body["message"]
