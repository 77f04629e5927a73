"""serve() builds the webhooks service's dependencies, injects them and runs until SIGTERM."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from prometheus_client import CollectorRegistry

from crm.identity.v1 import identity_pb2_grpc
from crm.metadata.v1 import metadata_pb2_grpc
from crm.records.v1 import records_pb2_grpc
from crm.webhooks.v1 import webhooks_pb2, webhooks_pb2_grpc
from crmkit import db, messaging
from crmkit.authors import AuthorAccess
from crmkit.event_interest import WEBHOOKS, InterestHolder
from crmkit.grpc_client import open_channel
from crmkit.grpc_server import ServicerBinding, ServiceRuntime, run_service, service_name
from crmkit.metrics import observe_pools
from crmkit.outbound import OutboundPolicy, WorkspaceSessions
from crmkit.principal import PrincipalCodec
from webhooks import store
from webhooks.dispatcher import Dispatcher
from webhooks.intake import Intake
from webhooks.metrics import WebhooksMetrics
from webhooks.omitted import RecordReader
from webhooks.sealing import SecretBox
from webhooks.sender import Sender
from webhooks.servicer import WebhookServicer
from webhooks.settings import WebhooksSettings

SCHEMA = "webhooks"


async def serve(settings: WebhooksSettings) -> None:
    registry = CollectorRegistry()
    metrics = WebhooksMetrics.create(registry)
    pool = await db.create_pool(
        settings.DATABASE_URL,
        min_size=settings.DB_POOL_MIN_SIZE,
        max_size=settings.DB_POOL_MAX_SIZE,
        application_name="webhooks",
        reset_session=False,  # nothing here changes session state: skip the reset round trip
    )
    # Claims and attempt outcomes may be lost in a database crash without losing an event (the
    # lease ends, the attempt repeats: at least once), so they skip waiting for the WAL flush.
    # Event intake and the API use the durable pool: an event is acknowledged after its rows.
    dispatch_pool = await db.create_pool(
        settings.DATABASE_URL,
        min_size=1,
        max_size=4,
        application_name="webhooks-dispatch",
        session_settings={"synchronous_commit": "off"},
        reset_session=False,
    )
    observe_pools(registry, {"webhooks": pool, "webhooks-dispatch": dispatch_pool})
    nats = await messaging.connect(settings.NATS_URL, "webhooks")
    metadata_channel = open_channel(
        settings.METADATA_ADDR,
        settings.GRPC_CALL_TIMEOUT,
        settings.GRPC_KEEPALIVE_TIME,
        multiplexed=True,
    )
    records_channel = open_channel(
        settings.RECORDS_ADDR,
        settings.GRPC_CALL_TIMEOUT,
        settings.GRPC_KEEPALIVE_TIME,
        multiplexed=True,
    )
    identity_channel = open_channel(
        settings.IDENTITY_ADDR,
        settings.GRPC_CALL_TIMEOUT,
        settings.GRPC_KEEPALIVE_TIME,
        multiplexed=True,
    )
    principals = PrincipalCodec(settings.APP_SECRET)
    policy = OutboundPolicy(allow_private=settings.WEBHOOK_ALLOW_PRIVATE_TARGETS)
    box = SecretBox(settings.APP_SECRET)
    http = WorkspaceSessions(
        policy,
        limit=settings.WEBHOOK_MAX_CONCURRENCY,
        keepalive_timeout=30.0,
        user_agent="crm-webhooks/1",
    )
    interest = InterestHolder(
        WEBHOOKS,
        pool,
        records_pb2_grpc.EventInterestServiceStub(records_channel),
        principals,
        listens_sql=store.LISTENS,
        listening_sql=store.LISTENING,
    )
    background: list[Callable[[], Coroutine[Any, Any, None]]] = [interest.run]
    on_redelivery: Callable[[], None] = lambda: None  # noqa: E731
    if settings.WEBHOOK_DELIVERER_ENABLED:
        records = RecordReader(records_pb2_grpc.RecordsServiceStub(records_channel), principals)
        sender = Sender(http, settings.WEBHOOK_TIMEOUT)
        authors = AuthorAccess(identity_pb2_grpc.AuthServiceStub(identity_channel), principals)
        dispatcher = Dispatcher(settings, dispatch_pool, sender, box, metrics, records, authors)
        intake = Intake(settings, nats, pool, metrics, dispatcher)
        background += [intake.run, dispatcher.run]
        on_redelivery = dispatcher.wake
    servicer = WebhookServicer(
        pool,
        principals,
        box,
        metadata_pb2_grpc.MetadataServiceStub(metadata_channel),
        policy,
        interest,
        on_redelivery=on_redelivery,
    )

    async def close_channel() -> None:
        await metadata_channel.close()
        await records_channel.close()
        await identity_channel.close()

    runtime = ServiceRuntime(
        bindings=[
            ServicerBinding(
                servicer,
                webhooks_pb2_grpc.add_WebhookServiceServicer_to_server,
                service_name(webhooks_pb2, "WebhookService"),
            ),
        ],
        background=background,
        on_shutdown=[nats.drain, http.close, close_channel, dispatch_pool.close, pool.close],
    )
    await run_service(settings, registry, runtime)


async def migrate(settings: WebhooksSettings) -> None:
    await db.migrate(settings.DATABASE_URL, SCHEMA, "webhooks")
