"""Webhook operations (permission API_KEYS_AND_WEBHOOKS): a schema part served on /graphql and
/metadata, resolved by the webhooks service over gRPC.

`webhooks` answers a plain list (creation order; `first`, default 50, at most 200, and `after`,
the id of the last webhook seen); `webhookDeliveries` a connection, newest first. The secret is
in the answers of createWebhook and rotateWebhookSecret only.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import Enum

import strawberry
from google.protobuf.timestamp_pb2 import Timestamp

from crm.webhooks.v1 import webhooks_pb2 as wh
from gateway.graphql.context import GraphQLContext
from gateway.graphql.page_info import PageInfo
from gateway.graphql.parts import SchemaPart
from gateway.pagination import page_request

Info = strawberry.Info[GraphQLContext, None]


def _time(stamp: Timestamp) -> datetime:
    return stamp.ToDatetime(tzinfo=UTC)


@strawberry.type(description="A webhook: signed POSTs to targetUrl when records change.")
class Webhook:
    id: uuid.UUID
    target_url: str
    operations: list[str] = strawberry.field(
        description="What it is sent for: {object|*}.{created|updated|deleted|*}, e.g. "
        "person.created, person.*, *.*."
    )
    operation: str = strawberry.field(
        description="The first of `operations` (for clients that read a single operation)."
    )
    is_active: bool
    description: str
    secret: str | None = strawberry.field(
        description="Signs every delivery. Only in the answers of createWebhook and "
        "rotateWebhookSecret, never again."
    )
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, webhook: wh.Webhook) -> Webhook:
        operations = list(webhook.operations)
        return cls(
            id=uuid.UUID(webhook.id),
            target_url=webhook.target_url,
            operations=operations,
            operation=operations[0] if operations else "",
            is_active=webhook.is_active,
            description=webhook.description,
            secret=webhook.secret or None,
            created_at=_time(webhook.created_at),
            updated_at=_time(webhook.updated_at),
        )


@strawberry.enum(description="Where a delivery stands.")
class WebhookDeliveryStatus(Enum):
    PENDING = "PENDING"  # waiting for its first or next attempt
    DELIVERED = "DELIVERED"  # a 2xx answer came in time
    FAILED = "FAILED"  # every attempt used (or it cannot be sent)


_STATUS_VALUES = {
    WebhookDeliveryStatus.PENDING: wh.DELIVERY_STATUS_PENDING,
    WebhookDeliveryStatus.DELIVERED: wh.DELIVERY_STATUS_DELIVERED,
    WebhookDeliveryStatus.FAILED: wh.DELIVERY_STATUS_FAILED,
}
_STATUS_OF = {value: status for status, value in _STATUS_VALUES.items()}


@strawberry.type(description="One POST of a delivery and how it went.")
class WebhookDeliveryAttempt:
    attempt: int = strawberry.field(description="1 for the first attempt.")
    attempted_at: datetime
    status_code: int | None = strawberry.field(description="Null when no answer came.")
    latency_ms: int
    error: str | None = strawberry.field(description="Why it failed; null on success.")


@strawberry.type(description="One event sent (or to be sent) to one webhook.")
class WebhookDelivery:
    id: uuid.UUID
    webhook_id: uuid.UUID
    event_id: uuid.UUID = strawberry.field(description="The payload's `id`.")
    operation: str
    status: WebhookDeliveryStatus
    attempts: int = strawberry.field(description="Attempts made so far.")
    next_attempt_at: datetime | None = strawberry.field(
        description="When the next attempt is due (pending deliveries)."
    )
    last_status_code: int | None
    last_error: str | None
    redelivery_of: uuid.UUID | None = strawberry.field(
        description="The delivery this one repeats (redeliverWebhookEvent)."
    )
    attempt_log: list[WebhookDeliveryAttempt] = strawberry.field(
        description="Every attempt, first to last."
    )
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, delivery: wh.WebhookDelivery) -> WebhookDelivery:
        return cls(
            id=uuid.UUID(delivery.id),
            webhook_id=uuid.UUID(delivery.webhook_id),
            event_id=uuid.UUID(delivery.event_id),
            operation=delivery.operation,
            status=_STATUS_OF[delivery.status],
            attempts=delivery.attempts,
            next_attempt_at=(
                _time(delivery.next_attempt_at) if delivery.HasField("next_attempt_at") else None
            ),
            last_status_code=delivery.last_status_code or None,
            last_error=delivery.last_error or None,
            redelivery_of=uuid.UUID(delivery.redelivery_of) if delivery.redelivery_of else None,
            attempt_log=[
                WebhookDeliveryAttempt(
                    attempt=attempt.attempt,
                    attempted_at=_time(attempt.attempted_at),
                    status_code=attempt.status_code or None,
                    latency_ms=attempt.latency_ms,
                    error=attempt.error or None,
                )
                for attempt in delivery.attempt_log
            ],
            created_at=_time(delivery.created_at),
            updated_at=_time(delivery.updated_at),
        )


@strawberry.type
class WebhookDeliveryEdge:
    node: WebhookDelivery
    cursor: str


@strawberry.type(description="A page of deliveries, newest first.")
class WebhookDeliveryConnection:
    edges: list[WebhookDeliveryEdge]
    page_info: PageInfo


@strawberry.input
class CreateWebhookInput:
    target_url: str = strawberry.field(description="http(s) URL, at most 2048 characters.")
    operations: list[str] = strawberry.field(
        description="{object|*}.{created|updated|deleted|*}; the object is a singular name."
    )
    description: str = ""


@strawberry.input
class UpdateWebhookInput:
    id: uuid.UUID
    operations: list[str] | None = strawberry.field(
        default=None, description="When given, replaces every operation."
    )
    description: str | None = None
    target_url: str | None = None
    is_active: bool | None = strawberry.field(
        default=None,
        description="false pauses it: pending deliveries fail; nothing is queued until true.",
    )


# -- operations ------------------------------------------------------------------------------
async def _webhooks(
    info: Info, first: int | None = None, after: uuid.UUID | None = None
) -> list[Webhook]:
    context = info.context
    reply = await context.ask(
        context.state.upstreams.webhooks.ListWebhooks,
        wh.ListWebhooksRequest(page=page_request(first, after)),
    )
    return [Webhook.of(webhook) for webhook in reply.webhooks]


async def _webhook(info: Info, id: uuid.UUID) -> Webhook:
    context = info.context
    webhook = await context.ask(
        context.state.upstreams.webhooks.GetWebhook,
        wh.GetWebhookRequest(id=str(id)),
    )
    return Webhook.of(webhook)


async def _webhook_deliveries(
    info: Info,
    webhook_id: uuid.UUID,
    status: WebhookDeliveryStatus | None = None,
    first: int | None = None,
    after: str | None = None,
) -> WebhookDeliveryConnection:
    context = info.context
    reply = await context.ask(
        context.state.upstreams.webhooks.ListDeliveries,
        wh.ListDeliveriesRequest(
            webhook_id=str(webhook_id),
            status=_STATUS_VALUES[status] if status else wh.DELIVERY_STATUS_UNSPECIFIED,
            page=page_request(first, after),
        ),
    )
    page = reply.page_info
    return WebhookDeliveryConnection(
        edges=[
            WebhookDeliveryEdge(node=WebhookDelivery.of(delivery), cursor=delivery.id)
            for delivery in reply.deliveries
        ],
        page_info=PageInfo.of(page),
    )


async def _create_webhook(info: Info, input: CreateWebhookInput) -> Webhook:
    context = info.context
    webhook = await context.ask(
        context.state.upstreams.webhooks.CreateWebhook,
        wh.CreateWebhookRequest(
            target_url=input.target_url,
            operations=input.operations,
            description=input.description,
        ),
    )
    return Webhook.of(webhook)


async def _update_webhook(info: Info, input: UpdateWebhookInput) -> Webhook:
    context = info.context
    request = wh.UpdateWebhookRequest(id=str(input.id))
    if input.operations is not None:
        request.operations.extend(input.operations)
        request.replace_operations = True
    if input.description is not None:
        request.description = input.description
    if input.target_url is not None:
        request.target_url = input.target_url
    if input.is_active is not None:
        request.is_active = input.is_active
    webhook = await context.ask(context.state.upstreams.webhooks.UpdateWebhook, request)
    return Webhook.of(webhook)


async def _delete_webhook(info: Info, id: uuid.UUID) -> uuid.UUID:
    context = info.context
    await context.ask(
        context.state.upstreams.webhooks.DeleteWebhook,
        wh.DeleteWebhookRequest(id=str(id)),
    )
    return id


async def _rotate_webhook_secret(info: Info, id: uuid.UUID) -> Webhook:
    context = info.context
    webhook = await context.ask(
        context.state.upstreams.webhooks.RotateWebhookSecret,
        wh.RotateWebhookSecretRequest(id=str(id)),
    )
    return Webhook.of(webhook)


async def _redeliver_webhook_event(info: Info, delivery_id: uuid.UUID) -> WebhookDelivery:
    context = info.context
    delivery = await context.ask(
        context.state.upstreams.webhooks.RedeliverEvent,
        wh.RedeliverRequest(delivery_id=str(delivery_id)),
    )
    return WebhookDelivery.of(delivery)


@strawberry.type
class WebhooksQuery:
    webhooks: list[Webhook] = strawberry.field(
        resolver=_webhooks, description="Needs API_KEYS_AND_WEBHOOKS. In creation order."
    )
    webhook: Webhook = strawberry.field(resolver=_webhook)
    webhook_deliveries: WebhookDeliveryConnection = strawberry.field(
        resolver=_webhook_deliveries,
        description="A webhook's deliveries, newest first, each with every attempt.",
    )


@strawberry.type
class WebhooksMutation:
    create_webhook: Webhook = strawberry.mutation(
        resolver=_create_webhook,
        description="Needs API_KEYS_AND_WEBHOOKS. The secret is shown only in this answer.",
    )
    update_webhook: Webhook = strawberry.mutation(resolver=_update_webhook)
    delete_webhook: uuid.UUID = strawberry.mutation(
        resolver=_delete_webhook, description="Pending deliveries are dropped with it."
    )
    rotate_webhook_secret: Webhook = strawberry.mutation(
        resolver=_rotate_webhook_secret,
        description="A new secret, shown only in this answer; the old one stops at once.",
    )
    redeliver_webhook_event: WebhookDelivery = strawberry.mutation(
        resolver=_redeliver_webhook_event,
        description="Queue the same event again for the same webhook (a new delivery).",
    )


WEBHOOKS_PART = SchemaPart(
    name="webhooks", query=WebhooksQuery, mutation=WebhooksMutation, metadata=True
)
