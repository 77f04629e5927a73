"""serve() builds the workflows service's dependencies, injects them and runs until SIGTERM."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from prometheus_client import CollectorRegistry

from crm.identity.v1 import identity_pb2_grpc
from crm.metadata.v1 import metadata_pb2_grpc
from crm.records.v1 import records_pb2_grpc
from crm.workflows.v1 import workflows_pb2, workflows_pb2_grpc
from crmkit import db, messaging
from crmkit.authors import AuthorAccess
from crmkit.event_interest import WORKFLOWS, InterestHolder
from crmkit.grpc_client import open_channel
from crmkit.grpc_server import ServicerBinding, ServiceRuntime, run_service, service_name
from crmkit.metrics import observe_pools
from crmkit.outbound import OutboundPolicy, WorkspaceSessions
from crmkit.principal import PrincipalCodec
from crmkit.workflow_origin import WorkflowOrigin
from workflows import secrets, store
from workflows.execution import USER_AGENT, Executor
from workflows.intake import Intake
from workflows.metrics import WorkflowsMetrics
from workflows.runner import Runner
from workflows.scheduler import Scheduler
from workflows.servicer import WorkflowServicer
from workflows.settings import WorkflowsSettings

SCHEMA = "workflows"


async def serve(settings: WorkflowsSettings) -> None:
    registry = CollectorRegistry()
    metrics = WorkflowsMetrics.create(registry)
    pool = await db.create_pool(
        settings.DATABASE_URL,
        min_size=settings.DB_POOL_MIN_SIZE,
        max_size=settings.DB_POOL_MAX_SIZE,
        application_name="workflows",
    )
    # Claims and attempt outcomes may be lost in a database crash without losing a run (the
    # lease ends, the attempt repeats: at least once), so they skip waiting for the WAL flush.
    # Event intake, ticks and the API use the durable pool: an event is acknowledged after its
    # runs are stored.
    run_pool = await db.create_pool(
        settings.DATABASE_URL,
        min_size=1,
        max_size=4,
        application_name="workflows-runner",
        session_settings={"synchronous_commit": "off"},
        reset_session=False,
    )
    observe_pools(registry, {"workflows": pool, "workflows-runner": run_pool})
    nats = await messaging.connect(settings.NATS_URL, "workflows")
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
    records = records_pb2_grpc.RecordsServiceStub(records_channel)
    principals = PrincipalCodec(settings.APP_SECRET)
    box = secrets.action_box(settings.APP_SECRET)
    await store.seal_saved_before_secrets(pool, box)
    policy = OutboundPolicy(allow_private=settings.WEBHOOK_ALLOW_PRIVATE_TARGETS)
    http = WorkspaceSessions(
        policy,
        limit=settings.WORKFLOW_MAX_CONCURRENCY,
        keepalive_timeout=30.0,
        user_agent=USER_AGENT,
    )
    executor = Executor(
        http,
        settings.WORKFLOW_TIMEOUT,
        records,
        principals,
        WorkflowOrigin(settings.APP_SECRET),
        metrics,
        box,
    )
    interest = InterestHolder(
        WORKFLOWS,
        pool,
        records_pb2_grpc.EventInterestServiceStub(records_channel),
        principals,
        listens_sql=store.LISTENS,
        listening_sql=store.LISTENING,
    )
    background: list[Callable[[], Coroutine[Any, Any, None]]] = [interest.run]
    if settings.WORKFLOW_RUNNER_ENABLED:
        authors = AuthorAccess(identity_pb2_grpc.AuthServiceStub(identity_channel), principals)
        runner = Runner(settings, run_pool, executor, metrics, authors)
        intake = Intake(settings, nats, pool, records, principals, metrics, runner.wake, authors)
        scheduler = Scheduler(pool, metrics, runner.wake)
        background += [intake.run, scheduler.run, runner.run]
    servicer = WorkflowServicer(
        pool,
        principals,
        metadata_pb2_grpc.MetadataServiceStub(metadata_channel),
        records,
        policy,
        executor,
        metrics,
        float(settings.WORKFLOW_MIN_SCHEDULE_INTERVAL),
        box,
        interest,
    )

    async def close_channels() -> None:
        await metadata_channel.close()
        await records_channel.close()
        await identity_channel.close()

    runtime = ServiceRuntime(
        bindings=[
            ServicerBinding(
                servicer,
                workflows_pb2_grpc.add_WorkflowServiceServicer_to_server,
                service_name(workflows_pb2, "WorkflowService"),
            ),
        ],
        background=background,
        on_shutdown=[nats.drain, http.close, close_channels, run_pool.close, pool.close],
    )
    await run_service(settings, registry, runtime)


async def migrate(settings: WorkflowsSettings) -> None:
    await db.migrate(settings.DATABASE_URL, SCHEMA, "workflows")
