"""Per-workspace data models, refreshed when NATS announces a metadata change or when a request
names an object or field the cached model lacks; and what is derived from a model (GraphQL
schema, OpenAPI document) cached by the model's content fingerprint, so workspaces with the same
data model share one derived object.

Every swap is one dict assignment on the event loop, so a request sees either the old model or
the new one, never a mix.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from google.protobuf.message import DecodeError

from crm.common.v1 import common_pb2
from crm.events.v1 import events_pb2
from crm.metadata.v1 import metadata_pb2
from crmkit.errors import NotFound
from gateway.datamodel.model import DataModel, ObjectModel

log = logging.getLogger("gateway.datamodel")

T = TypeVar("T")
# Fetches a workspace's schema on behalf of a principal; known_version lets the service answer
# "unchanged" with an empty object list.
Fetch = Callable[[common_pb2.Principal, int], Awaitable[metadata_pb2.WorkspaceSchema]]


@dataclass
class _Entry:
    model: DataModel
    checked_at: float
    stale: bool = False


class DataModelCache:
    def __init__(
        self,
        fetch: Fetch,
        *,
        max_derived: int = 256,
        max_age: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._max_age = max_age
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._generation: dict[str, int] = {}
        self._inflight: dict[str, tuple[int, asyncio.Future[DataModel]]] = {}
        self._derived: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._max_derived = max_derived
        self.fetches = 0  # upstream schema fetches, for tests and metrics

    def cached(self, workspace_id: str) -> DataModel | None:
        entry = self._entries.get(workspace_id)
        return entry.model if entry is not None else None

    async def get(self, principal: common_pb2.Principal) -> DataModel:
        """The workspace's model: the cached one unless a change was announced since (or it
        was last checked more than max_age ago)."""
        entry = self._entries.get(principal.workspace_id)
        if (
            entry is not None
            and not entry.stale
            and self._clock() - entry.checked_at < self._max_age
        ):
            return entry.model
        return await self.refresh(principal)

    async def refresh(self, principal: common_pb2.Principal) -> DataModel:
        """Asks the metadata service whether the model changed (one call shared by concurrent
        callers) and returns the current model."""
        workspace_id = principal.workspace_id
        generation = self._generation.get(workspace_id, 0)
        inflight = self._inflight.get(workspace_id)
        if inflight is not None and inflight[0] == generation:
            return await asyncio.shield(inflight[1])
        future: asyncio.Future[DataModel] = asyncio.get_running_loop().create_future()
        self._inflight[workspace_id] = (generation, future)
        try:
            model = await self._load(principal, generation)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: joiners re-raise it, nobody else must log it
            raise
        else:
            future.set_result(model)
            return model
        finally:
            if self._inflight.get(workspace_id, (None, None))[1] is future:
                del self._inflight[workspace_id]

    async def _load(self, principal: common_pb2.Principal, generation: int) -> DataModel:
        workspace_id = principal.workspace_id
        entry = self._entries.get(workspace_id)
        known = entry.model.version if entry is not None else 0
        self.fetches += 1
        started = self._clock()
        schema = await self._fetch(principal, known)
        if entry is not None and (not schema.objects or schema.version <= entry.model.version):
            model = entry.model  # unchanged (or an older replica answered): keep ours
        else:
            model = DataModel.from_proto(schema, workspace_id=workspace_id)
        fresh = self._generation.get(workspace_id, 0) == generation
        self._entries[workspace_id] = _Entry(model, started, stale=not fresh)
        if entry is None or entry.model.version != model.version:
            log.info(
                "data model loaded",
                extra={"workspace": workspace_id, "version": model.version},
            )
        return model

    def announce(self, workspace_id: str, version: int | None = None) -> None:
        """A change was announced: the next request re-checks (unless we hold that version)."""
        entry = self._entries.get(workspace_id)
        if entry is not None and version is not None and entry.model.version >= version:
            return
        self._generation[workspace_id] = self._generation.get(workspace_id, 0) + 1
        if entry is not None:
            entry.stale = True

    async def resolve_object(
        self, principal: common_pb2.Principal, name: str
    ) -> tuple[DataModel, ObjectModel]:
        """The object named `name` (singular or plural), re-checking the model once on a miss."""
        model = await self.get(principal)
        found = model.object(name)
        if found is None:
            model = await self.refresh(principal)
            found = model.object(name)
        if found is None:
            raise NotFound(f"unknown object `{name}`", field="object")
        return model, found

    def derived(self, kind: str, model: DataModel, build: Callable[[DataModel], T]) -> T:
        """`build(model)`, computed once per (kind, fingerprint) and kept in a bounded LRU."""
        key = (kind, model.fingerprint)
        if key in self._derived:
            self._derived.move_to_end(key)
            value: T = self._derived[key]
            return value
        value = build(model)
        self._derived[key] = value
        while len(self._derived) > self._max_derived:
            self._derived.popitem(last=False)
        return value


def parse_announcement(subject: str, payload: bytes) -> tuple[str, int | None] | None:
    """(workspace id, version) from `crm.metadata.<workspaceId>.changed` and its payload: a
    `crm.events.v1.MetadataChanged` (what the metadata service publishes), JSON
    `{"version": n}`, or anything else meaning "changed, version unknown"."""
    parts = subject.split(".")
    if len(parts) != 4 or parts[0] != "crm" or parts[1] != "metadata" or parts[3] != "changed":
        return None
    try:
        event = events_pb2.MetadataChanged.FromString(payload)
    except DecodeError:
        event = None
    if event is not None and event.workspace_id == parts[2] and event.version > 0:
        return parts[2], event.version
    version: int | None = None
    try:
        body = orjson.loads(payload) if payload else None
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict):
        raw = body.get("version")
        if isinstance(raw, int | str) and str(raw).isdecimal():
            version = int(raw)
    elif isinstance(body, int) and not isinstance(body, bool):
        version = body
    return parts[2], version
