"""One attempt of a run: build the template context, render the request, send it, judge it.

Shared by the runner (queued runs, with retries) and testWorkflow (one attempt now). Relations
named by dotted variables (`{{company.name}}`) are loaded from the records service as the
workflow's own system principal. Every request carries the trace context (W3C traceparent) and
the signed `X-CRM-Workflow-Run` header (see crmkit.workflow_origin), so writes it causes through
the API do not trigger the same workflow again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import grpc
import orjson
from opentelemetry import trace
from yarl import URL

from crm.records.v1 import records_pb2 as rp
from crm.records.v1 import records_pb2_grpc
from crmkit.http_send import HttpAttempt, send_request
from crmkit.outbound import WorkspaceSessions
from crmkit.principal import PrincipalCodec, system_principal
from crmkit.sealing import SecretBox, SecretUnavailable
from crmkit.telemetry import extract_context, inject_headers
from crmkit.workflow_origin import WORKFLOW_RUN_HEADER, WorkflowOrigin
from workflows import secrets, templates
from workflows.definitions import SCHEDULED, relation_heads
from workflows.metrics import WorkflowsMetrics
from workflows.templates import Rendered, TemplateError

log = logging.getLogger("workflows.execution")
tracer = trace.get_tracer("workflows")

USER_AGENT = "crm-workflows/1"


@dataclass(frozen=True)
class Action:
    """A workflow's trigger kind, object and action, as stored (`url` and `headers` as read,
    secrets masked, until `Executor.unsealed`)."""

    workflow_id: str
    workflow_name: str
    trigger_type: str
    object: str
    method: str
    url: str
    headers: Mapping[str, str]
    body: str
    secret_params: tuple[str, ...] = ()
    sealed: bytes | None = None  # the real URL and headers; None once unsealed

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Action:
        return cls(
            workflow_id=row["workflow_id"] if "workflow_id" in row else row["id"],
            workflow_name=row["name"],
            trigger_type=row["trigger_type"],
            object=row["object"],
            method=row["method"],
            url=row["url"],
            headers=row["headers"] or {},
            body=row["body"],
            secret_params=tuple(row.get("secret_params") or ()),
            sealed=row.get("secrets"),
        )

    def paths(self) -> list[str]:
        found = templates.variables(self.url) + templates.variables(self.body)
        for value in self.headers.values():
            found += templates.variables(value)
        return found


@dataclass(frozen=True)
class Report:
    """What an attempt did: the request as stored (secrets masked), the answer, and whether a
    later attempt could do better (`permanent`: no)."""

    request: Rendered | None
    attempt: HttpAttempt
    permanent: bool


class RetryableError(Exception):
    """The context could not be built now (e.g. the records service is away)."""


def tick_context(trigger_event: Mapping[str, Any], action: Action) -> dict[str, Any]:
    return {
        "scheduledAt": trigger_event.get("scheduledAt"),
        "workflowId": action.workflow_id,
        "workflowName": action.workflow_name,
    }


class Executor:
    def __init__(
        self,
        sessions: WorkspaceSessions,
        timeout: float,
        records: records_pb2_grpc.RecordsServiceStub,
        principals: PrincipalCodec,
        origin: WorkflowOrigin,
        metrics: WorkflowsMetrics,
        box: SecretBox,
    ) -> None:
        self._sessions = sessions
        self._box = box
        self._timeout = timeout
        self._records = records
        self._principals = principals
        self._origin = origin
        self._metrics = metrics

    def unsealed(self, action: Action) -> Action:
        """The action with its real URL and headers (SecretUnavailable if they do not open)."""
        if action.sealed is None:
            return action  # saved before secrets were sealed, and not sealed yet: as stored
        url, headers = secrets.unseal(self._box, action.workflow_id, action.sealed)
        return replace(action, url=url, headers=headers, sealed=None)

    async def context(
        self, workspace_id: str, action: Action, trigger_event: Mapping[str, Any]
    ) -> dict[str, Any]:
        """What the templates read: the record (relations loaded as needed), or the tick."""
        if action.trigger_type == SCHEDULED:
            return tick_context(trigger_event, action)
        record = trigger_event.get("record")
        record_id = str(trigger_event.get("recordId") or "")
        if not isinstance(record, Mapping):
            # Too large for the event (record_omitted): read it, relations included.
            return await self.load(workspace_id, action, record_id) if record_id else {}
        context: dict[str, Any] = dict(record)
        heads = relation_heads(action.paths(), context)
        if heads and context.get("id"):
            loaded = await self.load(workspace_id, action, str(context["id"]))
            context.update({head: loaded.get(head) for head in heads})
        return context

    async def load(self, workspace_id: str, action: Action, record_id: str) -> dict[str, Any]:
        """The record with its many-to-one relations nested ({} when it no longer exists)."""
        principal = system_principal(workspace_id, workflow_id=action.workflow_id)
        try:
            reply = await self._records.GetRecord(
                rp.GetRecordRequest(
                    ref=rp.ObjectRef(object=action.object),
                    id=record_id,
                    depth=1,
                    deleted=rp.DELETED_SCOPE_INCLUDE,
                ),
                metadata=self._principals.metadata(principal),
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return {}
            raise RetryableError(f"cannot read the record: {exc.details()}") from None
        loaded: dict[str, Any] = orjson.loads(reply.record_json)
        return loaded

    async def attempt(
        self,
        *,
        run_id: str,
        workspace_id: str,
        action: Action,
        trigger_event: Mapping[str, Any],
        trace_context: Mapping[str, str] | None,
    ) -> Report:
        parent = extract_context(trace_context)
        with tracer.start_as_current_span(
            "workflow.run",
            context=parent,
            kind=trace.SpanKind.CLIENT,
            attributes={"workflow.id": action.workflow_id, "workflow.run.id": run_id},
        ):
            try:
                action = self.unsealed(action)
            except SecretUnavailable as exc:
                return Report(None, _failure(str(exc)), permanent=True)
            try:
                context = await self.context(workspace_id, action, trigger_event)
                rendered = templates.render_request(
                    action.method, action.url, action.headers, action.body, context
                )
            except TemplateError as exc:
                return Report(None, _failure(f"{exc.field}: {exc.message}"), permanent=True)
            except RetryableError as exc:
                return Report(None, _failure(str(exc)), permanent=False)
            headers = {"User-Agent": USER_AGENT, **rendered.headers}
            headers[WORKFLOW_RUN_HEADER] = self._origin.header_value(
                workspace_id, action.workflow_id, run_id
            )
            inject_headers(headers)
            async with self._sessions.session(workspace_id) as session:
                result = await send_request(
                    session,
                    rendered.method,
                    URL(rendered.url, encoded=True),  # as rendered and recorded: no normalising
                    headers=headers,
                    body=rendered.body.encode() if rendered.body else None,
                    timeout=self._timeout,
                )
        self._metrics.run_duration.observe(result.latency_ms / 1000)
        stored = Rendered(
            rendered.method,
            secrets.mask_url(rendered.url, action.secret_params, by_shape=True),
            secrets.mask_run_headers(rendered.headers, action.headers),
            rendered.body,
        )
        return Report(stored, result, permanent=False)


def failed_report(error: str, *, permanent: bool) -> Report:
    """An attempt that sent nothing, failing with `error`."""
    return Report(None, _failure(error), permanent=permanent)


def _failure(error: str) -> HttpAttempt:
    return HttpAttempt(
        ok=False,
        status_code=None,
        excerpt="",
        latency_ms=0,
        error=error,
        attempted_at=datetime.now(UTC),
    )
