"""serve() builds the records service's dependencies, injects them and runs until SIGTERM."""

from __future__ import annotations

from functools import partial

import asyncpg
from prometheus_client import CollectorRegistry

from crm.records.v1 import records_pb2, records_pb2_grpc
from crmkit import db, messaging
from crmkit.grpc_server import ServicerBinding, ServiceRuntime, run_service, service_name
from crmkit.metrics import observe_pools
from crmkit.principal import PrincipalCodec
from records import counts, history_retention, idempotency, migrator, outbox, search
from records.cache import SchemaCache
from records.event_interest import EventInterestServicer
from records.import_servicer import ImportServicer
from records.import_worker import ImportWorker
from records.metrics import RecordsMetrics
from records.relay import OutboxRelay
from records.servicer import RecordsServicer
from records.settings import RecordsSettings

SCHEMA = "records"


async def serve(settings: RecordsSettings) -> None:
    registry = CollectorRegistry()
    timeout = {"statement_timeout": f"{round(settings.DB_STATEMENT_TIMEOUT * 1000)}"}
    pool = await db.create_pool(
        settings.DATABASE_URL,
        min_size=settings.DB_POOL_MIN_SIZE,
        max_size=settings.DB_POOL_MAX_SIZE,
        application_name="records",
        statement_cache_size=settings.DB_STATEMENT_CACHE_SIZE,
        # Requests never change session state (no SET, LISTEN, cursors or session advisory
        # locks; the relay has its own connection): skip the reset round trip per call.
        reset_session=False,
        session_settings={
            **timeout,
            **outbox.write_settings(settings.RECORD_EVENTS_PUBLISH),
            **counts.SESSION_SETTINGS,
        },
    )
    # Searches get sessions of their own, carrying their settings (no transaction per search to
    # set them: two round trips fewer). A search of three or more words is a statement over
    # asyncpg's default 15 KB (one scan per object, each with its record JSON); uncached, each
    # search parsed and planned it again, 2x the time of the search (docs/data-model.md).
    search_pool = await db.create_pool(
        settings.DATABASE_URL,
        min_size=1,
        max_size=max(1, settings.DB_POOL_MAX_SIZE // 2),
        application_name="records-search",
        statement_cache_size=settings.DB_STATEMENT_CACHE_SIZE,
        max_cacheable_statement_size=64 * 1024,
        reset_session=False,
        session_settings={**timeout, **search.SESSION_SETTINGS},
    )
    observe_pools(registry, {"records": pool, "records-search": search_pool})
    nats = await messaging.connect(settings.NATS_URL, "records")
    metrics = RecordsMetrics.create(registry)
    cache = SchemaCache(pool, metrics, capacity=settings.SCHEMA_CACHE_SIZE)
    await cache.listen(nats)
    servicer = RecordsServicer(
        pool,
        cache,
        PrincipalCodec(settings.APP_SECRET),
        metrics,
        nats,
        count_cap=settings.RECORDS_COUNT_CAP,
        idempotency_ttl=float(settings.IDEMPOTENCY_KEY_TTL),
        search_pool=search_pool,
        create_group_in_flight=settings.CREATE_GROUP_IN_FLIGHT,
    )
    relay = OutboxRelay(settings, nats, metrics)
    imports = ImportServicer(
        pool,
        cache,
        PrincipalCodec(settings.APP_SECRET),
        max_concurrent=settings.IMPORT_MAX_CONCURRENT_PER_WORKSPACE,
    )
    import_worker = ImportWorker(
        settings.DATABASE_URL,
        pool,
        cache,
        batch_size=settings.IMPORT_BATCH_SIZE,
        poll_seconds=settings.IMPORT_POLL_INTERVAL,
        server_settings=outbox.write_settings(settings.RECORD_EVENTS_PUBLISH),
    )
    runtime = ServiceRuntime(
        bindings=[
            ServicerBinding(
                servicer,
                records_pb2_grpc.add_RecordsServiceServicer_to_server,
                service_name(records_pb2, "RecordsService"),
            ),
            ServicerBinding(
                imports,
                records_pb2_grpc.add_ImportServiceServicer_to_server,
                service_name(records_pb2, "ImportService"),
            ),
            ServicerBinding(
                EventInterestServicer(pool, PrincipalCodec(settings.APP_SECRET)),
                records_pb2_grpc.add_EventInterestServiceServicer_to_server,
                service_name(records_pb2, "EventInterestService"),
            ),
        ],
        background=[
            relay.run,
            partial(idempotency.prune_forever, pool),
            partial(history_retention.prune_forever, pool, settings, metrics),
            import_worker.run,
        ],
        on_shutdown=[nats.drain, pool.close, search_pool.close],
    )
    await run_service(settings, registry, runtime)


async def migrate(settings: RecordsSettings) -> None:
    await db.migrate(settings.DATABASE_URL, SCHEMA, "records")
    connection = await asyncpg.connect(settings.DATABASE_URL)
    try:
        await migrator.replan_all(connection)
    finally:
        await connection.close()
