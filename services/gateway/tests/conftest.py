"""Fixtures of the gateway's unit tests: a workspace's data model as MetadataService sends it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from crm.common.v1 import common_pb2
from crm.metadata.v1 import metadata_pb2 as md
from crmkit.principal import PrincipalCodec
from gateway.datamodel.cache import DataModelCache
from gateway.datamodel.model import DataModel
from gateway.graphql.builder import StaticNames
from gateway.graphql.context import GraphQLContext
from gateway.graphql.endpoint import WorkspaceSchemas, graphql_response
from gateway.graphql.identity import IDENTITY_PART
from gateway.graphql.metadata_ops import METADATA_PART
from gateway.graphql.parts import SchemaPart
from gateway.graphql.schema import build_static_schema
from gateway.graphql.version import VERSION_PART
from gateway.graphql.webhooks import WEBHOOKS_PART
from gateway.graphql.workflows import WORKFLOWS_PART
from gateway.settings import GatewaySettings
from gateway.subscriptions.fields import SUBSCRIPTIONS_PART

T = md.FieldType


def _field(
    name: str,
    field_type: int,
    *,
    nullable: bool = True,
    system: bool = False,
    options: tuple[str, ...] = (),
    relation: md.RelationSettings | None = None,
    default: bytes = b"",
    active: bool = True,
) -> md.FieldMetadata:
    return md.FieldMetadata(
        id=f"f-{name}",
        name=name,
        label=name.capitalize(),
        type=field_type,  # type: ignore[arg-type]
        is_nullable=nullable,
        is_system=system,
        is_active=active,
        default_value_json=default,
        options=[
            md.SelectOption(value=v, label=v.title(), position=i) for i, v in enumerate(options)
        ],
        relation=relation,
    )


def _system() -> list[md.FieldMetadata]:
    return [
        _field("id", T.FIELD_TYPE_UUID, nullable=False, system=True),
        _field("createdAt", T.FIELD_TYPE_DATE_TIME, nullable=False, system=True),
        _field("updatedAt", T.FIELD_TYPE_DATE_TIME, nullable=False, system=True),
        _field("deletedAt", T.FIELD_TYPE_DATE_TIME, system=True),
        _field("ownerId", T.FIELD_TYPE_UUID, system=True),
    ]


def _m2o(name: str, target: str, inverse: str) -> md.FieldMetadata:
    return _field(
        name,
        T.FIELD_TYPE_RELATION,
        relation=md.RelationSettings(
            kind=md.RELATION_KIND_MANY_TO_ONE, target_object_name=target, inverse_field_name=inverse
        ),
    )


def _o2m(name: str, target: str, inverse: str) -> md.FieldMetadata:
    return _field(
        name,
        T.FIELD_TYPE_RELATION,
        relation=md.RelationSettings(
            kind=md.RELATION_KIND_ONE_TO_MANY, target_object_name=target, inverse_field_name=inverse
        ),
    )


def _object(
    singular: str, plural: str, fields: list[md.FieldMetadata], *, custom: bool = False
) -> md.ObjectMetadata:
    return md.ObjectMetadata(
        id=f"o-{singular}",
        workspace_id="ws-1",
        name_singular=singular,
        name_plural=plural,
        label_singular=singular.capitalize(),
        label_plural=plural.capitalize(),
        is_custom=custom,
        is_active=True,
        fields=[*_system(), *fields],
    )


def standard_objects() -> list[md.ObjectMetadata]:
    return [
        _object(
            "person",
            "people",
            [
                _field("firstName", T.FIELD_TYPE_TEXT),
                _field("lastName", T.FIELD_TYPE_TEXT),
                _field("email", T.FIELD_TYPE_EMAIL),
                _field("phone", T.FIELD_TYPE_PHONE),
                _field("jobTitle", T.FIELD_TYPE_TEXT),
                _field("birthday", T.FIELD_TYPE_DATE),
                _field("tags", T.FIELD_TYPE_MULTI_SELECT, options=("LEAD", "PARTNER")),
                _field("profile", T.FIELD_TYPE_RAW_JSON),
                _field("vip", T.FIELD_TYPE_BOOLEAN),
                _field("retired", T.FIELD_TYPE_BOOLEAN, active=False),
                _m2o("company", "company", "people"),
                _o2m("opportunities", "opportunity", "pointOfContact"),
                _o2m("activities", "activity", "person"),
            ],
        ),
        _object(
            "company",
            "companies",
            [
                _field("name", T.FIELD_TYPE_TEXT, nullable=False),
                _field("website", T.FIELD_TYPE_LINK),
                _field("employees", T.FIELD_TYPE_NUMBER),
                _o2m("people", "person", "company"),
                _o2m("opportunities", "opportunity", "company"),
                _o2m("activities", "activity", "company"),
            ],
        ),
        _object(
            "opportunity",
            "opportunities",
            [
                _field("name", T.FIELD_TYPE_TEXT, nullable=False),
                _field("amount", T.FIELD_TYPE_CURRENCY),
                _field(
                    "stage",
                    T.FIELD_TYPE_SELECT,
                    nullable=False,
                    default=b'"PROSPECTING"',
                    options=("PROSPECTING", "QUALIFIED", "WON", "LOST"),
                ),
                _field("closeDate", T.FIELD_TYPE_DATE),
                _m2o("company", "company", "opportunities"),
                _m2o("pointOfContact", "person", "opportunities"),
            ],
        ),
        _object(
            "activity",
            "activities",
            [
                _field("title", T.FIELD_TYPE_TEXT, nullable=False),
                _field("type", T.FIELD_TYPE_SELECT, options=("CALL", "EMAIL", "MEETING", "NOTE")),
                _field("completedAt", T.FIELD_TYPE_DATE_TIME),
                _m2o("person", "person", "activities"),
                _m2o("company", "company", "activities"),
            ],
        ),
    ]


def workspace_schema(
    *extra: md.ObjectMetadata, version: int = 1, workspace_id: str = "ws-1"
) -> md.WorkspaceSchema:
    return md.WorkspaceSchema(
        workspace_id=workspace_id, version=version, objects=[*standard_objects(), *extra]
    )


def pet_object() -> md.ObjectMetadata:
    """A custom object."""
    return _object(
        "pet",
        "pets",
        [
            _field("name", T.FIELD_TYPE_TEXT, nullable=False),
            _field("species", T.FIELD_TYPE_SELECT, options=("DOG", "CAT", "1NVALID")),
            _field("weight", T.FIELD_TYPE_NUMBER),
            _field("from", T.FIELD_TYPE_TEXT),
        ],
        custom=True,
    )


@pytest.fixture
def schema_proto() -> md.WorkspaceSchema:
    return workspace_schema()


@pytest.fixture
def model() -> DataModel:
    return DataModel.from_proto(workspace_schema(pet_object()))


@pytest.fixture
def make_schema() -> Callable[..., md.WorkspaceSchema]:
    return workspace_schema


@pytest.fixture
def make_pet() -> Callable[[], md.ObjectMetadata]:
    return pet_object


# -- fakes of the upstream stubs (unit tests isolate the gateway's translation logic) ----------


class FakeStub:
    """Records every call; answers from `responses[method]` (a proto, a callable taking the
    request, or an exception to raise)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.responses: dict[str, Any] = {}

    def named(self, method: str) -> list[Any]:
        return [request for name, request in self.calls if name == method]

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)

        async def handler(request: Any, metadata: Any = None) -> Any:
            self.calls.append((method, request))
            response = self.responses.get(method)
            if isinstance(response, Exception):
                raise response
            if callable(response):
                return response(request)
            if response is None:
                raise AssertionError(f"unexpected call {method}")
            return response

        return handler


@dataclass
class FakeState:
    upstreams: Any
    principals: PrincipalCodec
    models: DataModelCache
    # The defaults (of the GraphQL limits, for one), without the addresses a real start needs.
    settings: GatewaySettings = field(default_factory=GatewaySettings.model_construct)


@dataclass
class Fakes:
    records: FakeStub
    metadata: FakeStub
    state: FakeState
    principal: common_pb2.Principal


@pytest.fixture
def fakes() -> Fakes:
    records, metadata = FakeStub(), FakeStub()
    schema = workspace_schema(pet_object())
    metadata.responses["GetWorkspaceSchema"] = lambda request: schema

    async def fetch(principal: common_pb2.Principal, known: int) -> md.WorkspaceSchema:
        result: md.WorkspaceSchema = await metadata.GetWorkspaceSchema(
            md.GetWorkspaceSchemaRequest(workspace_id=principal.workspace_id, known_version=known)
        )
        return result

    state = FakeState(
        upstreams=SimpleNamespace(records=records, metadata=metadata),
        principals=PrincipalCodec("unit-test-secret"),
        models=DataModelCache(fetch),
    )
    principal = common_pb2.Principal(workspace_id="ws-1", user_id="u-1")
    return Fakes(records, metadata, state, principal)


GraphQLRunner = Callable[..., Awaitable[dict[str, Any]]]


@pytest.fixture
def schema_parts() -> tuple[SchemaPart, ...]:
    """Every feature's schema part, as the app lists them."""
    return (
        VERSION_PART,
        IDENTITY_PART,
        METADATA_PART,
        WEBHOOKS_PART,
        WORKFLOWS_PART,
        SUBSCRIPTIONS_PART,
    )


@pytest.fixture
def run_graphql(fakes: Fakes, schema_parts: tuple[SchemaPart, ...]) -> GraphQLRunner:
    """Executes a query against the fixture workspace's schema as /graphql would and returns
    the response body."""
    schemas = WorkspaceSchemas(schema_parts, StaticNames.of(build_static_schema(schema_parts)))

    async def run(query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        model = await fakes.state.models.get(fakes.principal)
        built = schemas.for_model(fakes.state, model)  # type: ignore[arg-type]
        context = GraphQLContext(
            None,  # type: ignore[arg-type]
            fakes.state,  # type: ignore[arg-type]
            fakes.principal,
            model=model,
        )
        result = await built.schema.execute(query, variable_values=variables, context_value=context)
        body: dict[str, Any] = orjson.loads(bytes(graphql_response(result, query).body))
        return body

    return run


ConnectionHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
StartServer = Callable[[ConnectionHandler], Awaitable[int]]


@pytest.fixture
async def loopback_server() -> AsyncIterator[StartServer]:
    """Starts a TCP server on 127.0.0.1 serving each connection with the handler given and
    returns its port; every server started is closed after the test."""
    servers: list[asyncio.Server] = []

    async def start(handler: ConnectionHandler) -> int:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(server)
        port: int = server.sockets[0].getsockname()[1]
        return port

    yield start
    for server in servers:
        server.close()
