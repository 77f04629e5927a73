"""The webhook API over gRPC: configurations, secrets, the delivery log and redelivery.

Every call needs the API_KEYS_AND_WEBHOOKS flag and acts within the caller's workspace; ids of
other workspaces answer NOT_FOUND. Whoever creates or changes a webhook must READ every record of
each object its operations name (`*`: of every object), so a webhook never passes on records
its last editor could not read; that editor is kept as its author, whose current access every
delivery checks again (webhooks.dispatcher). Field names in errors are the API's (`targetUrl`, ...).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import asyncpg
import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from crm.common.v1 import common_pb2
from crm.metadata.v1 import metadata_pb2, metadata_pb2_grpc
from crm.webhooks.v1 import webhooks_pb2 as wh
from crm.webhooks.v1 import webhooks_pb2_grpc
from crmkit.authors import Author
from crmkit.authz import require_flag, require_full_read
from crmkit.errors import FailedPrecondition, InvalidArgument, NotFound, from_rpc_error
from crmkit.event_interest import InterestHolder
from crmkit.ids import canonical_uuid
from crmkit.outbound import (
    OutboundPolicy,
    OutboundRefused,
    check_url,
    target_origin,
    validate_http_url,
)
from crmkit.paging import read_page
from crmkit.principal import PrincipalCodec, system_principal
from webhooks import store
from webhooks.operations import objects_of, validate_operations
from webhooks.sealing import SecretBox, new_secret

Context = Any  # grpc.aio.ServicerContext (grpc is untyped)
MAX_URL_LENGTH = 2048
MAX_DESCRIPTION_LENGTH = 2000
DEACTIVATED = "webhook deactivated before this delivery was sent"

STATUS_NAMES: dict[int, str] = {
    wh.DELIVERY_STATUS_PENDING: "pending",
    wh.DELIVERY_STATUS_DELIVERED: "delivered",
    wh.DELIVERY_STATUS_FAILED: "failed",
}
STATUS_VALUES = {name: value for value, name in STATUS_NAMES.items()}


def _timestamp(value: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp


def webhook_message(row: Any, secret: str = "") -> wh.Webhook:
    return wh.Webhook(
        id=row["id"],
        workspace_id=row["workspace_id"],
        target_url=row["target_url"],
        operations=list(row["operations"]),
        description=row["description"],
        is_active=row["is_active"],
        secret=secret,
        created_at=_timestamp(row["created_at"]),
        updated_at=_timestamp(row["updated_at"]),
    )


def delivery_message(row: Any, attempts: list[Any]) -> wh.WebhookDelivery:
    message = wh.WebhookDelivery(
        id=row["id"],
        webhook_id=row["webhook_id"],
        event_id=row["event_id"],
        operation=row["operation"],
        status=STATUS_VALUES[row["status"]],  # type: ignore[arg-type]
        attempts=row["attempts"],
        last_status_code=row["last_status_code"] or 0,
        last_error=row["last_error"],
        redelivery_of=row["redelivery_of"] or "",
        created_at=_timestamp(row["created_at"]),
        updated_at=_timestamp(row["updated_at"]),
        attempt_log=[
            wh.DeliveryAttempt(
                attempt=attempt["attempt"],
                attempted_at=_timestamp(attempt["attempted_at"]),
                status_code=attempt["status_code"] or 0,
                latency_ms=attempt["latency_ms"],
                error=attempt["error"],
            )
            for attempt in attempts
        ],
    )
    if row["status"] == "pending" and row["next_attempt_at"] is not None:
        message.next_attempt_at.CopyFrom(_timestamp(row["next_attempt_at"]))
    return message


def validate_target_url(value: str) -> str:
    return validate_http_url(value, "targetUrl", max_length=MAX_URL_LENGTH)


def validate_description(value: str) -> str:
    if len(value) > MAX_DESCRIPTION_LENGTH:
        raise InvalidArgument(
            f"description must be at most {MAX_DESCRIPTION_LENGTH} characters",
            field="description",
        )
    return value


def require_readable(principal: common_pb2.Principal, operations: list[str]) -> None:
    for object_name in objects_of(operations):
        require_full_read(principal, object_name)


class WebhookServicer(webhooks_pb2_grpc.WebhookServiceServicer):
    def __init__(
        self,
        pool: asyncpg.Pool,
        principals: PrincipalCodec,
        box: SecretBox,
        metadata: metadata_pb2_grpc.MetadataServiceStub,
        policy: OutboundPolicy,
        interest: InterestHolder,
        on_redelivery: Callable[[], None] = lambda: None,
    ) -> None:
        self._pool = pool
        self._interest = interest
        self._principals = principals
        self._box = box
        self._metadata = metadata
        self._policy = policy
        self._on_redelivery = on_redelivery

    def _caller(self, context: Context) -> common_pb2.Principal:
        principal = self._principals.require(context)
        require_flag(principal, common_pb2.FLAG_API_KEYS_AND_WEBHOOKS)
        return principal

    async def _known_objects(self, workspace_id: str, operations: list[str]) -> list[str]:
        if all(operation.strip().startswith("*.") for operation in operations):
            return []
        try:
            schema = await self._metadata.GetWorkspaceSchema(
                metadata_pb2.GetWorkspaceSchemaRequest(workspace_id=workspace_id),
                metadata=self._principals.metadata(system_principal(workspace_id)),
            )
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        return [obj.name_singular for obj in schema.objects if obj.is_active]

    async def _checked_target(self, raw: str) -> tuple[str, str]:
        url = validate_target_url(raw)
        try:
            await check_url(url, self._policy)
        except OutboundRefused as exc:
            raise InvalidArgument(f"targetUrl: {exc}", field="targetUrl") from None
        return url, target_origin(url)

    async def _operations(self, workspace_id: str, values: list[str]) -> list[str]:
        return validate_operations(values, await self._known_objects(workspace_id, values))

    async def CreateWebhook(  # noqa: N802
        self, request: wh.CreateWebhookRequest, context: Context
    ) -> wh.Webhook:
        principal = self._caller(context)
        url, origin = await self._checked_target(request.target_url)
        operations = await self._operations(principal.workspace_id, list(request.operations))
        require_readable(principal, operations)
        description = validate_description(request.description)
        webhook_id = str(uuid.uuid4())
        secret = new_secret()
        async with self._pool.acquire() as connection, connection.transaction():
            # Before the webhook commits: every event committed after it is published.
            await self._interest.declare(connection, principal.workspace_id)
            row = await store.insert_webhook(
                connection,
                webhook_id=webhook_id,
                workspace_id=principal.workspace_id,
                target_url=url,
                target_origin=origin,
                operations=operations,
                description=description,
                sealed_secret=self._box.seal(webhook_id, secret),
                author=Author.of(principal),
            )
        return webhook_message(row, secret)

    async def ListWebhooks(  # noqa: N802
        self, request: wh.ListWebhooksRequest, context: Context
    ) -> wh.ListWebhooksResponse:
        principal = self._caller(context)
        rows, info = await store.list_webhooks(
            self._pool, principal.workspace_id, read_page(request.page)
        )
        return wh.ListWebhooksResponse(
            webhooks=[webhook_message(row) for row in rows], page_info=info
        )

    async def GetWebhook(  # noqa: N802
        self, request: wh.GetWebhookRequest, context: Context
    ) -> wh.Webhook:
        principal = self._caller(context)
        row = await store.get_webhook(
            self._pool, principal.workspace_id, canonical_uuid(request.id, "id")
        )
        if row is None:
            raise NotFound("webhook not found", field="id")
        return webhook_message(row)

    async def UpdateWebhook(  # noqa: N802
        self, request: wh.UpdateWebhookRequest, context: Context
    ) -> wh.Webhook:
        principal = self._caller(context)
        webhook_id = canonical_uuid(request.id, "id")
        changes: dict[str, Any] = {}
        if request.HasField("target_url"):
            changes["target_url"], changes["target_origin"] = await self._checked_target(
                request.target_url
            )
        if request.replace_operations:
            changes["operations"] = await self._operations(
                principal.workspace_id, list(request.operations)
            )
        if request.HasField("description"):
            changes["description"] = validate_description(request.description)
        if request.HasField("is_active"):
            changes["is_active"] = request.is_active
        async with self._pool.acquire() as connection, connection.transaction():
            if changes:
                current = await store.get_webhook(connection, principal.workspace_id, webhook_id)
                if current is None:
                    raise NotFound("webhook not found", field="id")
                require_readable(principal, changes.get("operations", list(current["operations"])))
                changes.update(Author.of(principal).columns())  # whose access was just checked
                row = await store.update_webhook(
                    connection, principal.workspace_id, webhook_id, changes
                )
            else:
                row = await store.get_webhook(connection, principal.workspace_id, webhook_id)
            if row is None:
                raise NotFound("webhook not found", field="id")
            if changes.get("is_active") is False:
                await store.fail_pending_deliveries(connection, webhook_id, DEACTIVATED)
            elif changes and row["is_active"]:
                # Activated or widened, perhaps: declared before the change commits.
                await self._interest.declare(connection, principal.workspace_id)
        if changes.get("is_active") is False:
            await self._interest.sweep_quietly(principal.workspace_id)
        return webhook_message(row)

    async def DeleteWebhook(  # noqa: N802
        self, request: wh.DeleteWebhookRequest, context: Context
    ) -> wh.DeleteWebhookResponse:
        principal = self._caller(context)
        webhook_id = canonical_uuid(request.id, "id")
        if not await store.delete_webhook(self._pool, principal.workspace_id, webhook_id):
            raise NotFound("webhook not found", field="id")
        await self._interest.sweep_quietly(principal.workspace_id)
        return wh.DeleteWebhookResponse(id=webhook_id)

    async def RotateWebhookSecret(  # noqa: N802
        self, request: wh.RotateWebhookSecretRequest, context: Context
    ) -> wh.Webhook:
        principal = self._caller(context)
        webhook_id = canonical_uuid(request.id, "id")
        secret = new_secret()
        async with self._pool.acquire() as connection:
            row = await store.update_webhook(
                connection,
                principal.workspace_id,
                webhook_id,
                {"secret_sealed": self._box.seal(webhook_id, secret)},
            )
        if row is None:
            raise NotFound("webhook not found", field="id")
        return webhook_message(row, secret)

    async def ListDeliveries(  # noqa: N802
        self, request: wh.ListDeliveriesRequest, context: Context
    ) -> wh.ListDeliveriesResponse:
        principal = self._caller(context)
        if not request.webhook_id:
            raise InvalidArgument("webhookId is required", field="webhookId")
        webhook_id = canonical_uuid(request.webhook_id, "webhookId")
        page = read_page(request.page)
        if await store.get_webhook(self._pool, principal.workspace_id, webhook_id) is None:
            raise NotFound("webhook not found", field="webhookId")
        status = STATUS_NAMES.get(request.status)
        rows, info, attempts = await store.list_deliveries(
            self._pool, principal.workspace_id, webhook_id, status, page
        )
        return wh.ListDeliveriesResponse(
            deliveries=[delivery_message(row, attempts[row["id"]]) for row in rows],
            page_info=info,
        )

    async def RedeliverEvent(  # noqa: N802
        self, request: wh.RedeliverRequest, context: Context
    ) -> wh.WebhookDelivery:
        principal = self._caller(context)
        delivery_id = canonical_uuid(request.delivery_id, "deliveryId")
        problem, row = await store.redeliver(self._pool, principal.workspace_id, delivery_id)
        if problem == "missing":
            raise NotFound("delivery not found", field="deliveryId")
        if problem == "inactive":
            raise FailedPrecondition(
                "the webhook is inactive: activate it to redeliver", field="deliveryId"
            )
        assert row is not None
        self._on_redelivery()
        return delivery_message(row, [])
