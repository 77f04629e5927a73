"""Workflow operations (permission WORKFLOWS): a schema part served on /graphql and /metadata,
resolved by the workflows service over gRPC.

`workflows` answers a plain list (creation order; `first`, default 50, at most 200, and
`after`, the id of the last workflow seen); `workflowRuns` a connection, newest first.
Filters and headers are JSON values (the JSON scalar); the trigger, action and run enums are
GraphQL enums.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import Enum
from typing import Any, cast

import orjson
import strawberry
from google.protobuf.timestamp_pb2 import Timestamp
from strawberry.scalars import JSON

from crm.workflows.v1 import workflows_pb2 as wf
from gateway.graphql.context import GraphQLContext
from gateway.graphql.page_info import PageInfo
from gateway.graphql.parts import SchemaPart
from gateway.pagination import page_request

Info = strawberry.Info[GraphQLContext, None]


def _time(message: Any, name: str) -> datetime | None:
    if not message.HasField(name):
        return None
    stamp: Timestamp = getattr(message, name)
    return stamp.ToDatetime(tzinfo=UTC)


def _json_or_none(raw: bytes) -> Any:
    return orjson.loads(raw) if raw else None


def _json(value: Any) -> JSON:
    return cast(JSON, value)


@strawberry.enum(description="configured: saved, not running; active: runs on its trigger.")
class WorkflowStatus(Enum):
    CONFIGURED = "CONFIGURED"
    ACTIVE = "ACTIVE"


@strawberry.enum(description="What starts a run.")
class WorkflowTriggerType(Enum):
    RECORD_CREATED = "RECORD_CREATED"
    RECORD_UPDATED = "RECORD_UPDATED"
    SCHEDULED = "SCHEDULED"


@strawberry.enum(description="What a run does.")
class WorkflowActionType(Enum):
    SEND_HTTP_REQUEST = "SEND_HTTP_REQUEST"


@strawberry.enum(description="Where a run stands.")
class WorkflowRunStatus(Enum):
    QUEUED = "QUEUED"  # waiting for its first or next attempt
    RUNNING = "RUNNING"  # being sent
    SUCCEEDED = "SUCCEEDED"  # a 2xx answer came in time
    FAILED = "FAILED"  # every attempt used, or it cannot be sent


_STATUS = {
    WorkflowStatus.CONFIGURED: wf.WORKFLOW_STATUS_CONFIGURED,
    WorkflowStatus.ACTIVE: wf.WORKFLOW_STATUS_ACTIVE,
}
_STATUS_OF = {value: key for key, value in _STATUS.items()}
_TRIGGER = {
    WorkflowTriggerType.RECORD_CREATED: wf.TRIGGER_TYPE_RECORD_CREATED,
    WorkflowTriggerType.RECORD_UPDATED: wf.TRIGGER_TYPE_RECORD_UPDATED,
    WorkflowTriggerType.SCHEDULED: wf.TRIGGER_TYPE_SCHEDULED,
}
_TRIGGER_OF = {value: key for key, value in _TRIGGER.items()}
_RUN_STATUS = {
    WorkflowRunStatus.QUEUED: wf.RUN_STATUS_QUEUED,
    WorkflowRunStatus.RUNNING: wf.RUN_STATUS_RUNNING,
    WorkflowRunStatus.SUCCEEDED: wf.RUN_STATUS_SUCCEEDED,
    WorkflowRunStatus.FAILED: wf.RUN_STATUS_FAILED,
}
_RUN_STATUS_OF = {value: key for key, value in _RUN_STATUS.items()}


@strawberry.type(description="When a workflow runs.")
class WorkflowTrigger:
    type: WorkflowTriggerType
    object: str | None = strawberry.field(description="Singular object name (record triggers).")
    filter: JSON | None = strawberry.field(
        description='The API filter language, e.g. {"stage": {"eq": "QUALIFIED"}}.'
    )
    fields: list[str] = strawberry.field(
        description="RECORD_UPDATED: runs only when one of these fields changed."
    )
    cron: str | None = strawberry.field(description="SCHEDULED: the cron expression.")
    timezone: str | None = strawberry.field(description="SCHEDULED: IANA time zone.")


@strawberry.type(
    description="The HTTP request a run sends; {{field}} templates. Secrets are write-only: "
    "header values (but Content-Type and Accept) and secret query parameters read as ***."
)
class WorkflowAction:
    type: WorkflowActionType
    method: str
    url: str
    headers: JSON
    body: str
    secret_params: list[str] = strawberry.field(
        description="Query parameters of the URL whose values are secret."
    )


@strawberry.type(description="A workflow: a trigger and an HTTP action.")
class Workflow:
    id: uuid.UUID
    name: str
    status: WorkflowStatus
    trigger: WorkflowTrigger
    action: WorkflowAction
    created_at: datetime
    updated_at: datetime
    last_run_at: datetime | None = strawberry.field(description="When a run was last queued.")
    next_run_at: datetime | None = strawberry.field(
        description="SCHEDULED and active: the next tick."
    )

    @classmethod
    def of(cls, message: wf.Workflow) -> Workflow:
        trigger = message.trigger
        scheduled = trigger.type == wf.TRIGGER_TYPE_SCHEDULED
        return cls(
            id=uuid.UUID(message.id),
            name=message.name,
            status=_STATUS_OF[message.status],
            trigger=WorkflowTrigger(
                type=_TRIGGER_OF[trigger.type],
                object=None if scheduled else trigger.object,
                filter=_json_or_none(trigger.filter_json),
                fields=list(trigger.fields),
                cron=trigger.cron if scheduled else None,
                timezone=trigger.timezone if scheduled else None,
            ),
            action=WorkflowAction(
                type=WorkflowActionType.SEND_HTTP_REQUEST,
                method=message.action.method,
                url=message.action.url,
                headers=_json(_json_or_none(message.action.headers_json) or {}),
                body=message.action.body,
                secret_params=list(message.action.secret_params),
            ),
            created_at=message.created_at.ToDatetime(tzinfo=UTC),
            updated_at=message.updated_at.ToDatetime(tzinfo=UTC),
            last_run_at=_time(message, "last_run_at"),
            next_run_at=_time(message, "next_run_at"),
        )


@strawberry.type(description="The request a run sent (secret header values masked as ***).")
class WorkflowRequest:
    method: str
    url: str
    headers: JSON
    body: str


@strawberry.type(description="One execution of a workflow's action.")
class WorkflowRun:
    id: uuid.UUID
    workflow_id: uuid.UUID
    status: WorkflowRunStatus
    trigger_event: JSON = strawberry.field(
        description="The record event (with record and previousRecord) or the tick."
    )
    request: WorkflowRequest | None = strawberry.field(
        description="The rendered request of the last attempt; null before the first."
    )
    response_status: int | None
    response_excerpt: str | None = strawberry.field(description="The answer's first 200 bytes.")
    duration_ms: int | None = strawberry.field(description="The last attempt's duration.")
    attempts: int
    error: str | None
    is_test: bool = strawberry.field(description="Made by testWorkflow.")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def of(cls, run: wf.WorkflowRun) -> WorkflowRun:
        request = None
        if run.HasField("request"):
            request = WorkflowRequest(
                method=run.request.method,
                url=run.request.url,
                headers=_json(dict(run.request.headers)),
                body=run.request.body,
            )
        return cls(
            id=uuid.UUID(run.id),
            workflow_id=uuid.UUID(run.workflow_id),
            status=_RUN_STATUS_OF[run.status],
            trigger_event=_json(_json_or_none(run.trigger_event_json) or {}),
            request=request,
            response_status=run.response_status or None,
            response_excerpt=run.response_excerpt or None,
            duration_ms=run.duration_ms if request is not None else None,
            attempts=run.attempts,
            error=run.error or None,
            is_test=run.is_test,
            created_at=run.created_at.ToDatetime(tzinfo=UTC),
            started_at=_time(run, "started_at"),
            finished_at=_time(run, "finished_at"),
        )


@strawberry.type
class WorkflowRunEdge:
    node: WorkflowRun
    cursor: str


@strawberry.type(description="A page of runs, newest first.")
class WorkflowRunConnection:
    edges: list[WorkflowRunEdge]
    page_info: PageInfo


@strawberry.input(description="When the workflow runs.")
class WorkflowTriggerInput:
    type: WorkflowTriggerType
    object: str | None = strawberry.field(
        default=None, description="RECORD_CREATED / RECORD_UPDATED: singular object name."
    )
    filter: JSON | None = strawberry.field(
        default=None,
        description="Optional, the API filter language on the record after the change.",
    )
    fields: list[str] | None = strawberry.field(
        default=None, description="RECORD_UPDATED: run only when one of these fields changed."
    )
    cron: str | None = strawberry.field(
        default=None,
        description="SCHEDULED: 5 fields (minute hour day month weekday), e.g. 0 9 * * *.",
    )
    timezone: str | None = strawberry.field(
        default=None, description="SCHEDULED: IANA time zone, e.g. Europe/Paris (default UTC)."
    )


@strawberry.input(
    description="The HTTP request to send; {{field}} and {{relation.field}} templates."
)
class WorkflowActionInput:
    url: str = strawberry.field(description="http(s) URL; variables are URL-encoded.")
    type: WorkflowActionType = WorkflowActionType.SEND_HTTP_REQUEST
    method: str = "POST"
    headers: JSON | None = strawberry.field(
        default=None, description="JSON object of header name to value template."
    )
    body: str = strawberry.field(
        default="", description="Template; inside a JSON body values are JSON-escaped."
    )
    secret_params: list[str] | None = strawberry.field(
        default=None,
        description="Query parameters of the URL whose values are secret (stored encrypted, "
        "read as ***); parameters named like a credential (token, key, ...) always are.",
    )


@strawberry.input
class CreateWorkflowInput:
    name: str
    trigger: WorkflowTriggerInput
    action: WorkflowActionInput


@strawberry.input
class UpdateWorkflowInput:
    id: uuid.UUID
    name: str | None = None
    trigger: WorkflowTriggerInput | None = strawberry.field(
        default=None, description="When given, replaces the trigger."
    )
    action: WorkflowActionInput | None = strawberry.field(
        default=None, description="When given, replaces the action."
    )


def _dump(value: Any) -> bytes:
    return b"" if value is None else orjson.dumps(value)


def _trigger(value: WorkflowTriggerInput) -> wf.Trigger:
    return wf.Trigger(
        type=_TRIGGER[value.type],
        object=value.object or "",
        filter_json=_dump(value.filter),
        fields=value.fields or [],
        cron=value.cron or "",
        timezone=value.timezone or "",
    )


def _action(value: WorkflowActionInput) -> wf.HttpAction:
    return wf.HttpAction(
        type=wf.ACTION_TYPE_SEND_HTTP_REQUEST,
        method=value.method,
        url=value.url,
        headers_json=_dump(value.headers),
        body=value.body,
        secret_params=value.secret_params or [],
    )


# -- operations ------------------------------------------------------------------------------
async def _workflows(
    info: Info,
    status: WorkflowStatus | None = None,
    first: int | None = None,
    after: uuid.UUID | None = None,
) -> list[Workflow]:
    context = info.context
    reply = await context.ask(
        context.state.upstreams.workflows.ListWorkflows,
        wf.ListWorkflowsRequest(
            page=page_request(first, after),
            status=_STATUS[status] if status else wf.WORKFLOW_STATUS_UNSPECIFIED,
        ),
    )
    return [Workflow.of(workflow) for workflow in reply.workflows]


async def _workflow(info: Info, id: uuid.UUID) -> Workflow:
    context = info.context
    workflow = await context.ask(
        context.state.upstreams.workflows.GetWorkflow,
        wf.GetWorkflowRequest(id=str(id)),
    )
    return Workflow.of(workflow)


async def _workflow_runs(
    info: Info,
    workflow_id: uuid.UUID,
    status: WorkflowRunStatus | None = None,
    first: int | None = None,
    after: str | None = None,
) -> WorkflowRunConnection:
    context = info.context
    reply = await context.ask(
        context.state.upstreams.workflows.ListWorkflowRuns,
        wf.ListWorkflowRunsRequest(
            workflow_id=str(workflow_id),
            status=_RUN_STATUS[status] if status else wf.RUN_STATUS_UNSPECIFIED,
            page=page_request(first, after),
        ),
    )
    page = reply.page_info
    return WorkflowRunConnection(
        edges=[WorkflowRunEdge(node=WorkflowRun.of(run), cursor=run.id) for run in reply.runs],
        page_info=PageInfo.of(page),
    )


async def _create_workflow(info: Info, input: CreateWorkflowInput) -> Workflow:
    context = info.context
    workflow = await context.ask(
        context.state.upstreams.workflows.CreateWorkflow,
        wf.CreateWorkflowRequest(
            name=input.name, trigger=_trigger(input.trigger), action=_action(input.action)
        ),
    )
    return Workflow.of(workflow)


async def _update_workflow(info: Info, input: UpdateWorkflowInput) -> Workflow:
    context = info.context
    request = wf.UpdateWorkflowRequest(id=str(input.id))
    if input.name is not None:
        request.name = input.name
    if input.trigger is not None:
        request.trigger.CopyFrom(_trigger(input.trigger))
    if input.action is not None:
        request.action.CopyFrom(_action(input.action))
    workflow = await context.ask(context.state.upstreams.workflows.UpdateWorkflow, request)
    return Workflow.of(workflow)


async def _delete_workflow(info: Info, id: uuid.UUID) -> uuid.UUID:
    context = info.context
    await context.ask(
        context.state.upstreams.workflows.DeleteWorkflow,
        wf.DeleteWorkflowRequest(id=str(id)),
    )
    return id


async def _activate_workflow(info: Info, id: uuid.UUID) -> Workflow:
    context = info.context
    workflow = await context.ask(
        context.state.upstreams.workflows.ActivateWorkflow,
        wf.SetWorkflowStatusRequest(id=str(id)),
    )
    return Workflow.of(workflow)


async def _deactivate_workflow(info: Info, id: uuid.UUID) -> Workflow:
    context = info.context
    workflow = await context.ask(
        context.state.upstreams.workflows.DeactivateWorkflow,
        wf.SetWorkflowStatusRequest(id=str(id)),
    )
    return Workflow.of(workflow)


async def _test_workflow(info: Info, id: uuid.UUID, record: JSON | None = None) -> WorkflowRun:
    context = info.context
    run = await context.ask(
        context.state.upstreams.workflows.TestWorkflow,
        wf.TestWorkflowRequest(id=str(id), record_json=_dump(record)),
    )
    return WorkflowRun.of(run)


@strawberry.type
class WorkflowsQuery:
    workflows: list[Workflow] = strawberry.field(
        resolver=_workflows, description="Needs WORKFLOWS. In creation order."
    )
    workflow: Workflow = strawberry.field(resolver=_workflow)
    workflow_runs: WorkflowRunConnection = strawberry.field(
        resolver=_workflow_runs, description="A workflow's runs, newest first."
    )


@strawberry.type
class WorkflowsMutation:
    create_workflow: Workflow = strawberry.mutation(
        resolver=_create_workflow,
        description="Needs WORKFLOWS. Saved as CONFIGURED: activate it to run on its trigger.",
    )
    update_workflow: Workflow = strawberry.mutation(resolver=_update_workflow)
    delete_workflow: uuid.UUID = strawberry.mutation(
        resolver=_delete_workflow, description="Its runs are deleted with it."
    )
    activate_workflow: Workflow = strawberry.mutation(
        resolver=_activate_workflow,
        description="Runs on its trigger from now on (test it first with testWorkflow).",
    )
    deactivate_workflow: Workflow = strawberry.mutation(
        resolver=_deactivate_workflow,
        description="Back to CONFIGURED; runs still queued fail.",
    )
    test_workflow: WorkflowRun = strawberry.mutation(
        resolver=_test_workflow,
        description="Sends the action once now with `record` (or the object's latest record, "
        "or a sample) without activating, and returns the finished run.",
    )


WORKFLOWS_PART = SchemaPart(
    name="workflows", query=WorkflowsQuery, mutation=WorkflowsMutation, metadata=True
)
