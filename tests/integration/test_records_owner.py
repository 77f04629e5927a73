"""`ownerId` names a member of the record's workspace (issue 23.6): a random UUID or a user of
another workspace is the client's 400 naming the field, on create, update and batch, over REST
and GraphQL; nothing is written."""

from __future__ import annotations

import uuid

import httpx
import pytest

from crmstack.client import graphql_data, login, unique_email
from tests.integration.api_helpers import Api

ADD_MEMBER = (
    "mutation($input: AddWorkspaceMemberInput!) { addWorkspaceMember(input: $input) { id } }"
)


@pytest.fixture
def api(client: httpx.Client) -> Api:
    return Api.signup(client)


def _member_id(api: Api) -> str:
    email = unique_email("owner")
    graphql_data(
        api.http,
        api.session.access_token,
        ADD_MEMBER,
        {"input": {"email": email, "password": "member password"}},
    )
    return login(api.http, email, "member password", api.session.workspace_id).user_id


def _strangers(client: httpx.Client) -> list[str]:
    return [str(uuid.uuid4()), Api.signup(client).session.user_id]


def test_a_record_may_be_owned_by_a_member_of_its_workspace(api: Api) -> None:
    member = _member_id(api)
    created = api.create("people", {"firstName": "Ada", "ownerId": member})
    assert created["ownerId"] == member
    updated = api.ok(
        "PATCH", f"/rest/people/{created['id']}", json={"ownerId": api.session.user_id}
    )
    assert updated["data"]["ownerId"] == api.session.user_id
    batch = api.ok(
        "POST", "/rest/batch/people", 201, json=[{"firstName": "B", "ownerId": member}, {}]
    )
    assert [row["ownerId"] for row in batch["data"]] == [member, api.session.user_id]


def test_rest_refuses_an_owner_outside_the_workspace(api: Api, client: httpx.Client) -> None:
    own = api.create("people", {"firstName": "Own"})
    for stranger in _strangers(client):
        body = api.bad("POST", "/rest/people", json={"firstName": "X", "ownerId": stranger})
        assert body["details"]["field"] == "ownerId", body
        body = api.bad("PATCH", f"/rest/people/{own['id']}", json={"ownerId": stranger})
        assert body["details"]["field"] == "ownerId", body
        body = api.bad(
            "POST",
            "/rest/batch/people",
            json=[{"firstName": "Y"}, {"firstName": "Z", "ownerId": stranger}],
        )
        assert body["details"]["field"] == "[1].ownerId", body
    people = api.ok("GET", "/rest/people")["data"]
    assert [(p["firstName"], p["ownerId"]) for p in people] == [("Own", api.session.user_id)]


def test_graphql_refuses_an_owner_outside_the_workspace(api: Api, client: httpx.Client) -> None:
    own = api.create("people", {"firstName": "Own"})
    for stranger in _strangers(client):
        attempts = [
            ("mutation($o: UUID) { createPerson(data: {firstName: \"X\", ownerId: $o}) { id } }",
             "ownerId"),
            ("mutation($o: UUID) { createPeople(data: [{firstName: \"X\"}, "
             "{firstName: \"Y\", ownerId: $o}]) { id } }", "[1].ownerId"),
            (f"mutation($o: UUID) {{ updatePerson(id: \"{own['id']}\", data: {{ownerId: $o}}) "
             "{ id } }", "ownerId"),
        ]  # fmt: skip
        for query, field in attempts:
            error = api.error(query, {"o": stranger})
            assert error["extensions"]["code"] == "BAD_USER_INPUT", error
            assert error["extensions"]["field"] == field, error
    people = api.ok("GET", "/rest/people")["data"]
    assert [(p["firstName"], p["ownerId"]) for p in people] == [("Own", api.session.user_id)]
