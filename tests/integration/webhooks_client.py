"""Helpers for webhook tests: a signed-up workspace, its webhooks (GraphQL), record writes over
gRPC, and the example receiver (examples/webhook_receiver.py) listening on loopback."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
import orjson
import pytest

from crm.metadata.v1 import metadata_pb2 as md
from crm.metadata.v1 import metadata_pb2_grpc
from crm.records.v1 import records_pb2 as rp
from crm.records.v1 import records_pb2_grpc
from crmkit.principal import PrincipalCodec, system_principal
from crmstack.client import Session, graphql, graphql_data, signup
from crmstack.stack import Stack
from examples.webhook_receiver import Delivery, WebhookReceiver
from tests.integration.records_client import Workspace

WEBHOOK_FIELDS = "id targetUrl operations operation isActive description secret createdAt updatedAt"
CREATE = f"""mutation($input: CreateWebhookInput!) {{
  createWebhook(input: $input) {{ {WEBHOOK_FIELDS} }}
}}"""
UPDATE = f"""mutation($input: UpdateWebhookInput!) {{
  updateWebhook(input: $input) {{ {WEBHOOK_FIELDS} }}
}}"""
DELIVERY_FIELDS = """id webhookId eventId operation status attempts nextAttemptAt lastStatusCode
  lastError redeliveryOf createdAt updatedAt
  attemptLog { attempt attemptedAt statusCode latencyMs error }"""
DELIVERIES = f"""query($webhookId: UUID!, $status: WebhookDeliveryStatus, $first: Int,
                  $after: String) {{
  webhookDeliveries(webhookId: $webhookId, status: $status, first: $first, after: $after) {{
    edges {{ cursor node {{ {DELIVERY_FIELDS} }} }}
    pageInfo {{ hasNextPage hasPreviousPage startCursor endCursor }}
  }}
}}"""
REDELIVER = f"""mutation($id: UUID!) {{
  redeliverWebhookEvent(deliveryId: $id) {{ {DELIVERY_FIELDS} }}
}}"""
ROTATE = f"mutation($id: UUID!) {{ rotateWebhookSecret(id: $id) {{ {WEBHOOK_FIELDS} }} }}"
DELETE = "mutation($id: UUID!) { deleteWebhook(id: $id) }"
SKIPPED = "webhook_events_skipped_total"


def attach(stack: Stack, workspace_id: str) -> Workspace:
    """gRPC stubs writing records in an existing (signed-up) workspace as its system principal."""
    codec = PrincipalCodec(stack.env["APP_SECRET"])
    principal = system_principal(workspace_id)
    metadata = metadata_pb2_grpc.MetadataServiceStub(
        grpc.insecure_channel(stack.grpc_address("metadata"))
    )
    records = records_pb2_grpc.RecordsServiceStub(
        grpc.insecure_channel(stack.grpc_address("records"))
    )
    schema = metadata.GetWorkspaceSchema(
        md.GetWorkspaceSchemaRequest(workspace_id=workspace_id),
        metadata=codec.metadata(principal),
        timeout=30,
    )
    return Workspace(workspace_id, schema, metadata, records, codec, principal)


@dataclass
class Hooks:
    """A workspace with an Admin session, record writes, and a receiver for its webhooks."""

    client: httpx.Client
    admin: Session
    ws: Workspace
    receiver: WebhookReceiver
    handlers: dict[str, Callable[[Delivery], int]] = field(default_factory=dict)

    # -- webhooks --------------------------------------------------------------------------------
    def create(self, operations: list[str], *, path: str | None = None) -> dict[str, Any]:
        """A webhook posting to the receiver at `path` (a fresh one by default)."""
        path = path or f"/hooks/{secrets.token_hex(4)}"
        webhook: dict[str, Any] = graphql_data(
            self.client,
            self.admin.access_token,
            CREATE,
            {"input": {"targetUrl": self.receiver.url(path), "operations": operations}},
        )["createWebhook"]
        self.receiver.set_secret(path, webhook["secret"])
        webhook["path"] = path
        return webhook

    @contextmanager
    def stalled(self, path: str, longest: float) -> Iterator[None]:
        """While the block runs, each delivery to `path` waits (up to `longest` seconds) before
        it is answered 200; at its end the waiting ones are answered at once."""
        release = threading.Event()

        def stall(delivery: Delivery) -> int:
            release.wait(longest)
            return 200

        self.handlers[path] = stall
        try:
            yield
        finally:
            release.set()
            self.handlers.pop(path, None)

    def gql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        return graphql_data(self.client, self.admin.access_token, query, variables)

    def gql_error(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        response = graphql(self.client, self.admin.access_token, query, variables)
        body = response.json()
        assert body.get("errors"), response.text
        error: dict[str, Any] = body["errors"][0]
        return error

    def deliveries(self, webhook_id: str, **variables: Any) -> list[dict[str, Any]]:
        data = self.gql(DELIVERIES, {"webhookId": webhook_id, **variables})
        return [edge["node"] for edge in data["webhookDeliveries"]["edges"]]

    def wait_deliveries(
        self, webhook_id: str, count: int, status: str = "DELIVERED", timeout: float = 60
    ) -> list[dict[str, Any]]:
        """The webhook's deliveries in `status`, once there are `count` of them: the receiver
        sees a request before the deliverer records its outcome."""
        deadline = time.monotonic() + timeout
        while len(listed := self.deliveries(webhook_id, status=status)) < count:
            assert time.monotonic() < deadline, f"{len(listed)} of {count} deliveries {status}"
            time.sleep(0.2)
        return listed

    # -- records ---------------------------------------------------------------------------------
    def create_record(self, obj: str, data: dict[str, Any]) -> dict[str, Any]:
        return self.ws.create(obj, data)

    def update_record(self, obj: str, record_id: str, data: dict[str, Any]) -> dict[str, Any]:
        response = self.ws.records.UpdateRecord(
            rp.UpdateRecordRequest(
                ref=rp.ObjectRef(object=obj), id=record_id, data_json=orjson.dumps(data)
            ),
            metadata=self.ws.call,
        )
        result: dict[str, Any] = orjson.loads(response.record_json)
        return result

    def delete_record(self, obj: str, record_id: str) -> dict[str, Any]:
        response = self.ws.records.DeleteRecord(
            rp.DeleteRecordRequest(ref=rp.ObjectRef(object=obj), id=record_id),
            metadata=self.ws.call,
        )
        result: dict[str, Any] = orjson.loads(response.record_json)
        return result

    # -- what arrived ----------------------------------------------------------------------------
    def wait_events(self, path: str, count: int, timeout: float = 60) -> list[Delivery]:
        deadline = time.monotonic() + timeout
        while True:
            events = self.receiver.events(path)
            if len(events) >= count:
                return events
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{len(events)} of {count} events reached {path}; rejected: "
                    f"{[r for r in self.receiver.rejected if r[0] == path]}"
                )
            time.sleep(0.1)

    def rejected(self, path: str) -> list[str]:
        return [reason for where, reason in self.receiver.rejected if where == path]


def deliverer_metric(stack: Stack, name: str, replica: int = 0) -> float:
    """A sample of one webhooks replica's /metrics (0 when absent)."""
    port = stack.instances["webhooks"][replica].metrics_port
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        if key == name:
            return float(value)
    return 0.0


def wait_skipped(stack: Stack, at_least: float, timeout: float = 60) -> None:
    """Until the deliverers together skipped `at_least` events (acknowledged unwritten)."""
    deadline = time.monotonic() + timeout
    replicas = range(len(stack.instances["webhooks"]))
    while sum(deliverer_metric(stack, SKIPPED, r) for r in replicas) < at_least:
        assert time.monotonic() < deadline, "the deliverers did not take the events"
        time.sleep(0.1)


def skipped(stack: Stack) -> float:
    replicas = range(len(stack.instances["webhooks"]))
    return sum(deliverer_metric(stack, SKIPPED, r) for r in replicas)


def make_hooks(stack: Stack, client: httpx.Client, receiver: WebhookReceiver) -> Hooks:
    """A new workspace whose webhooks post to `receiver`, which routes to per-path handlers."""
    admin = signup(client)
    made = Hooks(client, admin, attach(stack, admin.workspace_id), receiver)

    def route(delivery: Delivery) -> int:
        handler = made.handlers.get(delivery.path)
        return handler(delivery) if handler is not None else 200

    receiver.handler = route
    return made


@contextmanager
def running_receiver() -> Iterator[WebhookReceiver]:
    """The example receiver on a free loopback port."""
    receiver = WebhookReceiver().start()
    try:
        yield receiver
    finally:
        receiver.stop()


# Shared fixtures: a test module takes them with `receiver = webhooks_client.receiver` (and
# `hooks = webhooks_client.hooks`), which gives it its own module-scoped receiver.
@pytest.fixture(scope="module")
def receiver() -> Iterator[WebhookReceiver]:
    with running_receiver() as running:
        yield running


@pytest.fixture
def hooks(local_stack: Stack, client: httpx.Client, receiver: WebhookReceiver) -> Hooks:
    return make_hooks(local_stack, client, receiver)
