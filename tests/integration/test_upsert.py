"""Upsert on a unique field (docs/api.md, "Upsert"): REST `?upsert=<field>` on the single and
batch create, GraphQL `upsert<S>` / `upsert<P>(data, matchOn)`. Matched rows are updated (only
the fields given), others created, all or nothing; events `created` / `updated` (with the previous
record); a non-unique field is a 400 naming it; a value held only by a soft-deleted record a 409;
another member's record a 403; an Idempotency-Key replays."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from crmkit.messaging import previous_record_json
from crmstack.client import graphql_data, login, unique_email
from crmstack.stack import Stack
from tests.integration.api_helpers import Api, Record
from tests.integration.events_client import listen, read_stream


@pytest.fixture
def api(client: httpx.Client) -> Api:
    api = Api.signup(client)
    person = api.object_id("person")
    api.create_field(person, "externalId", "TEXT", isUnique=True)  # unbounded text: md5 index
    api.create_field(person, "badge", "NUMBER", isUnique=True)
    api.create_field(person, "nickname", "TEXT")
    return api


def _names(api: Api) -> dict[str, Record]:
    rows = api.ok("GET", "/rest/people?limit=200")["data"]
    return {row["externalId"]: row for row in rows}


def test_batch_upsert_updates_matches_creates_the_rest_and_emits_each_event(
    api: Api, local_stack: Stack
) -> None:
    listen(local_stack, api.session.workspace_id)  # its events are published
    first = api.create("people", {"externalId": "x-1", "firstName": "Ada", "city": "London"})
    body = [
        {"externalId": "x-1", "city": "Paris"},  # matched: only city changes
        {"externalId": "x-2", "firstName": "Grace", "badge": 7},
    ]
    answer = api.ok("POST", "/rest/batch/people?upsert=externalId", json=body)
    assert answer["meta"] == {"created": 1, "updated": 1}
    updated, created = answer["data"]
    assert updated["id"] == first["id"]
    assert (updated["firstName"], updated["city"]) == ("Ada", "Paris")
    assert updated["updatedAt"] > first["updatedAt"]
    assert (created["externalId"], created["firstName"], created["badge"]) == ("x-2", "Grace", 7)
    assert set(_names(api)) == {"x-1", "x-2"}

    events = read_stream(local_stack, api.session.workspace_id, 3)
    assert [(e.event.record_id, e.event.action) for e in events[1:]] in (
        [(first["id"], 2), (created["id"], 1)],
        [(created["id"], 1), (first["id"], 2)],
    )
    update = next(e.event for e in events[1:] if e.event.record_id == first["id"])
    assert json.loads(previous_record_json(update))["city"] == "London"
    assert list(update.changed_fields) == ["city"]

    # Matching on a plain (b-tree) unique index too; a row changing nothing writes nothing.
    again = api.ok("POST", "/rest/batch/people?upsert=badge", json=[{"badge": 7, "city": None}])
    assert again["data"][0]["id"] == created["id"]
    assert again["data"][0]["updatedAt"] == created["updatedAt"]
    assert again["meta"] == {"created": 0, "updated": 1}


def test_single_upsert_answers_201_when_created_and_200_when_updated(api: Api) -> None:
    made = api.rest("POST", "/rest/people?upsert=externalId", json={"externalId": "s-1"})
    assert made.status_code == 201, made.text
    matched = api.rest(
        "POST", "/rest/people?upsert=externalId", json={"externalId": "s-1", "nickname": "S"}
    )
    assert matched.status_code == 200, matched.text
    assert matched.json()["data"]["id"] == made.json()["data"]["id"]
    assert matched.json()["data"]["nickname"] == "S"


def test_bad_upserts_are_refused_and_change_nothing(api: Api) -> None:
    api.create("people", {"externalId": "b-1", "city": "Oslo"})
    body = api.bad("POST", "/rest/batch/people?upsert=nickname", json=[{"nickname": "n"}])
    assert "nickname is not a unique field" in body["message"]
    assert body["details"]["field"] == "nickname"
    body = api.bad("POST", "/rest/people?upsert=nope", json={"nickname": "n"})
    assert "nope" in body["message"]
    body = api.bad(
        "POST",
        "/rest/batch/people?upsert=externalId",
        json=[{"externalId": "b-1", "city": "Rome"}, {"nickname": "no key"}],
    )
    assert body["details"]["field"] == "[1].externalId"
    body = api.bad(
        "POST",
        "/rest/batch/people?upsert=externalId",
        json=[{"externalId": "b-2"}, {"externalId": "b-1"}, {"externalId": "b-2"}],
    )
    assert body["details"]["field"] == "[2].externalId"
    # A row that fails validation takes the whole batch with it.
    api.bad(
        "POST",
        "/rest/batch/people?upsert=externalId",
        json=[{"externalId": "b-1", "city": "Rome"}, {"externalId": "b-3", "badge": "x"}],
    )
    assert set(_names(api)) == {"b-1"}
    assert _names(api)["b-1"]["city"] == "Oslo"


def test_a_value_held_only_by_a_soft_deleted_record_is_a_409(api: Api) -> None:
    gone = api.create("people", {"externalId": "d-1"})
    api.ok("DELETE", f"/rest/people/{gone['id']}")
    body = api.bad(
        "POST",
        "/rest/batch/people?upsert=externalId",
        json=[{"externalId": "d-2"}, {"externalId": "d-1"}],
        status=409,
    )
    assert body["details"]["field"] == "[1].externalId"
    assert gone["id"] in body["message"]
    assert _names(api) == {}
    # Restored, it is matched.
    api.ok("PATCH", f"/rest/restore/people/{gone['id']}")
    answer = api.ok("POST", "/rest/people?upsert=externalId", json={"externalId": "d-1"})
    assert answer["data"]["id"] == gone["id"]


def test_a_member_cannot_upsert_over_another_members_record(client: httpx.Client, api: Api) -> None:
    sessions = []
    for _ in range(2):
        email = unique_email("member")
        graphql_data(
            client,
            api.session.access_token,
            "mutation($input: AddWorkspaceMemberInput!) { addWorkspaceMember(input: $input) "
            "{ id } }",
            {"input": {"email": email, "password": "member password"}},
        )
        sessions.append(login(client, email, "member password", api.session.workspace_id))
    alice, bob = (Api(client, session) for session in sessions)
    mine = alice.create("people", {"externalId": "m-1", "city": "Lima"})
    body = bob.bad("POST", "/rest/people?upsert=externalId", json={"externalId": "m-1"}, status=403)
    assert body["details"]["field"] == "externalId"
    assert alice.ok("GET", f"/rest/people/{mine['id']}")["data"]["city"] == "Lima"
    # Her own record she may upsert.
    again = alice.ok("POST", "/rest/people?upsert=externalId", json={"externalId": "m-1"})
    assert again["data"]["id"] == mine["id"]


def test_graphql_upsert_many_and_one(api: Api) -> None:
    ada = api.create("people", {"externalId": "g-1", "firstName": "Ada"})
    data = api.data(
        """mutation($data: [PersonCreateInput!]!) {
             upsertPeople(data: $data, matchOn: "externalId") { id externalId firstName } }""",
        {"data": [{"externalId": "g-1", "firstName": "Augusta"}, {"externalId": "g-2"}]},
    )
    rows = data["upsertPeople"]
    assert rows[0] == {"id": ada["id"], "externalId": "g-1", "firstName": "Augusta"}
    assert rows[1]["externalId"] == "g-2"
    assert rows[1]["id"] != ada["id"]
    one = api.data(
        """mutation { upsertPerson(data: {externalId: "g-2", city: "Bonn"}, matchOn: "externalId")
             { id city } }"""
    )
    assert one["upsertPerson"] == {"id": rows[1]["id"], "city": "Bonn"}
    error = api.error(
        """mutation { upsertPerson(data: {nickname: "x"}, matchOn: "nickname") { id } }"""
    )
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    assert "nickname" in error["message"]


def test_an_upsert_with_an_idempotency_key_replays(api: Api) -> None:
    key = f"key-{uuid.uuid4()}"
    headers = {**api.headers, "Idempotency-Key": key}
    body = [{"externalId": "i-1", "nickname": "first"}]
    path = "/rest/batch/people?upsert=externalId"
    first = api.http.post(path, json=body, headers=headers)
    assert first.status_code == 200, first.text
    api.ok("PATCH", f"/rest/people/{first.json()['data'][0]['id']}", json={"nickname": "later"})
    again = api.http.post(path, json=body, headers=headers)
    assert (again.status_code, again.content) == (200, first.content)
    assert _names(api)["i-1"]["nickname"] == "later"
