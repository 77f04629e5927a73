"""The workflow API over gRPC: configurations, activation, test runs and the run log.

Every call needs the WORKFLOWS permission flag (Admin, or a role allowed to manage workflows)
and acts within the caller's workspace; ids of other workspaces answer NOT_FOUND. Whoever saves,
activates or tests a workflow must READ every record of the objects its runs read (trigger
object, relations its filter and templates follow), so a run never passes on what they could
not read; the last to save or activate it is kept as its author, whose current access every run
checks again (workflows.runner). Field names in errors are the API's (`trigger.cron`, ...).
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import asyncpg
import grpc
import orjson
from google.protobuf.timestamp_pb2 import Timestamp

from crm.common.v1 import common_pb2
from crm.metadata.v1 import metadata_pb2, metadata_pb2_grpc
from crm.records.v1 import records_pb2 as rp
from crm.records.v1 import records_pb2_grpc
from crm.workflows.v1 import workflows_pb2 as wf
from crm.workflows.v1 import workflows_pb2_grpc
from crmkit.authors import Author
from crmkit.authz import require_flag, require_full_read
from crmkit.errors import InvalidArgument, NotFound, from_rpc_error
from crmkit.event_interest import InterestHolder
from crmkit.ids import canonical_uuid
from crmkit.jsondepth import contains_nul
from crmkit.outbound import OutboundPolicy, OutboundRefused, check_url
from crmkit.paging import read_page
from crmkit.principal import PrincipalCodec, system_principal
from crmkit.sealing import SecretBox, SecretUnavailable
from workflows import definitions, schedule, secrets, store, templates
from workflows.definitions import SCHEDULED, TRIGGER_VALUES, ActionSpec, TriggerSpec
from workflows.execution import Action, Executor
from workflows.metrics import WorkflowsMetrics
from workflows.runner import record_outcome
from workflows.sample import sample_record

Context = Any  # grpc.aio.ServicerContext (grpc is untyped)

WORKFLOW_STATUS = {"configured": wf.WORKFLOW_STATUS_CONFIGURED, "active": wf.WORKFLOW_STATUS_ACTIVE}
WORKFLOW_STATUS_NAMES = {value: name for name, value in WORKFLOW_STATUS.items()}
RUN_STATUS = {
    "queued": wf.RUN_STATUS_QUEUED,
    "running": wf.RUN_STATUS_RUNNING,
    "succeeded": wf.RUN_STATUS_SUCCEEDED,
    "failed": wf.RUN_STATUS_FAILED,
}
RUN_STATUS_NAMES = {value: name for name, value in RUN_STATUS.items()}


def _timestamp(value: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp


def _json(value: Any) -> bytes:
    return b"" if value is None else orjson.dumps(value)


def workflow_message(row: Any) -> wf.Workflow:
    message = wf.Workflow(
        id=row["id"],
        workspace_id=row["workspace_id"],
        name=row["name"],
        status=WORKFLOW_STATUS[row["status"]],
        trigger=wf.Trigger(
            type=TRIGGER_VALUES[row["trigger_type"]],
            object=row["object"],
            filter_json=_json(row["filter"]),
            fields=list(row["fields"]),
            cron=row["cron"],
            timezone=row["timezone"] if row["trigger_type"] == SCHEDULED else "",
        ),
        action=wf.HttpAction(
            type=wf.ACTION_TYPE_SEND_HTTP_REQUEST,
            method=row["method"],
            # Masked when stored; masked again for rows saved before secrets were sealed.
            url=secrets.mask_url(row["url"], row["secret_params"]),
            headers_json=_json(secrets.mask_headers(row["headers"] or {})),
            body=row["body"],
            secret_params=list(row["secret_params"]),
        ),
        created_at=_timestamp(row["created_at"]),
        updated_at=_timestamp(row["updated_at"]),
    )
    if row["last_run_at"] is not None:
        message.last_run_at.CopyFrom(_timestamp(row["last_run_at"]))
    if row["next_run_at"] is not None and row["status"] == "active":
        message.next_run_at.CopyFrom(_timestamp(row["next_run_at"]))
    return message


def run_message(row: Any) -> wf.WorkflowRun:
    message = wf.WorkflowRun(
        id=row["id"],
        workflow_id=row["workflow_id"],
        status=RUN_STATUS[row["status"]],
        trigger_event_json=_json(row["trigger_event"]),
        response_status=row["response_status"] or 0,
        response_excerpt=row["response_excerpt"],
        duration_ms=row["duration_ms"] or 0,
        attempts=row["attempts"],
        error=row["error"],
        is_test=row["is_test"],
        created_at=_timestamp(row["created_at"]),
    )
    if row["request_url"] is not None:
        message.request.CopyFrom(
            wf.RenderedRequest(
                method=row["request_method"],
                url=row["request_url"],
                headers=row["request_headers"] or {},
                body=row["request_body"] or "",
            )
        )
    if row["started_at"] is not None:
        message.started_at.CopyFrom(_timestamp(row["started_at"]))
    if row["finished_at"] is not None:
        message.finished_at.CopyFrom(_timestamp(row["finished_at"]))
    return message


def spec_of(row: Any, box: SecretBox) -> tuple[TriggerSpec, ActionSpec]:
    """The definition of a stored workflow, its secrets unsealed."""
    url, headers = row["url"], row["headers"] or {}
    if row["secrets"] is not None:
        try:
            url, headers = secrets.unseal(box, row["id"], row["secrets"])
        except SecretUnavailable as exc:
            raise InvalidArgument(str(exc), field="action.headers") from None
    return (
        TriggerSpec(
            type=row["trigger_type"],
            object=row["object"],
            filter=row["filter"],
            fields=list(row["fields"]),
            cron=row["cron"],
            timezone=row["timezone"],
        ),
        ActionSpec(
            method=row["method"],
            url=url,
            headers=headers,
            body=row["body"],
            secret_params=list(row["secret_params"]),
        ),
    )


class WorkflowServicer(workflows_pb2_grpc.WorkflowServiceServicer):
    def __init__(
        self,
        pool: asyncpg.Pool,
        principals: PrincipalCodec,
        metadata: metadata_pb2_grpc.MetadataServiceStub,
        records: records_pb2_grpc.RecordsServiceStub,
        policy: OutboundPolicy,
        executor: Executor,
        metrics: WorkflowsMetrics,
        min_schedule_interval: float,
        box: SecretBox,
        interest: InterestHolder,
    ) -> None:
        self._box = box
        self._interest = interest
        self._pool = pool
        self._principals = principals
        self._metadata = metadata
        self._records = records
        self._policy = policy
        self._executor = executor
        self._metrics = metrics
        self._min_interval = min_schedule_interval

    def _caller(self, context: Context) -> common_pb2.Principal:
        principal = self._principals.require(context)
        require_flag(principal, common_pb2.FLAG_WORKFLOWS)
        return principal

    def _system(self, workspace_id: str) -> list[tuple[str, str | bytes]]:
        return self._principals.metadata(system_principal(workspace_id))

    async def _schema(self, workspace_id: str) -> metadata_pb2.WorkspaceSchema:
        try:
            schema: metadata_pb2.WorkspaceSchema = await self._metadata.GetWorkspaceSchema(
                metadata_pb2.GetWorkspaceSchemaRequest(workspace_id=workspace_id),
                metadata=self._system(workspace_id),
            )
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        return schema

    async def _checked(
        self, principal: common_pb2.Principal, trigger: TriggerSpec, action: ActionSpec
    ) -> tuple[datetime | None, dict[str, Any]]:
        """Check a definition's headers, schedule, outbound rules, data model and the caller's
        read access; return the first tick of a SCHEDULED trigger, and the columns that make
        the caller the author (whose access every run checks again, workflows.runner)."""
        for name in action.headers:
            definitions.refuse_framing(name)
        first_tick = None
        if trigger.type == SCHEDULED:
            first_tick = schedule.validate(
                trigger.cron, trigger.timezone, self._min_interval, datetime.now(UTC)
            )
        try:
            await check_url(templates.VARIABLE.sub("x", action.url), self._policy)
        except OutboundRefused as exc:
            raise InvalidArgument(f"action.url: {exc}", field="action.url") from None
        schema = await self._schema(principal.workspace_id)
        definitions.check_against_model(trigger, action, schema)
        self._require_read(principal, trigger, action, schema)
        read = definitions.read_objects(trigger, action, schema)
        return first_tick, {**Author.of(principal).columns(), "read_objects": read}

    @staticmethod
    def _require_read(
        principal: common_pb2.Principal,
        trigger: TriggerSpec,
        action: ActionSpec,
        schema: metadata_pb2.WorkspaceSchema,
    ) -> None:
        for object_name in definitions.read_objects(trigger, action, schema):
            require_full_read(principal, object_name)

    async def CreateWorkflow(  # noqa: N802
        self, request: wf.CreateWorkflowRequest, context: Context
    ) -> wf.Workflow:
        principal = self._caller(context)
        name = definitions.validate_name(request.name)
        if not request.HasField("trigger"):
            raise InvalidArgument("trigger is required", field="trigger")
        if not request.HasField("action"):
            raise InvalidArgument("action is required", field="action")
        trigger = definitions.read_trigger(request.trigger)
        action = definitions.read_action(request.action)
        _, authored = await self._checked(principal, trigger, action)
        workflow_id = str(uuid.uuid4())
        row = await store.insert_workflow(
            self._pool,
            workflow_id,
            principal.workspace_id,
            name,
            store.definition_columns(trigger, action, workflow_id, self._box) | authored,
        )
        return workflow_message(row)

    async def GetWorkflow(  # noqa: N802
        self, request: wf.GetWorkflowRequest, context: Context
    ) -> wf.Workflow:
        principal = self._caller(context)
        return workflow_message(await self._get(principal, request.id))

    async def _get(self, principal: common_pb2.Principal, raw_id: str, field: str = "id") -> Any:
        row = await store.get_workflow(
            self._pool, principal.workspace_id, canonical_uuid(raw_id, field)
        )
        if row is None:
            raise NotFound("workflow not found", field=field)
        return row

    async def ListWorkflows(  # noqa: N802
        self, request: wf.ListWorkflowsRequest, context: Context
    ) -> wf.ListWorkflowsResponse:
        principal = self._caller(context)
        rows, info = await store.list_workflows(
            self._pool,
            principal.workspace_id,
            WORKFLOW_STATUS_NAMES.get(request.status),
            read_page(request.page),
        )
        return wf.ListWorkflowsResponse(
            workflows=[workflow_message(row) for row in rows], page_info=info
        )

    async def UpdateWorkflow(  # noqa: N802
        self, request: wf.UpdateWorkflowRequest, context: Context
    ) -> wf.Workflow:
        principal = self._caller(context)
        workflow_id = canonical_uuid(request.id, "id")
        current = await self._get(principal, workflow_id)
        trigger, action = spec_of(current, self._box)
        changes: dict[str, Any] = {}
        if request.HasField("name"):
            changes["name"] = definitions.validate_name(request.name)
        if request.HasField("trigger"):
            trigger = definitions.read_trigger(request.trigger)
        if request.HasField("action"):
            given = definitions.read_action(request.action)
            # A secret the author left masked keeps its stored value.
            url, headers = secrets.keep_stored(
                given.url, given.headers, given.secret_params, action.url, action.headers
            )
            action = replace(given, url=url, headers=headers)
        if request.HasField("trigger") or request.HasField("action"):
            first_tick, authored = await self._checked(principal, trigger, action)
            changes.update(store.definition_columns(trigger, action, current["id"], self._box))
            changes.update(authored)
            if current["status"] == "active":
                changes["next_run_at"] = first_tick
        if not changes:
            return workflow_message(current)
        async with self._pool.acquire() as connection, connection.transaction():
            row = await store.update_workflow(
                connection, principal.workspace_id, workflow_id, changes
            )
            if row is None:
                raise NotFound("workflow not found", field="id")
            if store.listens(row):
                # Perhaps widened: declared before the change commits.
                await self._interest.declare(connection, principal.workspace_id)
        if store.listens(current) and not store.listens(row):
            await self._interest.sweep_quietly(principal.workspace_id)
        return workflow_message(row)

    async def DeleteWorkflow(  # noqa: N802
        self, request: wf.DeleteWorkflowRequest, context: Context
    ) -> wf.DeleteWorkflowResponse:
        principal = self._caller(context)
        workflow_id = canonical_uuid(request.id, "id")
        if not await store.delete_workflow(self._pool, principal.workspace_id, workflow_id):
            raise NotFound("workflow not found", field="id")
        await self._interest.sweep_quietly(principal.workspace_id)
        return wf.DeleteWorkflowResponse(id=workflow_id)

    async def ActivateWorkflow(  # noqa: N802
        self, request: wf.SetWorkflowStatusRequest, context: Context
    ) -> wf.Workflow:
        principal = self._caller(context)
        current = await self._get(principal, request.id)
        trigger, action = spec_of(current, self._box)
        # Checked again: the data model may have changed since the workflow was saved.
        first_tick, authored = await self._checked(principal, trigger, action)
        async with self._pool.acquire() as connection, connection.transaction():
            row = await store.update_workflow(
                connection,
                principal.workspace_id,
                current["id"],
                {"status": "active", "next_run_at": first_tick, **authored},
            )
            if row is None:
                raise NotFound("workflow not found", field="id")
            if store.listens(row):
                # Before the activation commits: every event committed after it is published.
                await self._interest.declare(connection, principal.workspace_id)
        return workflow_message(row)

    async def DeactivateWorkflow(  # noqa: N802
        self, request: wf.SetWorkflowStatusRequest, context: Context
    ) -> wf.Workflow:
        principal = self._caller(context)
        workflow_id = canonical_uuid(request.id, "id")
        async with self._pool.acquire() as connection, connection.transaction():
            row = await store.update_workflow(
                connection,
                principal.workspace_id,
                workflow_id,
                {"status": "configured", "next_run_at": None},
            )
            if row is None:
                raise NotFound("workflow not found", field="id")
            await store.fail_queued_runs(connection, workflow_id, store.DEACTIVATED)
        await self._interest.sweep_quietly(principal.workspace_id)
        return workflow_message(row)

    async def TestWorkflow(  # noqa: N802
        self, request: wf.TestWorkflowRequest, context: Context
    ) -> wf.WorkflowRun:
        principal = self._caller(context)
        row = await self._get(principal, request.id)
        self._require_read(
            principal, *spec_of(row, self._box), await self._schema(principal.workspace_id)
        )
        try:
            action = self._executor.unsealed(Action.of(row))
        except SecretUnavailable as exc:
            raise InvalidArgument(str(exc), field="action.headers") from None
        for name in action.headers:
            definitions.refuse_framing(name)
        event = await self._test_event(principal.workspace_id, row, request.record_json)
        # Filled before anything is stored: a missing variable is the caller's error.
        try:
            rendered_context = await self._executor.context(principal.workspace_id, action, event)
            templates.render_request(
                action.method, action.url, action.headers, action.body, rendered_context
            )
        except templates.TemplateError as exc:
            raise InvalidArgument(exc.message, field=exc.field) from None
        run_id = await store.insert_test_run(self._pool, principal.workspace_id, row["id"], event)
        report = await self._executor.attempt(
            run_id=run_id,
            workspace_id=principal.workspace_id,
            action=action,
            trigger_event=event,
            trace_context=None,
        )
        outcome = "succeeded" if report.attempt.ok else "failed"
        await record_outcome(self._pool, run_id, None, outcome, 0.0, report)
        self._metrics.runs.labels(outcome).inc()
        return run_message(await store.get_run(self._pool, run_id))

    async def _test_event(self, workspace_id: str, row: Any, raw: bytes) -> dict[str, Any]:
        """The trigger event of a test run: the given record, or a sample of the object."""
        now = datetime.now(UTC).isoformat()
        if row["trigger_type"] == SCHEDULED:
            return {"type": "scheduled", "scheduledAt": now, "firedAt": now, "test": True}
        if raw:
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise InvalidArgument("record must be JSON", field="record") from None
            if not isinstance(record, dict):
                raise InvalidArgument("record must be a JSON object", field="record")
            if contains_nul(record):
                raise InvalidArgument(
                    "record: text must not contain the NUL character", field="record"
                )
        else:
            record = await self._latest_record(workspace_id, row["object"])
            if record is None:
                schema = await self._schema(workspace_id)
                obj = next((o for o in schema.objects if o.name_singular == row["object"]), None)
                record = sample_record(obj) if obj is not None else {}
        action = "created" if row["trigger_type"] == definitions.RECORD_CREATED else "updated"
        return {
            "id": str(uuid.uuid4()),
            "type": f"{row['object']}.{action}",
            "object": row["object"],
            "recordId": str(record.get("id", "")),
            "occurredAt": now,
            "record": record,
            "previousRecord": None,
            "changedFields": [],
            "test": True,
        }

    async def _latest_record(self, workspace_id: str, obj: str) -> dict[str, Any] | None:
        try:
            reply = await self._records.ListRecords(
                rp.ListRecordsRequest(
                    ref=rp.ObjectRef(object=obj),
                    order_by=[
                        common_pb2.OrderBy(
                            field="createdAt", direction=common_pb2.SORT_DIRECTION_DESC
                        )
                    ],
                    first=1,
                ),
                metadata=self._system(workspace_id),
            )
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        records: list[dict[str, Any]] = orjson.loads(reply.records_json)
        return records[0] if records else None

    async def ListWorkflowRuns(  # noqa: N802
        self, request: wf.ListWorkflowRunsRequest, context: Context
    ) -> wf.ListWorkflowRunsResponse:
        principal = self._caller(context)
        if not request.workflow_id:
            raise InvalidArgument("workflowId is required", field="workflowId")
        page = read_page(request.page)
        row = await self._get(principal, request.workflow_id, "workflowId")
        rows, info = await store.list_runs(
            self._pool,
            principal.workspace_id,
            row["id"],
            RUN_STATUS_NAMES.get(request.status),
            page,
        )
        return wf.ListWorkflowRunsResponse(runs=[run_message(r) for r in rows], page_info=info)
