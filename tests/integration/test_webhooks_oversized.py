"""Events the relay trimmed for size (over the NATS message limit, 1 MB here) reach webhooks as
docs/webhooks.md says, received and verified by examples/webhook_receiver.py: the record left
out is read again by id and sent when the body fits in 1 MB; a previousRecord left out is sent
as null with `X-Service-Payload-Truncated`; a record too large to send fails the delivery."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from crmstack.stack import Stack
from examples.webhook_receiver import WebhookReceiver
from tests.integration import webhooks_client
from tests.integration.webhooks_client import Hooks, make_hooks

PART = 50_000  # RAW_JSON strings stay under the 64 k text limit: large values come in parts
# The relay leaves `record` out of an envelope over 1,048,576 - 8,192 bytes (records' framing
# allowance); such a record still fits in a 1 MB webhook body.
NEAR_LIMIT = 1_042_500
TRUNCATED = "X-Service-Payload-Truncated"


receiver = webhooks_client.receiver


@pytest.fixture
def hooks(local_stack: Stack, client: httpx.Client, receiver: WebhookReceiver) -> Hooks:
    made = make_hooks(local_stack, client, receiver)
    response = client.post(
        "/metadata",
        json={
            "query": "mutation($input: CreateFieldInput!) { createField(input: $input) { id } }",
            "variables": {
                "input": {
                    "objectMetadataId": made.ws.object_id("person"),
                    "name": "notes",
                    "label": "Notes",
                    "type": "RAW_JSON",
                }
            },
        },
        headers=made.admin.headers,
    )
    assert response.status_code == 200, response.text
    assert not response.json().get("errors"), response.text
    return made


def notes_of(size: int) -> dict[str, list[str]]:
    """A RAW_JSON value of about `size` bytes of JSON."""
    full, rest = divmod(size, PART + 3)
    return {"parts": ["n" * PART] * full + ["r" * rest]}


def create_with_notes(hooks: Hooks, first_name: str, notes: Any) -> dict[str, Any]:
    """Created once the records service knows the new field (metadata reaches it by event)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return hooks.create_record("person", {"firstName": first_name, "notes": notes})
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_record_left_out_of_its_event_is_read_again_and_sent(hooks: Hooks) -> None:
    webhook = hooks.create(["person.created"])
    notes = notes_of(NEAR_LIMIT)
    person = create_with_notes(hooks, "Near", notes)
    [event] = hooks.wait_events(webhook["path"], 1, timeout=60)
    assert hooks.rejected(webhook["path"]) == []  # signature verified on the full body
    assert event.payload["record"] is not None, "record sent as null"
    assert event.payload["record"]["id"] == person["id"]
    assert event.payload["record"]["notes"] == notes
    assert event.payload["previousRecord"] is None
    assert TRUNCATED not in event.headers
    [delivery] = hooks.wait_deliveries(webhook["id"], 1)
    assert delivery["attempts"] == 1


def test_a_600_kb_update_says_previous_record_was_left_out(hooks: Hooks) -> None:
    webhook = hooks.create(["person.updated"])
    notes = notes_of(600_000)
    person = create_with_notes(hooks, "Big", notes)
    hooks.update_record("person", person["id"], {"city": "Paris"})
    [event] = hooks.wait_events(webhook["path"], 1, timeout=60)
    assert hooks.rejected(webhook["path"]) == []
    assert event.payload["record"]["city"] == "Paris"
    assert event.payload["record"]["notes"] == notes
    assert event.payload["previousRecord"] is None
    assert event.headers.get(TRUNCATED) == "previousRecord"


def test_a_record_over_the_payload_limit_fails_instead_of_arriving_empty(hooks: Hooks) -> None:
    webhook = hooks.create(["person.created"])
    create_with_notes(hooks, "Huge", notes_of(1_100_000))
    deadline = time.monotonic() + 60
    while not (listed := hooks.deliveries(webhook["id"], status="FAILED")):
        assert time.monotonic() < deadline, hooks.deliveries(webhook["id"])
        time.sleep(0.3)
    [failed] = listed
    assert "over the 1048576 byte limit" in failed["lastError"]
    assert failed["attempts"] == 1
    assert hooks.receiver.requests(webhook["path"]) == []  # nothing sent, not an empty record
