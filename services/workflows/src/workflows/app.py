"""serve() builds the workflows service's dependencies, injects them and runs until SIGTERM."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from crm.workflows.v1 import workflows_pb2, workflows_pb2_grpc
from crmkit import db
from crmkit.grpc_server import ServicerBinding, ServiceRuntime, run_service, service_name
from workflows.servicer import WorkflowServicer
from workflows.settings import WorkflowsSettings

SCHEMA = "workflows"


async def serve(settings: WorkflowsSettings) -> None:
    registry = CollectorRegistry()
    pool = await db.create_pool(
        settings.DATABASE_URL,
        min_size=settings.DB_POOL_MIN_SIZE,
        max_size=settings.DB_POOL_MAX_SIZE,
        application_name="workflows",
    )
    runtime = ServiceRuntime(
        bindings=[
            ServicerBinding(
                WorkflowServicer(),  # type: ignore[abstract]  # until its issue implements it
                workflows_pb2_grpc.add_WorkflowServiceServicer_to_server,
                service_name(workflows_pb2, "WorkflowService"),
            ),
        ],
        on_shutdown=[pool.close],
    )
    await run_service(settings, registry, runtime)


async def migrate(settings: WorkflowsSettings) -> None:
    await db.migrate(settings.DATABASE_URL, SCHEMA, "workflows")
