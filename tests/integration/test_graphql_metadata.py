"""Metadata operations (one schema definition on /metadata and /graphql), and custom objects and
fields usable through REST and GraphQL in the very next request, on any gateway."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from tests.integration.api_helpers import Api


@pytest.fixture
def api(client: httpx.Client) -> Api:
    return Api.signup(client)


OBJECTS = (
    "{ objects { totalCount edges { node { id nameSingular namePlural isCustom isActive } } } }"
)


@pytest.mark.parametrize("path", ["/metadata", "/graphql"])
def test_objects_and_fields_on_both_endpoints(api: Api, path: str) -> None:
    objects = api.data(OBJECTS, path=path)["objects"]
    names = {edge["node"]["nameSingular"]: edge["node"] for edge in objects["edges"]}
    assert {"person", "company", "opportunity", "activity", "task"} <= set(names)
    assert objects["totalCount"] == len(objects["edges"])
    assert names["person"]["namePlural"] == "people"
    assert names["person"]["isCustom"] is False
    fields = api.data(
        """query($id: UUID!) { fields(filter: {objectMetadataId: {eq: $id}}) {
             totalCount edges { node { name label type isNullable objectMetadataId
               defaultValue options { value } } } } }""",
        {"id": names["opportunity"]["id"]},
        path=path,
    )["fields"]
    by_name = {edge["node"]["name"]: edge["node"] for edge in fields["edges"]}
    assert by_name["name"]["isNullable"] is False
    assert by_name["stage"]["type"] == "SELECT"
    assert by_name["stage"]["defaultValue"] == "PROSPECTING"
    assert [o["value"] for o in by_name["stage"]["options"]][:2] == ["PROSPECTING", "QUALIFIED"]
    assert {edge["node"]["objectMetadataId"] for edge in fields["edges"]} == {
        names["opportunity"]["id"]
    }


def test_metadata_endpoint_serves_no_records(api: Api) -> None:
    error = api.error("{ people { totalCount } }", path="/metadata")
    assert error["extensions"]["code"] == "BAD_USER_INPUT"


def test_custom_object_and_fields_are_usable_in_the_next_request(api: Api) -> None:
    object_id = api.create_object("pet", "pets")
    api.create_field(object_id, "weight", "NUMBER")
    api.create_field(
        object_id,
        "species",
        "SELECT",
        options=[{"value": "DOG", "label": "Dog"}, {"value": "CAT", "label": "Cat"}],
    )
    api.create_field(object_id, "adopted", "DATE")
    api.create_field(
        object_id, "tags", "MULTI_SELECT", options=[{"value": "CUTE"}, {"value": "OLD"}]
    )
    api.create_field(
        object_id,
        "keeper",
        "RELATION",
        relation={"targetObjectName": "person", "inverseFieldName": "pets"},
    )

    ada = api.create("people", {"firstName": "Ada"})
    rex = api.create(
        "pets",
        {"name": "Rex", "weight": 12.5, "species": "DOG", "tags": ["CUTE"]},
    )
    api.ok("PATCH", f"/rest/pets/{rex['id']}", json={"keeper": {"connect": ada["id"]}})
    listed = api.ok("GET", "/rest/pets?filter[species][eq]=DOG&filter[weight][gt]=10")
    assert [pet["name"] for pet in listed["data"]] == ["Rex"]
    created = api.data(
        'mutation { createPet(data: {name: "Tom", species: CAT, tags: [OLD, CUTE]}) '
        "{ id species tags } }"
    )["createPet"]
    assert created["species"] == "CAT"
    assert created["tags"] == ["OLD", "CUTE"]
    data = api.data(
        """{ pets(filter: {tags: {contains: [CUTE]}}, orderBy: {name: ASC}) {
             edges { node { name keeper { firstName } } } }
           person: people(filter: {firstName: {eq: "Ada"}}) {
             edges { node { pets { edges { node { name } } } } } } }"""
    )
    assert [edge["node"]["name"] for edge in data["pets"]["edges"]] == ["Rex", "Tom"]
    assert data["pets"]["edges"][0]["node"]["keeper"] == {"firstName": "Ada"}
    ada_pets = data["person"]["edges"][0]["node"]["pets"]["edges"]
    assert [edge["node"]["name"] for edge in ada_pets] == ["Rex"]
    document = api.ok("GET", "/rest/open-api")
    assert "/rest/pets" in document["paths"]
    assert "species" in document["components"]["schemas"]["Pet"]["properties"]


def test_update_and_deactivate(api: Api) -> None:
    object_id = api.create_object("gadget", "gadgets")
    field = api.create_field(object_id, "color", "TEXT")
    api.create("gadgets", {"name": "G1", "color": "red"})
    renamed = api.data(
        """mutation($id: UUID!) { updateField(input: {id: $id, label: "Colour",
             description: "Paint"}) { id label description } }""",
        {"id": field["id"]},
        path="/metadata",
    )["updateField"]
    assert renamed == {"id": field["id"], "label": "Colour", "description": "Paint"}
    relabeled = api.data(
        """mutation($id: UUID!) { updateObject(input: {id: $id, labelPlural: "Devices"}) {
             id labelPlural } }""",
        {"id": object_id},
        path="/graphql",
    )["updateObject"]
    assert relabeled["labelPlural"] == "Devices"
    removed = api.data(
        "mutation($id: UUID!) { deleteField(id: $id) { id isActive } }",
        {"id": field["id"]},
        path="/metadata",
    )["deleteField"]
    assert removed == {"id": field["id"], "isActive": False}
    # Gone from both APIs in the very next request; the data is kept (reactivation brings it back).
    assert api.bad("GET", "/rest/gadgets?filter[color][eq]=red")["details"]["field"] == "color"
    error = api.error("{ gadgets { edges { node { color } } } }")
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    api.data(
        "mutation($id: UUID!) { updateField(input: {id: $id, isActive: true}) { id } }",
        {"id": field["id"]},
        path="/metadata",
    )
    back = api.data("{ gadgets { edges { node { color } } } }")["gadgets"]["edges"]
    assert back == [{"node": {"color": "red"}}]


@pytest.mark.parametrize(
    ("mutation", "variables", "field"),
    [
        (
            "mutation($i: CreateObjectInput!) { createObject(input: $i) { id } }",
            {"i": {"nameSingular": "Bad Name", "namePlural": "badNames"}},
            "nameSingular",
        ),
        (
            "mutation($i: CreateObjectInput!) { createObject(input: $i) { id } }",
            {"i": {"nameSingular": "person", "namePlural": "persons"}},
            "nameSingular",
        ),
        (
            "mutation($i: CreateObjectInput!) { createObject(input: $i) { id } }",
            {"i": {"nameSingular": "batch", "namePlural": "batches"}},
            "nameSingular",
        ),
        (
            "mutation($i: CreateObjectInput!) { createObject(input: $i) { id } }",
            {"i": {"namePlural": "things"}},
            "nameSingular",
        ),
    ],
)
def test_bad_definitions_name_the_field_and_change_nothing(
    api: Api, mutation: str, variables: dict[str, object], field: str
) -> None:
    before = api.data(OBJECTS, path="/metadata")["objects"]["totalCount"]
    error = api.error(mutation, variables, path="/metadata")
    assert error["extensions"] == {"code": "BAD_USER_INPUT", "field": field}, error
    assert error["path"] == ["createObject"]
    assert api.data(OBJECTS, path="/metadata")["objects"]["totalCount"] == before


def test_bad_field_definitions(api: Api) -> None:
    person = api.object_id("person")
    error = api.error(
        """mutation($i: CreateFieldInput!) { createField(input: $i) { id } }""",
        {"i": {"objectMetadataId": person, "name": "firstName", "type": "TEXT"}},
        path="/metadata",
    )
    assert error["extensions"] == {"code": "BAD_USER_INPUT", "field": "name"}
    error = api.error(
        """mutation($i: CreateFieldInput!) { createField(input: $i) { id } }""",
        {"i": {"objectMetadataId": person, "name": "level", "type": "LEVEL"}},
        path="/metadata",
    )
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    assert error["extensions"]["field"] == "type"
    api.bad("GET", "/rest/people?filter[level][eq]=1")


def test_a_custom_object_is_usable_at_once_through_another_gateway(
    api: Api, extra_gateway: Callable[[dict[str, str]], str]
) -> None:
    other_url = extra_gateway({})
    with httpx.Client(base_url=other_url, timeout=30) as other_http:
        other = Api(other_http, api.session)
        # The other gateway caches this workspace's model before the change...
        assert other.ok("GET", "/rest/people")["data"] == []
        assert other.data("{ people { totalCount } }")["people"]["totalCount"] == 0
        object_id = api.create_object("rocket", "rockets")
        api.create_field(object_id, "thrust", "NUMBER")
        # ...and serves the new object in the very next request, through REST and GraphQL.
        created = other.create("rockets", {"name": "Saturn", "thrust": 35})
        assert created["thrust"] == 35
        data = other.data("{ rockets { edges { node { name thrust } } } }")
        assert data["rockets"]["edges"] == [{"node": {"name": "Saturn", "thrust": 35}}]
        # A field added later shows up without a miss too: the NATS announcement refreshes it.
        api.create_field(object_id, "stages", "NUMBER")
        deadline = time.monotonic() + 10
        while True:
            body = other.graphql("{ rockets { edges { node { stages } } } }")
            if not body.get("errors") or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert not body.get("errors"), body


def test_a_field_change_waits_for_its_migration_beyond_the_call_timeout(
    api: Api, extra_gateway: Callable[[dict[str, str]], str]
) -> None:
    # A searchable field is part of the object's search column, which is added anew (filled
    # by a table rewrite), so adding one rewrites the table: with 10,000 people that takes
    # about a second, longer than this gateway's GRPC_CALL_TIMEOUT. The change waits for its
    # migration (METADATA_CHANGE_TIMEOUT) and answers what happened, instead of a timeout for a
    # change rolled back or applied.
    for start in range(0, 10_000, 1_000):
        rows = [
            {"firstName": f"First{i}", "lastName": f"Last{i}", "email": f"p{i}@example.com"}
            for i in range(start, start + 1_000)
        ]
        api.ok("POST", "/rest/batch/people", status=201, json=rows)
    slow_url = extra_gateway({"GRPC_CALL_TIMEOUT": "0.2"})
    with httpx.Client(base_url=slow_url, timeout=180) as slow_http:
        slow = Api(slow_http, api.session)
        field = slow.data(
            """mutation($o: UUID!) { createField(input: {objectMetadataId: $o, name: "memo",
                 label: "Memo", type: TEXT, isSearchable: true}) { name isSearchable } }""",
            {"o": api.object_id("person")},
        )["createField"]
        assert field == {"name": "memo", "isSearchable": True}
        created = slow.create("people", {"firstName": "X", "memo": "Überweisung"})
    found = api.ok("GET", "/rest/search", params={"q": "uberweis", "objects": "people"})
    assert [hit["record"]["id"] for hit in found["data"]] == [created["id"]]
