"""Webhook deliveries end to end, received by examples/webhook_receiver.py on loopback: every
request's signature and timestamp verified, the spec's payload, wildcard matching, retries at
the configured delays, redelivery, secret rotation, timeouts and a slow endpoint."""

from __future__ import annotations

import secrets
import time
from datetime import datetime

import pytest

from crmstack.stack import Stack
from examples.webhook_receiver import Delivery
from tests.integration import webhooks_client
from tests.integration.events_client import listen, wait_until
from tests.integration.webhooks_client import (
    REDELIVER,
    ROTATE,
    UPDATE,
    Hooks,
    deliverer_metric,
    skipped,
    wait_skipped,
)

receiver = webhooks_client.receiver
hooks = webhooks_client.hooks


PAYLOAD_KEYS = ["id", "workspaceId", "webhookId", "operation", "timestamp", "record",
                "previousRecord"]  # fmt: skip


def test_deliveries_are_signed_and_carry_the_spec_payload(hooks: Hooks) -> None:
    webhook = hooks.create(["person.*"])
    person = hooks.create_record("person", {"firstName": "Ada", "city": "London"})
    hooks.update_record("person", person["id"], {"city": "Paris"})
    deleted = hooks.delete_record("person", person["id"])

    events = hooks.wait_events(webhook["path"], 3)
    assert hooks.rejected(webhook["path"]) == []  # every request passed verify()
    created, updated, removed = sorted(events, key=lambda d: d.payload["timestamp"])
    for delivery in events:
        payload = delivery.payload
        assert list(payload) == PAYLOAD_KEYS
        assert payload["workspaceId"] == hooks.ws.id
        assert payload["webhookId"] == webhook["id"]
        assert payload["record"]["id"] == person["id"]
        assert datetime.fromisoformat(payload["timestamp"].replace("Z", "+00:00"))
        sent_at = int(delivery.headers["X-Service-Timestamp"])
        assert abs(sent_at - delivery.received_at) < 300
        assert delivery.headers["X-Service-Signature"].startswith("sha256=")
        assert delivery.headers["Content-Type"] == "application/json"
    assert len({d.payload["id"] for d in events}) == 3

    assert created.payload["operation"] == "person.created"
    assert created.payload["previousRecord"] is None
    assert created.payload["record"]["firstName"] == "Ada"

    assert updated.payload["operation"] == "person.updated"
    assert updated.payload["previousRecord"]["city"] == "London"
    assert updated.payload["record"]["city"] == "Paris"

    assert removed.payload["operation"] == "person.deleted"
    assert removed.payload["record"]["deletedAt"] == deleted["deletedAt"]
    assert removed.payload["record"]["deletedAt"] is not None
    assert removed.payload["previousRecord"]["deletedAt"] is None

    listed = hooks.wait_deliveries(webhook["id"], 3)
    assert len(hooks.deliveries(webhook["id"])) == 3
    assert {d["eventId"] for d in listed} == {d.payload["id"] for d in events}
    for row in listed:
        assert row["attempts"] == 1
        assert row["nextAttemptAt"] is None
        assert row["lastStatusCode"] == 200
        [attempt] = row["attemptLog"]
        assert attempt["attempt"] == 1
        assert attempt["statusCode"] == 200
        assert attempt["error"] is None
        assert attempt["latencyMs"] >= 0


def test_operations_match_with_wildcards(hooks: Hooks) -> None:
    names = ["person.*", "*.*", "*.created", "company.updated", "opportunity.deleted",
             "person.created"]  # fmt: skip
    made = {name: hooks.create([name]) for name in names}
    person = hooks.create_record("person", {"firstName": "W"})
    hooks.update_record("person", person["id"], {"firstName": "X"})
    company = hooks.create_record("company", {"name": "Acme"})
    hooks.update_record("company", company["id"], {"name": "Acme 2"})
    hooks.delete_record("company", company["id"])
    everything = ["person.created", "person.updated", "company.created", "company.updated",
                  "company.deleted"]  # fmt: skip
    hooks.wait_events(made["*.*"]["path"], len(everything))
    # Every event's deliveries are queued together, so the other webhooks' rows exist by now.
    expected = {
        "person.*": ["person.created", "person.updated"],
        "*.*": everything,
        "*.created": ["person.created", "company.created"],
        "company.updated": ["company.updated"],
        "opportunity.deleted": [],
        "person.created": ["person.created"],
    }
    for name, operations in expected.items():
        listed = hooks.deliveries(made[name]["id"])
        assert sorted(d["operation"] for d in listed) == sorted(operations), name
        received = hooks.wait_events(made[name]["path"], len(operations))
        assert sorted(d.payload["operation"] for d in received) == sorted(operations), name
        assert hooks.rejected(made[name]["path"]) == []


def test_a_webhook_gets_the_events_committed_after_it_is_created_or_widened(
    hooks: Hooks, local_stack: Stack
) -> None:
    # Before the workspace has a webhook its events are taken and acknowledged unwritten (they
    # are published: a subscriber's lease listens; without one they would not be, see
    # test_events_interest.py).
    listen(local_stack, hooks.ws.id)
    before = skipped(local_stack)
    early = hooks.create_record("person", {"firstName": "Early"})
    wait_skipped(local_stack, before + 1)
    webhook = hooks.create(["company.created"])
    hooks.create_record("person", {"firstName": "Not wanted yet"})
    company = hooks.create_record("company", {"name": "Wanted"})
    hooks.wait_events(webhook["path"], 1)
    hooks.gql(
        UPDATE,
        {"input": {"id": webhook["id"], "operations": ["company.created", "person.created"]}},
    )
    later = hooks.create_record("person", {"firstName": "After the update"})
    events = hooks.wait_events(webhook["path"], 2)
    received = sorted(e.payload["record"]["id"] for e in events)
    assert received == sorted([company["id"], later["id"]])
    assert early["id"] not in received
    assert len(hooks.wait_deliveries(webhook["id"], 2)) == 2  # nothing else was queued


class Failing:
    """A handler answering `status` for the first `times` calls, then 200."""

    def __init__(self, times: int, status: int = 500) -> None:
        self.times = times
        self.status = status
        self.calls: list[float] = []

    def __call__(self, delivery: Delivery) -> int:
        self.calls.append(delivery.received_at)
        return self.status if len(self.calls) <= self.times else 200


def test_a_receiver_failing_twice_gets_exactly_three_attempts_at_the_delays(
    hooks: Hooks,
) -> None:
    webhook = hooks.create(["person.created"])
    handler = Failing(2)
    hooks.handlers[webhook["path"]] = handler
    hooks.create_record("person", {"firstName": "Retry"})
    [event] = hooks.wait_events(webhook["path"], 1, timeout=90)
    time.sleep(1.5)  # a wrong extra attempt would come within the next delays
    calls = handler.calls
    assert len(calls) == 3
    assert len(hooks.receiver.requests(webhook["path"])) == 3
    # WEBHOOK_RETRY_DELAYS=1,2,3 in the suite: never earlier than the configured delay.
    assert calls[1] - calls[0] >= 1.0
    assert calls[2] - calls[1] >= 2.0
    [delivery] = hooks.deliveries(webhook["id"])
    assert delivery["status"] == "DELIVERED"
    assert delivery["attempts"] == 3
    assert [a["statusCode"] for a in delivery["attemptLog"]] == [500, 500, 200]
    assert [a["attempt"] for a in delivery["attemptLog"]] == [1, 2, 3]
    assert delivery["attemptLog"][0]["error"].startswith("HTTP 500")
    assert delivery["attemptLog"][2]["error"] is None
    assert delivery["eventId"] == event.payload["id"]
    assert hooks.rejected(webhook["path"]) == []


def test_exhausted_retries_fail_and_redelivery_sends_the_event_again(hooks: Hooks) -> None:
    webhook = hooks.create(["company.created"])
    handler = Failing(1000, status=503)
    hooks.handlers[webhook["path"]] = handler
    hooks.create_record("company", {"name": "Never"})
    deadline = time.monotonic() + 90
    while True:
        listed = hooks.deliveries(webhook["id"])
        if listed and listed[0]["status"] == "FAILED":
            break
        assert time.monotonic() < deadline, listed
        time.sleep(0.5)
    [failed] = listed
    assert failed["attempts"] == 4  # the first attempt and three retries
    assert failed["nextAttemptAt"] is None
    assert [a["statusCode"] for a in failed["attemptLog"]] == [503] * 4
    assert len(handler.calls) == 4
    assert hooks.deliveries(webhook["id"], status="PENDING") == []
    assert len(hooks.deliveries(webhook["id"], status="FAILED")) == 1

    hooks.handlers[webhook["path"]] = lambda delivery: 200
    again = hooks.gql(REDELIVER, {"id": failed["id"]})["redeliverWebhookEvent"]
    assert again["redeliveryOf"] == failed["id"]
    assert again["eventId"] == failed["eventId"]
    assert again["status"] == "PENDING"
    [event] = hooks.wait_events(webhook["path"], 1)
    assert event.payload["id"] == failed["eventId"]
    [delivered] = hooks.wait_deliveries(webhook["id"], 1)
    assert delivered["id"] == again["id"]
    assert delivered["attempts"] == 1
    # Redelivering a delivered event sends it once more; the receiver dedupes it by id.
    hooks.gql(REDELIVER, {"id": delivered["id"]})
    deadline = time.monotonic() + 30
    while len(hooks.receiver.requests(webhook["path"])) < 6:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert len(hooks.receiver.events(webhook["path"])) == 1
    assert hooks.rejected(webhook["path"]) == []


def test_rotating_the_secret_signs_with_the_new_one_at_once(hooks: Hooks) -> None:
    webhook = hooks.create(["person.created"])
    hooks.create_record("person", {"firstName": "Before"})
    hooks.wait_events(webhook["path"], 1)
    rotated = hooks.gql(ROTATE, {"id": webhook["id"]})["rotateWebhookSecret"]
    assert rotated["secret"].startswith("whsec_")
    assert rotated["secret"] != webhook["secret"]
    assert hooks.gql("{ webhooks { id secret } }")["webhooks"] == [
        {"id": webhook["id"], "secret": None}
    ]
    # The receiver still holds the old secret: the next delivery fails verification...
    hooks.create_record("person", {"firstName": "After"})
    deadline = time.monotonic() + 30
    while not hooks.rejected(webhook["path"]):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert hooks.rejected(webhook["path"])[0] == "the signature does not match"
    # ...and passes once the receiver knows the new one (the retry).
    hooks.receiver.set_secret(webhook["path"], rotated["secret"])
    events = hooks.wait_events(webhook["path"], 2, timeout=60)
    assert events[-1].payload["record"]["firstName"] == "After"
    after = [d for d in hooks.deliveries(webhook["id"]) if d["eventId"] == events[-1].payload["id"]]
    assert after[0]["attemptLog"][0]["statusCode"] == 401


def test_an_attempt_without_answer_in_time_fails_and_is_retried(hooks: Hooks) -> None:
    webhook = hooks.create(["person.created"])
    slow_once: list[int] = []

    def handle(delivery: Delivery) -> int:
        slow_once.append(1)
        if len(slow_once) == 1:
            time.sleep(6)  # WEBHOOK_TIMEOUT is 5 s in the suite
        return 200

    hooks.handlers[webhook["path"]] = handle
    hooks.create_record("person", {"firstName": "Slow"})
    listed = hooks.wait_deliveries(webhook["id"], 1)
    attempts = listed[0]["attemptLog"]
    assert len(attempts) == 2
    assert attempts[0]["statusCode"] is None
    assert attempts[0]["error"] == "no answer within 5 s"
    assert attempts[0]["latencyMs"] >= 4500  # about the timeout (clocks differ by a little)
    assert attempts[1]["statusCode"] == 200


def test_a_slow_endpoint_does_not_delay_the_others(hooks: Hooks) -> None:
    slow = hooks.create(["person.created"])
    fast = hooks.create(["person.created"])
    with hooks.stalled(slow["path"], 4):
        hooks.ws.create_many("person", [{"firstName": f"p{i}"} for i in range(30)])
        hooks.wait_events(fast["path"], 30, timeout=60)
        # The slow endpoint has at most its per-target share in flight (8) and each takes 4 s.
        assert len(hooks.receiver.events(slow["path"])) < 30
    hooks.wait_events(slow["path"], 30, timeout=90)
    hooks.gql(UPDATE, {"input": {"id": slow["id"], "isActive": False}})


def test_the_pending_gauge_counts_the_deliveries_waiting_for_an_attempt(
    hooks: Hooks, local_stack: Stack
) -> None:
    """First attempts waiting behind a stalled endpoint's slots and those in flight both count."""
    webhook = hooks.create(["person.created"])
    with hooks.stalled(webhook["path"], 30):
        hooks.ws.create_many("person", [{"firstName": f"q{i}"} for i in range(30)])
        wait_until(
            lambda: deliverer_metric(local_stack, "webhook_deliveries_pending") >= 30,
            30,
            "the pending gauge did not count the 30 waiting deliveries",
        )
    hooks.wait_events(webhook["path"], 30, timeout=90)
    hooks.gql(UPDATE, {"input": {"id": webhook["id"], "isActive": False}})


@pytest.mark.parametrize("flags", ["00", "01"], ids=["unsampled", "sampled"])
def test_a_delivery_continues_the_trace_of_the_call_that_caused_it(
    hooks: Hooks, flags: str
) -> None:
    """With no exporter configured, an unsampled trace is not recorded anywhere, yet its id
    still reaches the receiver (and every log line on the way)."""
    webhook = hooks.create(["company.created"])
    trace_id = secrets.token_hex(16)
    response = hooks.client.post(
        "/rest/companies",
        json={"name": "Traced Ltd"},
        headers={
            "Authorization": f"Bearer {hooks.admin.access_token}",
            "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-{flags}",
        },
    )
    assert response.status_code == 201, response.text
    (delivered,) = hooks.wait_events(webhook["path"], 1)
    assert delivered.headers["traceparent"].split("-")[1] == trace_id
