"""One long-lived gRPC channel per upstream service, and the stubs the gateway calls."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

import grpc

from crm.identity.v1 import identity_pb2_grpc
from crm.metadata.v1 import metadata_pb2_grpc
from crm.records.v1 import records_pb2_grpc
from crm.webhooks.v1 import webhooks_pb2_grpc
from crm.workflows.v1 import workflows_pb2_grpc
from crmkit.grpc_client import STREAMING_OPTIONS, open_channel
from gateway.settings import GatewaySettings


@dataclass(frozen=True)
class Upstreams:
    channels: Mapping[str, grpc.aio.Channel]
    auth: identity_pb2_grpc.AuthServiceStub
    workspaces: identity_pb2_grpc.WorkspaceServiceStub
    roles: identity_pb2_grpc.RoleServiceStub
    credentials: identity_pb2_grpc.CredentialServiceStub
    oauth: identity_pb2_grpc.OAuthServiceStub
    metadata: metadata_pb2_grpc.MetadataServiceStub
    records: records_pb2_grpc.RecordsServiceStub
    imports: records_pb2_grpc.ImportServiceStub
    event_interest: records_pb2_grpc.EventInterestServiceStub
    # Exports stream on a channel of their own to records, with a fixed receive window
    # (STREAMING_OPTIONS); not in `channels`, which are the health-checked upstreams.
    exports_channel: grpc.aio.Channel
    exports: records_pb2_grpc.RecordsServiceStub
    webhooks: webhooks_pb2_grpc.WebhookServiceStub
    workflows: workflows_pb2_grpc.WorkflowServiceStub

    @classmethod
    def open(cls, settings: GatewaySettings) -> Upstreams:
        timeout, keepalive = settings.GRPC_CALL_TIMEOUT, settings.GRPC_KEEPALIVE_TIME
        # Unary calls go as frames over long-lived streams (crmkit.multiplex_client).
        channels = {
            "identity": open_channel(settings.IDENTITY_ADDR, timeout, keepalive, multiplexed=True),
            "metadata": open_channel(settings.METADATA_ADDR, timeout, keepalive, multiplexed=True),
            "records": open_channel(settings.RECORDS_ADDR, timeout, keepalive, multiplexed=True),
            "webhooks": open_channel(settings.WEBHOOKS_ADDR, timeout, keepalive, multiplexed=True),
            "workflows": open_channel(
                settings.WORKFLOWS_ADDR, timeout, keepalive, multiplexed=True
            ),
        }
        identity = channels["identity"]
        exports = open_channel(
            settings.RECORDS_ADDR, timeout, keepalive, extra_options=STREAMING_OPTIONS
        )
        return cls(
            channels=channels,
            auth=identity_pb2_grpc.AuthServiceStub(identity),
            workspaces=identity_pb2_grpc.WorkspaceServiceStub(identity),
            roles=identity_pb2_grpc.RoleServiceStub(identity),
            credentials=identity_pb2_grpc.CredentialServiceStub(identity),
            oauth=identity_pb2_grpc.OAuthServiceStub(identity),
            metadata=metadata_pb2_grpc.MetadataServiceStub(channels["metadata"]),
            records=records_pb2_grpc.RecordsServiceStub(channels["records"]),
            event_interest=records_pb2_grpc.EventInterestServiceStub(channels["records"]),
            imports=records_pb2_grpc.ImportServiceStub(channels["records"]),
            exports_channel=exports,
            exports=records_pb2_grpc.RecordsServiceStub(exports),
            webhooks=webhooks_pb2_grpc.WebhookServiceStub(channels["webhooks"]),
            workflows=workflows_pb2_grpc.WorkflowServiceStub(channels["workflows"]),
        )

    async def close(self) -> None:
        channels = [*self.channels.values(), self.exports_channel]
        await asyncio.gather(*(channel.close() for channel in channels))
