"""serve() builds the metadata service's dependencies, injects them and runs until SIGTERM."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from crm.metadata.v1 import metadata_pb2, metadata_pb2_grpc
from crm.records.v1 import records_pb2_grpc
from crmkit import db, messaging
from crmkit.grpc_client import open_channel
from crmkit.grpc_server import ServicerBinding, ServiceRuntime, run_service, service_name
from crmkit.metrics import observe_pools
from crmkit.principal import PrincipalCodec
from metadata.changes import ChangeRunner
from metadata.metrics import MetadataMetrics
from metadata.reconciler import Reconciler
from metadata.servicer import MetadataServicer
from metadata.settings import MetadataSettings

SCHEMA = "metadata"


async def serve(settings: MetadataSettings) -> None:
    registry = CollectorRegistry()
    pool = await db.create_pool(
        settings.DATABASE_URL,
        min_size=settings.DB_POOL_MIN_SIZE,
        max_size=settings.DB_POOL_MAX_SIZE,
        application_name="metadata",
    )
    observe_pools(registry, {"metadata": pool})
    nats = await messaging.connect(settings.NATS_URL, "metadata")
    channel = open_channel(
        settings.RECORDS_ADDR,
        settings.GRPC_CALL_TIMEOUT,
        settings.GRPC_KEEPALIVE_TIME,
        multiplexed=True,
    )
    records = records_pb2_grpc.RecordsServiceStub(channel)
    principals = PrincipalCodec(settings.APP_SECRET)
    metrics = MetadataMetrics.create(registry)
    changes = ChangeRunner(
        pool,
        records,
        principals,
        nats,
        metrics,
        migrate_timeout=settings.METADATA_MIGRATE_TIMEOUT,
    )
    reconciler = Reconciler(
        pool,
        records,
        changes,
        settings.METADATA_RECONCILE_INTERVAL,
        settings.METADATA_RECONCILE_BATCH,
    )
    await reconciler.listen(nats)

    async def close_channel() -> None:
        await channel.close()

    runtime = ServiceRuntime(
        bindings=[
            ServicerBinding(
                MetadataServicer(pool, principals, changes, reconciler),
                metadata_pb2_grpc.add_MetadataServiceServicer_to_server,
                service_name(metadata_pb2, "MetadataService"),
            ),
        ],
        background=[reconciler.run_forever],
        on_shutdown=[close_channel, nats.drain, pool.close],
    )
    await run_service(settings, registry, runtime)


async def migrate(settings: MetadataSettings) -> None:
    await db.migrate(settings.DATABASE_URL, SCHEMA, "metadata")
