"""Data models from WorkspaceSchema, their fingerprints, and the per-workspace cache."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from crm.common.v1 import common_pb2
from crm.events.v1 import events_pb2
from crm.metadata.v1 import metadata_pb2 as md
from crmkit.errors import NotFound
from gateway.datamodel.cache import DataModelCache, parse_announcement
from gateway.datamodel.model import DataModel, FieldType, RelationKind


def test_model_keeps_active_fields_and_resolves_relations(model: DataModel) -> None:
    person = model.object("people")
    assert person is model.object("person")
    assert person is not None
    assert person.field("retired") is None  # inactive
    assert [f.name for f in person.fields][:2] == ["id", "createdAt"]
    company = person.field("company")
    assert company is not None
    assert company.relation is RelationKind.MANY_TO_ONE
    assert company.target == "company"
    assert person.record_key("companyId") is company
    assert person.record_key("firstNameId") is None
    people = model.object("company").field("people")  # type: ignore[union-attr]
    assert people is not None
    assert people.is_one_to_many
    assert people.inverse == "company"
    name = model.object("company").field("name")  # type: ignore[union-attr]
    assert name is not None
    assert name.required_on_create
    stage = model.object("opportunity").field("stage")  # type: ignore[union-attr]
    assert stage is not None
    assert stage.type is FieldType.SELECT
    assert not stage.required_on_create  # it has a default
    assert stage.options[:2] == ("PROSPECTING", "QUALIFIED")


def test_fingerprint_depends_on_content_only(
    make_schema: Callable[..., md.WorkspaceSchema], make_pet: Callable[[], md.ObjectMetadata]
) -> None:
    first = DataModel.from_proto(make_schema(version=3, workspace_id="a"))
    second = DataModel.from_proto(make_schema(version=9, workspace_id="b"))
    assert first.fingerprint == second.fingerprint
    with_pet = DataModel.from_proto(make_schema(make_pet()))
    assert with_pet.fingerprint != first.fingerprint
    renamed = make_schema()
    renamed.objects[0].fields[-1].label = "Other label"
    assert DataModel.from_proto(renamed).fingerprint != first.fingerprint


def _principal(workspace: str = "ws-1") -> common_pb2.Principal:
    return common_pb2.Principal(workspace_id=workspace)


class Upstream:
    """Answers GetWorkspaceSchema like the metadata service (empty when nothing is newer)."""

    def __init__(self, schema: md.WorkspaceSchema) -> None:
        self.schema = schema
        self.calls: list[int] = []
        self.gate: asyncio.Event | None = None

    async def fetch(self, principal: common_pb2.Principal, known: int) -> md.WorkspaceSchema:
        self.calls.append(known)
        if self.gate is not None:
            await self.gate.wait()
        if known and known >= self.schema.version:
            return md.WorkspaceSchema(workspace_id=principal.workspace_id, version=known)
        return self.schema


async def test_cache_fetches_once_and_refreshes_on_announcement(
    make_schema: Callable[..., md.WorkspaceSchema], make_pet: Callable[[], md.ObjectMetadata]
) -> None:
    upstream = Upstream(make_schema(version=1))
    cache = DataModelCache(upstream.fetch)
    first = await cache.get(_principal())
    assert await cache.get(_principal()) is first
    assert upstream.calls == [0]
    cache.announce("ws-1", 1)  # a version we hold: nothing to do
    assert await cache.get(_principal()) is first
    assert upstream.calls == [0]
    upstream.schema = make_schema(make_pet(), version=2)
    cache.announce("ws-1", 2)
    second = await cache.get(_principal())
    assert second.version == 2
    assert second.object("pets") is not None
    assert upstream.calls == [0, 1]
    cache.announce("ws-1")  # version unknown: re-check, unchanged
    assert await cache.get(_principal()) is second
    assert upstream.calls == [0, 1, 2]


async def test_an_old_model_is_rechecked(
    make_schema: Callable[..., md.WorkspaceSchema],
) -> None:
    now = [100.0]
    upstream = Upstream(make_schema(version=1))
    cache = DataModelCache(upstream.fetch, max_age=60, clock=lambda: now[0])
    first = await cache.get(_principal())
    now[0] += 59
    assert await cache.get(_principal()) is first
    assert upstream.calls == [0]
    now[0] += 2  # an announcement may have been missed: one cheap check
    assert await cache.get(_principal()) is first
    assert upstream.calls == [0, 1]
    assert await cache.get(_principal()) is first
    assert upstream.calls == [0, 1]


async def test_concurrent_requests_share_one_fetch(
    make_schema: Callable[..., md.WorkspaceSchema],
) -> None:
    upstream = Upstream(make_schema(version=1))
    upstream.gate = asyncio.Event()
    cache = DataModelCache(upstream.fetch)
    waiting = [asyncio.create_task(cache.get(_principal())) for _ in range(20)]
    await asyncio.sleep(0)
    upstream.gate.set()
    models = await asyncio.gather(*waiting)
    assert len({id(m) for m in models}) == 1
    assert upstream.calls == [0]


async def test_an_unknown_object_rechecks_the_model_once(
    make_schema: Callable[..., md.WorkspaceSchema], make_pet: Callable[[], md.ObjectMetadata]
) -> None:
    upstream = Upstream(make_schema(version=1))
    cache = DataModelCache(upstream.fetch)
    await cache.get(_principal())
    upstream.schema = make_schema(make_pet(), version=5)  # created through another gateway
    model, pet = await cache.resolve_object(_principal(), "pets")
    assert pet.singular == "pet"
    assert model.version == 5
    with pytest.raises(NotFound) as caught:
        await cache.resolve_object(_principal(), "unicorns")
    assert caught.value.field == "object"
    assert upstream.calls == [0, 1, 5]


async def test_a_failed_fetch_is_raised_to_every_waiter(
    make_schema: Callable[..., md.WorkspaceSchema],
) -> None:
    async def failing(principal: common_pb2.Principal, known: int) -> md.WorkspaceSchema:
        await asyncio.sleep(0)
        raise NotFound("no workspace")

    cache = DataModelCache(failing)
    results = await asyncio.gather(
        *(cache.get(_principal()) for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(result, NotFound) for result in results)


def test_derived_values_are_shared_by_fingerprint_and_bounded(
    make_schema: Callable[..., md.WorkspaceSchema], make_pet: Callable[[], md.ObjectMetadata]
) -> None:
    async def never(principal: common_pb2.Principal, known: int) -> md.WorkspaceSchema:
        raise AssertionError("not called")

    cache = DataModelCache(never, max_derived=2)
    builds: list[str] = []

    def build(model: DataModel) -> Any:
        builds.append(model.workspace_id)
        return object()

    a = DataModel.from_proto(make_schema(workspace_id="a"))
    b = DataModel.from_proto(make_schema(workspace_id="b"))
    pets = DataModel.from_proto(make_schema(make_pet(), workspace_id="c"))
    assert cache.derived("x", a, build) is cache.derived("x", b, build)
    assert builds == ["a"]
    cache.derived("y", a, build)
    cache.derived("x", pets, build)  # evicts the least recently used
    cache.derived("x", a, build)
    assert builds == ["a", "a", "c", "a"]


def test_parse_announcement() -> None:
    subject = "crm.metadata.ws-1.changed"
    event = events_pb2.MetadataChanged(workspace_id="ws-1", version=42).SerializeToString()
    assert parse_announcement(subject, event) == ("ws-1", 42)
    assert parse_announcement(subject, orjson.dumps({"version": 7})) == ("ws-1", 7)
    assert parse_announcement(subject, b"") == ("ws-1", None)
    assert parse_announcement(subject, b"\xff\x00garbage") == ("ws-1", None)
    assert parse_announcement("crm.records.ws-1.person.created", b"") is None
