"""Webhooks under failure: a killed deliverer loses nothing, NATS stopped during 500 writes
delays but loses nothing, and with WEBHOOK_ALLOW_PRIVATE_TARGETS off loopback targets are
refused at creation and again at delivery (only loopback addresses are used)."""

from __future__ import annotations

import sys
import time

import grpc
import pytest

from crm.webhooks.v1 import webhooks_pb2 as wh
from crm.webhooks.v1 import webhooks_pb2_grpc
from crmkit.errors import from_rpc_error
from crmkit.principal import PrincipalCodec, system_principal
from crmstack.ports import free_port, wait_for_port
from crmstack.processes import ManagedProcess
from crmstack.stack import Stack
from examples.webhook_receiver import Delivery
from tests.integration import webhooks_client
from tests.integration.webhooks_client import (
    REDELIVER,
    Hooks,
)

receiver = webhooks_client.receiver
hooks = webhooks_client.hooks


def wait_for_api(hooks: Hooks) -> None:
    """Until the gateway reaches the restarted webhooks service again (its channel backs off)."""
    deadline = time.monotonic() + 90
    while True:
        response = hooks.client.post(
            "/graphql", json={"query": "{ webhooks { id } }"}, headers=hooks.admin.headers
        )
        if response.status_code == 200 and not response.json().get("errors"):
            return
        assert time.monotonic() < deadline, response.text
        time.sleep(1)


def people(hooks: Hooks, count: int, prefix: str) -> None:
    for start in range(0, count, 100):
        size = min(100, count - start)
        hooks.ws.create_many("person", [{"firstName": f"{prefix}{start + i}"} for i in range(size)])


def test_killing_the_deliverer_mid_run_loses_nothing(hooks: Hooks, local_stack: Stack) -> None:
    webhook = hooks.create(["person.created"])

    def steady(delivery: Delivery) -> int:
        time.sleep(0.05)
        return 200

    hooks.handlers[webhook["path"]] = steady
    try:
        people(hooks, 150, "a")
        hooks.wait_events(webhook["path"], 20)
        local_stack.kill("webhooks")  # SIGKILL mid-run: claimed and unacknowledged work is lost
        in_flight_at_kill = len(hooks.receiver.events(webhook["path"]))
        assert in_flight_at_kill < 150
        people(hooks, 150, "b")  # queued in JetStream while no deliverer runs
        local_stack.restart("webhooks")
        events = hooks.wait_events(webhook["path"], 300, timeout=180)
    finally:
        hooks.handlers.pop(webhook["path"], None)
    names = {event.payload["record"]["firstName"] for event in events}
    assert names == {f"a{i}" for i in range(150)} | {f"b{i}" for i in range(150)}
    assert len({event.payload["id"] for event in events}) == 300
    assert hooks.rejected(webhook["path"]) == []
    wait_for_api(hooks)


def test_nats_stopped_during_500_writes_delays_but_loses_nothing(
    hooks: Hooks, local_stack: Stack
) -> None:
    webhook = hooks.create(["person.created"])
    people(hooks, 250, "before")
    local_stack.stop_infra("nats")
    try:
        people(hooks, 250, "during")  # writes succeed; their events wait in the outbox
    finally:
        local_stack.start_infra("nats")
    events = hooks.wait_events(webhook["path"], 500, timeout=240)
    assert len({event.payload["id"] for event in events}) == 500
    names = {event.payload["record"]["firstName"] for event in events}
    assert names == {f"before{i}" for i in range(250)} | {f"during{i}" for i in range(250)}
    assert hooks.rejected(webhook["path"]) == []


def strict_webhooks(stack: Stack, *, deliverer: bool) -> tuple[ManagedProcess, str]:
    """Another webhooks process with WEBHOOK_ALLOW_PRIVATE_TARGETS off."""
    port = free_port()
    process = ManagedProcess(
        name=f"webhooks-strict-{port}",
        command=[sys.executable, "-m", "webhooks"],
        env={
            **stack.env,
            "GRPC_PORT": str(port),
            "GRPC_HOST": "127.0.0.1",
            "METRICS_PORT": str(free_port()),
            "METRICS_HOST": "127.0.0.1",
            "WEBHOOK_ALLOW_PRIVATE_TARGETS": "false",
            "WEBHOOK_DELIVERER_ENABLED": "true" if deliverer else "false",
        },
        log_path=stack.logs / f"webhooks-strict-{port}.log",
    )
    process.start()
    assert wait_for_port(port, 60), process.tail()
    return process, f"127.0.0.1:{port}"


def test_loopback_targets_are_refused_at_creation_when_not_allowed(
    hooks: Hooks, local_stack: Stack
) -> None:
    process, address = strict_webhooks(local_stack, deliverer=False)
    try:
        stub = webhooks_pb2_grpc.WebhookServiceStub(grpc.insecure_channel(address))
        call = PrincipalCodec(local_stack.env["APP_SECRET"]).metadata(system_principal(hooks.ws.id))
        port = hooks.receiver.port
        for url in (
            f"http://127.0.0.1:{port}/x",
            f"http://127.9.9.9:{port}/x",
            f"http://localhost:{port}/x",
            f"http://[::1]:{port}/x",
            f"http://[::ffff:127.0.0.1]:{port}/x",
        ):
            with pytest.raises(grpc.RpcError) as caught:
                stub.CreateWebhook(
                    wh.CreateWebhookRequest(target_url=url, operations=["person.created"]),
                    metadata=call,
                    timeout=30,
                )
            error = from_rpc_error(caught.value)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, url
            assert error.field == "targetUrl"
            assert "loopback address; refused" in error.message, error.message
        listed = stub.ListWebhooks(wh.ListWebhooksRequest(), metadata=call, timeout=30)
        assert list(listed.webhooks) == []
    finally:
        process.stop()


def test_loopback_targets_are_refused_again_at_delivery(hooks: Hooks, local_stack: Stack) -> None:
    webhook = hooks.create(["person.created"])  # allowed by the suite's main process
    local_stack.kill("webhooks")
    process, address = strict_webhooks(local_stack, deliverer=True)
    stub = webhooks_pb2_grpc.WebhookServiceStub(grpc.insecure_channel(address))
    call = PrincipalCodec(local_stack.env["APP_SECRET"]).metadata(system_principal(hooks.ws.id))
    try:
        hooks.create_record("person", {"firstName": "Refused"})
        deadline = time.monotonic() + 60
        while True:
            listed = stub.ListDeliveries(
                wh.ListDeliveriesRequest(webhook_id=webhook["id"]), metadata=call, timeout=30
            )
            attempts = [a for d in listed.deliveries for a in d.attempt_log]
            if attempts:
                break
            assert time.monotonic() < deadline, "no attempt was made"
            time.sleep(0.2)
        assert hooks.receiver.requests(webhook["path"]) == []  # nothing reached the receiver
    finally:
        process.stop()
        local_stack.restart("webhooks")
    assert attempts[0].status_code == 0
    assert attempts[0].error.startswith("refused: 127.0.0.1 is a loopback address")
    # The event goes through once private targets are allowed again (the main process sends
    # the pending retry, or the redelivery: the receiver dedupes on the event id).
    wait_for_api(hooks)
    hooks.gql(REDELIVER, {"id": listed.deliveries[0].id})
    [event] = hooks.wait_events(webhook["path"], 1)
    assert event.payload["record"]["firstName"] == "Refused"
