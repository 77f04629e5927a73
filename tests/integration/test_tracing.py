"""One trace end to end: a REST create through the gateway, the gRPC hop, the SQL, the outbox
relay's publish to NATS and the webhook delivery, exported by every process over OTLP/HTTP to a
real receiver on loopback.

The stack here is its own (module-scoped): its processes are configured only by the standard
OTEL_* variables, pointing at the receiver.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from crmstack.stack import Stack, StackConfig
from examples.webhook_receiver import WebhookReceiver
from tests.integration.conftest import TEST_ENV
from tests.integration.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.integration.webhooks_client import make_hooks, running_receiver


@pytest.fixture(scope="module")
def collector() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="module")
def traced_stack(collector: OtlpReceiver) -> Iterator[Stack]:
    if os.environ.get("CRM_BASE_URL"):
        pytest.skip("needs the local launcher: its processes must export to the test's receiver")
    data_dir = Path(tempfile.mkdtemp(prefix="crm-trace-"))
    stack = Stack(
        StackConfig(
            data_dir=data_dir,
            app_secret=secrets.token_urlsafe(48),
            extra_env={
                **TEST_ENV,
                "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
                "OTEL_BSP_SCHEDULE_DELAY": "100",
            },
            fast_postgres=True,
        )
    )
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def webhook_receiver() -> Iterator[WebhookReceiver]:
    with running_receiver() as running:
        yield running


def _wait_for_trace(
    collector: OtlpReceiver, trace_id: str, root_span_id: str, timeout: float = 30
) -> list[ReceivedSpan]:
    """The trace's spans once it holds every part asserted below and no span's parent is
    missing (exporters flush in batches, so parts arrive in any order)."""
    deadline = time.monotonic() + timeout
    while True:
        spans = collector.spans(trace_id)
        ids = {span.span_id for span in spans} | {root_span_id}
        complete = all(span.parent_span_id in ids for span in spans)
        services = {span.service for span in spans}
        if complete and {"gateway", "records", "webhooks"} <= services and _delivery(spans):
            return spans
        if time.monotonic() > deadline:
            found = sorted(f"{s.service}:{s.kind}:{s.name}" for s in spans)
            raise AssertionError(f"trace {trace_id} incomplete after {timeout}s: {found}")
        time.sleep(0.2)


def _delivery(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    """The delivery attempt's span, once its HTTP request's span has arrived too."""
    attempts = [s for s in spans if s.service == "webhooks" and s.name == "webhook delivery"]
    requests = {s.parent_span_id for s in spans if s.kind == "CLIENT" and s.name == "POST"}
    return [s for s in attempts if s.span_id in requests]


def test_one_trace_from_rest_call_to_webhook_delivery(
    traced_stack: Stack, collector: OtlpReceiver, webhook_receiver: WebhookReceiver
) -> None:
    with httpx.Client(base_url=traced_stack.base_url, timeout=30) as client:
        hooks = make_hooks(traced_stack, client, webhook_receiver)
        webhook = hooks.create(["person.created"])
        # The caller starts the trace: the gateway continues it (W3C traceparent).
        trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
        response = client.post(
            "/rest/people",
            json={"firstName": "Grace", "city": "Arlington"},
            headers={
                **hooks.admin.headers,
                "traceparent": f"00-{trace_id}-{caller_span}-01",
            },
        )
        assert response.status_code == 201, response.text
        person_id = response.json()["data"]["id"]

    (delivered,) = hooks.wait_events(webhook["path"], 1)
    assert delivered.payload["record"]["id"] == person_id
    # The webhook request itself carries the trace on.
    assert delivered.headers["traceparent"].split("-")[1] == trace_id

    spans = _wait_for_trace(collector, trace_id, caller_span)
    by_id = {span.span_id: span for span in spans}

    (http_server,) = [s for s in spans if s.service == "gateway" and s.kind == "SERVER"]
    assert http_server.name == "POST /rest/{object}"
    assert http_server.parent_span_id == caller_span
    assert http_server.attributes["http.route"] == "/rest/{object}"
    assert http_server.attributes["http.response.status_code"] == 201

    (create_rpc,) = [
        s
        for s in spans
        if s.service == "records" and s.kind == "SERVER" and s.name.endswith("/CreateRecord")
    ]
    client_rpc = by_id[create_rpc.parent_span_id]
    assert (client_rpc.service, client_rpc.kind) == ("gateway", "CLIENT")

    inserts = [
        s
        for s in spans
        if s.service == "records"
        and s.attributes.get("db.system.name") == "postgresql"
        and "INSERT INTO records.outbox" in str(s.attributes.get("db.query.text"))
    ]
    assert len(inserts) == 1
    assert inserts[0].parent_span_id == create_rpc.span_id

    (publish,) = [s for s in spans if s.service == "records" and s.kind == "PRODUCER"]
    assert publish.parent_span_id == create_rpc.span_id
    assert publish.attributes["messaging.system"] == "nats"

    (process,) = [s for s in spans if s.service == "webhooks" and s.kind == "CONSUMER"]
    assert process.parent_span_id == publish.span_id

    (delivery,) = _delivery(spans)
    assert delivery.parent_span_id == process.span_id
    assert delivery.attributes["crm.webhook.id"] == webhook["id"]
    # The attempt's HTTP request (the author's access may be resolved through identity first).
    (post,) = [s for s in spans if s.parent_span_id == delivery.span_id and s.name == "POST"]
    assert (post.service, post.kind, post.name) == ("webhooks", "CLIENT", "POST")
    assert post.attributes["http.response.status_code"] == 200
    # The receiver got the HTTP span's context: it may continue the trace.
    assert delivered.headers["traceparent"].split("-")[2] == post.span_id
    assert collector.rejected == []
