"""Search across objects (issue 22.2): REST GET /rest/search and GraphQL `search`.

A new custom object's record is found by a fragment of a new custom field, with an accent
difference and a typo, in the next request (no restart); exact prefixes rank above fuzzy
matches; `objects` narrows the search; a member sees only its own records and objects a role
cannot read are skipped; bad input is the documented error shape and changes nothing.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from crmstack.client import Session, graphql_data, login, unique_email
from tests.integration.api_helpers import Api

SEARCH = """query($q: String!, $objects: [String!], $first: Int, $after: String) {
  search(query: $q, objects: $objects, first: $first, after: $after) {
    edges { cursor node { object score matchedFields record { __typename %s } } }
    pageInfo { hasNextPage endCursor } } }"""
PEOPLE = SEARCH % "... on Person { id firstName }"
VESSELS = SEARCH % "... on Vessel { id name harbour } ... on Person { id firstName }"


@pytest.fixture
def api(client: httpx.Client) -> Api:
    return Api.signup(client)


def _search(api: Api, **params: Any) -> dict[str, Any]:
    body: dict[str, Any] = api.ok("GET", "/rest/search", params=params)
    return body


def _hits(api: Api, query: str, **params: Any) -> list[tuple[str, str]]:
    return [(hit["object"], hit["record"]["id"]) for hit in _search(api, q=query, **params)["data"]]


def _vessels(api: Api) -> str:
    """A new custom object with a new TEXT field (searchable by default); the field's id."""
    object_id = api.create_object("vessel", "vessels")
    field_id: str = api.create_field(object_id, "harbour", "TEXT")["id"]
    return field_id


def test_a_new_custom_field_is_searched_with_accents_and_typos(api: Api) -> None:
    field_id = _vessels(api)
    vessel = api.create("vessels", {"name": "Nordic Star", "harbour": "Kerguélen Ålesund"})
    api.create("vessels", {"name": "Other", "harbour": "Hamburg"})
    for query in ("alesund", "ÅLESUND", "guél", "kergelen", "Kerguelen Aalesund"):
        body = _search(api, q=query)
        assert [(h["object"], h["record"]["id"]) for h in body["data"]] == [
            ("vessel", vessel["id"])
        ], query
        hit = body["data"][0]
        assert hit["matchedFields"] == ["harbour"], query
        assert hit["record"]["harbour"] == "Kerguélen Ålesund"
        assert hit["score"] > 0
    data = api.data(VESSELS, {"q": "kergelen"})["search"]
    node = data["edges"][0]["node"]
    assert node["object"] == "vessel"
    assert node["record"] == {
        "__typename": "Vessel",
        "id": vessel["id"],
        "name": "Nordic Star",
        "harbour": "Kerguélen Ålesund",
    }
    # Turning the flag off takes the field out of search at once; the name still matches.
    updated = api.data(
        "mutation($id: UUID!) { updateField(input: {id: $id, isSearchable: false}) "
        "{ isSearchable } }",
        {"id": field_id},
        path="/metadata",
    )
    assert updated["updateField"]["isSearchable"] is False
    assert _hits(api, "alesund") == []
    assert _hits(api, "nordic") == [("vessel", vessel["id"])]


def test_the_search_text_follows_every_write(api: Api) -> None:
    """The search column is computed on every INSERT and UPDATE (a trigger): updates, upserts on
    either side of their conflict, a batch, and writes after the field was renamed."""
    field_id = _vessels(api)
    object_id = api.object_id("vessel")
    api.create_field(object_id, "code", "TEXT", isUnique=True)
    vessel = api.create("vessels", {"name": "Arctic Tern", "harbour": "Kerguélen"})
    assert _hits(api, "kerguelen") == [("vessel", vessel["id"])]
    api.ok("PATCH", f"/rest/vessels/{vessel['id']}", json={"harbour": "Tromsø"})
    assert _hits(api, "tromsø") == [("vessel", vessel["id"])]
    assert _hits(api, "kerguelen") == []
    # An update of another field leaves the text as it was.
    api.ok("PATCH", f"/rest/vessels/{vessel['id']}", json={"name": "Arctic Skua"})
    assert _hits(api, "tromsø skua") == [("vessel", vessel["id"])]
    assert _hits(api, "tern") == []

    inserted = api.ok(
        "POST", "/rest/vessels", 201, params={"upsert": "code"},
        json={"code": "V-1", "name": "Upsert", "harbour": "Valparaíso"},
    )["data"]  # fmt: skip
    assert _hits(api, "valparaiso") == [("vessel", inserted["id"])]
    api.ok(
        "POST", "/rest/vessels", params={"upsert": "code"},
        json={"code": "V-1", "name": "Upsert", "harbour": "Reykjavík"},
    )  # fmt: skip
    assert _hits(api, "reykjavik") == [("vessel", inserted["id"])]
    assert _hits(api, "valparaiso") == []

    batch = api.ok(
        "POST", "/rest/batch/vessels", 201,
        json=[{"name": f"Fleet {n}", "harbour": f"Ísafjörður {n}"} for n in range(3)],
    )["data"]  # fmt: skip
    assert {record_id for _, record_id in _hits(api, "isafjordur")} == {
        record["id"] for record in batch
    }

    # Renamed, the field keeps its text and every later write computes it from the new name.
    renamed = api.data(
        'mutation($id: UUID!) { updateField(input: {id: $id, name: "port"}) { name } }',
        {"id": field_id},
        path="/metadata",
    )
    assert renamed["updateField"]["name"] == "port"
    assert _hits(api, "tromsø") == [("vessel", vessel["id"])]
    api.ok("PATCH", f"/rest/vessels/{vessel['id']}", json={"port": "Hammerfest"})
    assert _hits(api, "hammerfest") == [("vessel", vessel["id"])]
    assert _hits(api, "tromsø") == []
    created = api.create("vessels", {"name": "After", "port": "Longyearbyen"})
    assert _hits(api, "longyearbyen") == [("vessel", created["id"])]


def test_exact_matches_rank_by_tier_and_typos_only_when_none_match(api: Api) -> None:
    typo = api.create("people", {"firstName": "Jean", "lastName": "Dupond"})
    exact = api.create("companies", {"name": "Dupont Industries"})
    word = api.create("people", {"firstName": "Marie", "lastName": "Dupont-Leroy"})
    inside = api.create("people", {"firstName": "Luc", "lastName": "Ledupont"})
    api.create("companies", {"name": "Unrelated"})
    body = _search(api, q="dupont")
    # Text start, then word start, then inside a word; the typo match (Dupond) is not looked
    # for, since records match every word exactly.
    assert [(h["object"], h["record"]["id"]) for h in body["data"]] == [
        ("company", exact["id"]),
        ("person", word["id"]),
        ("person", inside["id"]),
    ]
    scores = [h["score"] for h in body["data"]]
    assert scores == sorted(scores, reverse=True)
    assert scores[-1] > 1.5
    assert body["data"][1]["matchedFields"] == ["lastName"]
    assert _hits(api, "dupont", objects="people") == [
        ("person", word["id"]),
        ("person", inside["id"]),
    ]
    assert _hits(api, "dupont", objects="company,opportunities") == [("company", exact["id"])]
    # No record has "dupomt": typo matches, each scoring below any exact match.
    body = _search(api, q="dupomt")
    found = {(h["object"], h["record"]["id"]) for h in body["data"]}
    assert found == {("company", exact["id"]), ("person", word["id"]), ("person", typo["id"])}
    assert all(0 < h["score"] < 1.5 for h in body["data"])
    # Only a word that no record contains as typed is matched with a typo: "dupomt jean" finds
    # Jean Dupond, "dupont jean" nobody (both words are found as typed, never together).
    assert _hits(api, "dupomt jean") == [("person", typo["id"])]
    assert _hits(api, "dupont jean") == []
    # A deleted record is not found.
    api.ok("DELETE", f"/rest/companies/{exact['id']}")
    assert ("company", exact["id"]) not in _hits(api, "dupont")


def test_pages_follow_the_cursor(api: Api) -> None:
    made = {api.create("people", {"firstName": f"Zephyrine{n}"})["id"] for n in range(5)}
    seen: list[str] = []
    after = None
    for _ in range(5):
        params: dict[str, Any] = {"q": "zephyrine", "limit": 2}
        if after:
            params["after"] = after
        body = _search(api, **params)
        seen += [hit["record"]["id"] for hit in body["data"]]
        after = body["pageInfo"]["endCursor"]
        if not body["pageInfo"]["hasNextPage"]:
            break
    assert sorted(seen) == sorted(made)
    assert len(seen) == 5
    first = api.data(PEOPLE, {"q": "zephyrine", "first": 3})["search"]
    rest = api.data(PEOPLE, {"q": "zephyrine", "after": first["pageInfo"]["endCursor"]})["search"]
    ids = [e["node"]["record"]["id"] for e in first["edges"] + rest["edges"]]
    assert sorted(ids) == sorted(made)
    assert first["pageInfo"]["hasNextPage"]


def test_typo_tolerant_pages_follow_the_cursor(api: Api) -> None:
    made = {api.create("people", {"firstName": f"Zephyrine{n}"})["id"] for n in range(5)}
    seen: list[str] = []
    params: dict[str, Any] = {"q": "zephyrime", "limit": 2}
    for _ in range(5):
        body = _search(api, **params)
        assert all(hit["score"] < 1.5 for hit in body["data"])
        seen += [hit["record"]["id"] for hit in body["data"]]
        if not body["pageInfo"]["hasNextPage"]:
            break
        params["after"] = body["pageInfo"]["endCursor"]
    assert sorted(seen) == sorted(made)
    # Past the last exact match, a cursor does not turn to typo matches.
    exact = _search(api, q="zephyrine4")
    assert [hit["record"]["id"] for hit in exact["data"]] != []
    after = _search(api, q="zephyrine4", after=exact["pageInfo"]["endCursor"])
    assert after["data"] == []


def test_wildcards_are_literal_and_a_query_folding_to_nothing_finds_nothing(api: Api) -> None:
    rate = api.create("companies", {"name": "Rate 100% Sure"})
    api.create("companies", {"name": "Rate 1000 Units"})
    snake = api.create("companies", {"name": "snake_case Labs"})
    api.create("companies", {"name": "snakeXcase Labs"})
    assert _hits(api, "100%") == [("company", rate["id"])]
    assert _hits(api, "snake_case") == [("company", snake["id"])]
    assert _hits(api, "e_c") == [("company", snake["id"])]
    # A lone combining accent folds to nothing (accents are ignored): no match, not an error.
    assert _search(api, q="\u0301")["data"] == []
    # Many words: every one must match.
    assert _hits(api, "rate 100% sure rate sure 100") == [("company", rate["id"])]


def _member(api: Api, role_id: str | None = None) -> Api:
    email = unique_email("searcher")
    graphql_data(
        api.http,
        api.session.access_token,
        "mutation($input: AddWorkspaceMemberInput!) { addWorkspaceMember(input: $input) { id } }",
        {"input": {"email": email, "password": "member password", "roleId": role_id}},
    )
    session: Session = login(api.http, email, "member password", api.session.workspace_id)
    return Api(api.http, session)


def test_access_rules_are_those_of_lists(api: Api) -> None:
    theirs = api.create("people", {"firstName": "Quillon", "lastName": "Admin"})
    company = api.create("companies", {"name": "Quillon Partners"})
    member = _member(api)
    own = member.create("people", {"firstName": "Quillon", "lastName": "Member"})
    found = _hits(member, "quillon", objects="people")
    assert found == [("person", own["id"])]
    assert ("person", theirs["id"]) in _hits(api, "quillon")
    role = api.data(
        """mutation { createRole(input: {name: "People readers",
             permissions: [{object: "person", actions: [READ]}]}) { id } }"""
    )["createRole"]
    reader = _member(api, role["id"])
    hits = _hits(reader, "quillon")
    assert {obj for obj, _ in hits} == {"person"}
    assert ("company", company["id"]) not in hits
    assert _hits(reader, "quillon", objects="companies") == []


def test_bad_input_is_refused_in_the_error_shape(api: Api) -> None:
    api.create("people", {"firstName": "Valid"})
    for params, field in (
        ({}, "q"),
        ({"q": "   "}, "q"),
        ({"q": "x" * 201}, "q"),
        ({"q": "nul\x00byte"}, "q"),
        ({"q": "valid", "objects": "people,starships"}, "objects"),
        ({"q": "valid", "limit": "101"}, "limit"),
        ({"q": "valid", "limit": "0"}, "limit"),
        ({"q": "valid", "limit": "ten"}, "limit"),
        ({"q": "valid", "after": "not-a-cursor"}, "after"),
        ({"q": "valid", "sort": "score"}, "sort"),
    ):
        body = api.bad("GET", "/rest/search", params=params)
        assert body["details"]["field"] == field, (params, body)
    error = api.error(PEOPLE, {"q": "valid", "first": 101})
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    error = api.error(PEOPLE, {"q": ""})
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    assert _hits(api, "valid") != []
    unauthenticated = api.http.get("/rest/search", params={"q": "valid"})
    assert unauthenticated.status_code == 401
