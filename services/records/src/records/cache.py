"""Compiled workspace models, cached per workspace and keyed by metadata version.

A request that carries a newer `metadata_version` than the cached one reloads it; a
`crm.metadata.<workspaceId>.changed` announcement on NATS drops older entries on every replica.
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from crm.events.v1 import events_pb2
from crm.metadata.v1 import metadata_pb2 as md
from crmkit.errors import NotFound
from crmkit.messaging import METADATA_SUBJECT_PREFIX
from records.metrics import RecordsMetrics
from records.model import WorkspaceModel

log = logging.getLogger("records.cache")


class SchemaCache:
    def __init__(self, pool: Any, metrics: RecordsMetrics, capacity: int = 2000) -> None:
        self._pool = pool
        self._metrics = metrics
        self._capacity = capacity
        self._models: OrderedDict[str, WorkspaceModel] = OrderedDict()

    async def get(self, workspace_id: str, min_version: int = 0) -> WorkspaceModel:
        model = self._models.get(workspace_id)
        if model is not None and model.version >= min_version:
            self._models.move_to_end(workspace_id)
            return model
        loaded = await self._load(workspace_id)
        if loaded is None:
            raise NotFound("this workspace has no data model yet", field="object")
        self.put(loaded)
        return loaded

    def put(self, model: WorkspaceModel) -> None:
        current = self._models.get(model.workspace_id)
        if current is not None and current.version > model.version:
            return
        self._models[model.workspace_id] = model
        self._models.move_to_end(model.workspace_id)
        while len(self._models) > self._capacity:
            self._models.popitem(last=False)

    def invalidate(self, workspace_id: str, version: int) -> None:
        current = self._models.get(workspace_id)
        if current is not None and current.version < version:
            del self._models[workspace_id]

    async def _load(self, workspace_id: str) -> WorkspaceModel | None:
        try:
            key = str(uuid.UUID(workspace_id))
        except ValueError:
            return None
        payload = await self._pool.fetchval(
            "SELECT schema_proto FROM records.workspace_schemas WHERE workspace_id = $1", key
        )
        if payload is None:
            return None
        self._metrics.schema_loads.inc()
        return WorkspaceModel.from_proto(md.WorkspaceSchema.FromString(payload))

    async def listen(self, nats: NatsClient) -> None:
        """Drop cached models when metadata announces a newer version."""

        async def on_change(message: Msg) -> None:
            try:
                changed = events_pb2.MetadataChanged.FromString(message.data)
            except Exception:  # a malformed announcement must not stop the listener
                log.warning("ignored malformed metadata announcement")
                return
            self.invalidate(changed.workspace_id, changed.version)

        await nats.subscribe(f"{METADATA_SUBJECT_PREFIX}.*.changed", cb=on_change)
