"""Keeping data models current: fetching from MetadataService, and following the NATS
announcements `crm.metadata.<workspaceId>.changed` published on every metadata change."""

from __future__ import annotations

import logging

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from crm.common.v1 import common_pb2
from crm.metadata.v1 import metadata_pb2
from crmkit.messaging import METADATA_SUBJECT_PREFIX
from crmkit.principal import PrincipalCodec
from gateway.datamodel.cache import DataModelCache, Fetch, parse_announcement
from gateway.rpc import call
from gateway.upstreams import Upstreams

log = logging.getLogger("gateway.datamodel")

ANNOUNCEMENTS = f"{METADATA_SUBJECT_PREFIX}.*.changed"


def schema_fetcher(upstreams: Upstreams, principals: PrincipalCodec) -> Fetch:
    async def fetch(
        principal: common_pb2.Principal, known_version: int
    ) -> metadata_pb2.WorkspaceSchema:
        request = metadata_pb2.GetWorkspaceSchemaRequest(
            workspace_id=principal.workspace_id, known_version=known_version
        )
        schema: metadata_pb2.WorkspaceSchema = await call(
            upstreams.metadata.GetWorkspaceSchema, request, principals.metadata(principal)
        )
        return schema

    return fetch


async def follow_announcements(nats: NatsClient, cache: DataModelCache) -> Subscription:
    """Marks a workspace's model stale whenever its change is announced (core NATS: every
    gateway replica hears every announcement)."""

    async def on_message(message: Msg) -> None:
        parsed = parse_announcement(message.subject, message.data)
        if parsed is None:
            return
        workspace_id, version = parsed
        cache.announce(workspace_id, version)
        log.debug("metadata change announced", extra={"workspace": workspace_id})

    return await nats.subscribe(ANNOUNCEMENTS, cb=on_message)
