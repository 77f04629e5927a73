"""The workspace schema builder: names, collisions with static parts, extension hook, and the
endpoint re-checking a stale model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
import strawberry
from starlette.applications import Starlette

from crm.common.v1 import common_pb2
from crm.metadata.v1 import metadata_pb2 as md
from crm.records.v1 import records_pb2
from gateway.datamodel.model import DataModel
from gateway.graphql import endpoint as endpoint_module
from gateway.graphql.builder import StaticNames, build_workspace_schema
from gateway.graphql.endpoint import WorkspaceSchemas, workspace_graphql_endpoint
from gateway.graphql.parts import GeneratedTypes, SchemaPart
from gateway.graphql.schema import build_static_schema

Parts = tuple[SchemaPart, ...]


def _static(parts: Parts) -> StaticNames:
    return StaticNames.of(build_static_schema(parts))


def _type_names(schema: strawberry.Schema) -> set[str]:
    return set(schema._schema.type_map)


def test_names_follow_the_spec(model: DataModel, schema_parts: Parts) -> None:
    built = build_workspace_schema(model, schema_parts, _static(schema_parts))
    graphql = built.schema._schema
    assert graphql.query_type is not None
    assert graphql.mutation_type is not None
    queries = set(graphql.query_type.fields)
    mutations = set(graphql.mutation_type.fields)
    for singular, plural in (("Person", "People"), ("Company", "Companies"), ("Pet", "Pets")):
        lower = plural[0].lower() + plural[1:]
        assert {lower, singular[0].lower() + singular[1:], f"{lower}Aggregate"} <= queries
        assert {
            f"create{singular}",
            f"create{plural}",
            f"update{singular}",
            f"update{plural}",
            f"delete{singular}",
            f"restore{singular}",
        } <= mutations
    assert {"objects", "fields", "apiVersion", "currentUser"} <= queries
    assert {"createObject", "createField", "updateObject", "updateField", "deleteField"} <= (
        mutations
    )
    assert built.skipped == ()
    sdl = built.schema.as_str()
    assert "name: String!" in sdl.split("input CompanyCreateInput {")[1].split("}")[0]
    assert "stage: OpportunityStageEnum" in sdl
    assert "species: String" in sdl  # an option that is not a GraphQL name: served as String
    assert "from: String" in sdl  # a Python keyword as a field name


def _custom(singular: str, plural: str) -> md.ObjectMetadata:
    return md.ObjectMetadata(
        id=f"o-{singular}",
        name_singular=singular,
        name_plural=plural,
        is_active=True,
        fields=[md.FieldMetadata(name="title", type=md.FIELD_TYPE_TEXT, is_active=True)],
    )


def test_generated_names_avoid_static_ones(
    make_schema: Callable[..., md.WorkspaceSchema], schema_parts: Parts
) -> None:
    model = DataModel.from_proto(make_schema(_custom("pageInfo", "pageInfos")))
    built = build_workspace_schema(model, schema_parts, _static(schema_parts))
    names = _type_names(built.schema)
    assert {"PageInfo", "PageInfoRecord", "PageInfoRecordConnection"} <= names
    assert built.skipped == ()
    # An operation name a static part holds is kept by the part (metadata reserves such names;
    # the builder still never lets one object break the whole schema).
    clash = DataModel.from_proto(make_schema(_custom("object", "objects")))
    built = build_workspace_schema(clash, schema_parts, _static(schema_parts))
    assert {"objects", "object", "createObject"} <= set(built.skipped)
    graphql = built.schema._schema
    assert graphql.query_type is not None
    assert str(graphql.query_type.fields["objects"].type) == "ObjectConnection!"
    assert "objectsAggregate" in graphql.query_type.fields


def test_parts_can_build_on_generated_types(model: DataModel, schema_parts: Parts) -> None:
    seen: list[GeneratedTypes] = []

    def for_model(generated: GeneratedTypes) -> SchemaPart:
        seen.append(generated)
        person = generated.records["person"]
        subscription = strawberry.type(
            type(
                "PersonSubscription",
                (),
                {
                    "__annotations__": {},
                    "person_created": strawberry.subscription(
                        resolver=_typed_generator(person), name="personCreated"
                    ),
                },
            )
        )
        return SchemaPart(name="events", subscription=subscription)

    parts = (*schema_parts, SchemaPart(name="events", for_model=for_model))
    built = build_workspace_schema(model, parts, _static(schema_parts))
    assert seen[0].model is model
    subscription = built.schema._schema.subscription_type
    assert subscription is not None
    assert str(subscription.fields["personCreated"].type) == "Person!"


def _typed_generator(record_type: Any) -> Any:
    from collections.abc import AsyncGenerator

    async def person_created() -> AsyncGenerator[Any, None]:  # pragma: no cover
        yield {}

    person_created.__annotations__["return"] = AsyncGenerator[record_type, None]
    return person_created


@pytest.fixture
def graphql_client(
    fakes: Any, monkeypatch: pytest.MonkeyPatch, schema_parts: Parts
) -> httpx.AsyncClient:
    async def authenticate(connection: Any, *, admit: bool = True) -> common_pb2.Principal:
        return fakes.principal  # type: ignore[no-any-return]

    async def admit_request(connection: Any, principal: Any, calls: int = 1) -> None:
        return None

    monkeypatch.setattr(endpoint_module, "authenticate", authenticate)
    monkeypatch.setattr(endpoint_module, "admit_request", admit_request)
    schemas = WorkspaceSchemas(schema_parts, _static(schema_parts))
    app = Starlette()
    app.add_route("/graphql", workspace_graphql_endpoint(schemas, development=False), ["POST"])
    app.state.gateway = fakes.state
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")


async def test_a_request_naming_an_unknown_object_rechecks_the_model(
    fakes: Any,
    graphql_client: httpx.AsyncClient,
    make_schema: Callable[..., md.WorkspaceSchema],
    make_pet: Callable[[], md.ObjectMetadata],
) -> None:
    fakes.metadata.responses["GetWorkspaceSchema"] = lambda request: make_schema(version=1)
    fakes.records.responses["ListRecords"] = records_pb2.ListRecordsResponse(
        records_json=b"[]", page_info=common_pb2.PageInfo()
    )
    response = await graphql_client.post("/graphql", json={"query": "{ people { totalCount } }"})
    assert response.json()["data"] == {"people": {"totalCount": 0}}
    # A custom object appears (created through another gateway; no announcement yet).
    fakes.metadata.responses["GetWorkspaceSchema"] = lambda request: make_schema(
        make_pet(), version=2
    )
    response = await graphql_client.post("/graphql", json={"query": "{ pets { totalCount } }"})
    assert response.json()["data"] == {"pets": {"totalCount": 0}}
    assert response.json()["extensions"]["cost"]["requestedQueryCost"] == 50
    assert [r.known_version for r in fakes.metadata.named("GetWorkspaceSchema")] == [0, 1]
    # A name that exists nowhere: one cheap re-check, then the validation error.
    response = await graphql_client.post("/graphql", json={"query": "{ unicorns { totalCount } }"})
    body = orjson.loads(response.content)
    assert body["data"] is None
    assert body["errors"][0]["extensions"] == {"code": "BAD_USER_INPUT", "field": "unicorns"}
    assert body["errors"][0]["path"] == ["unicorns"]
    assert len(fakes.metadata.named("GetWorkspaceSchema")) == 3
