"""Services scale independently: on a stack with two gateways and two webhook deliverers
(`scaled_stack`), the rate limit is one limit whichever gateway answers, a subscription opened on
either gateway sees records created through the other, and webhook events are all delivered
while one deliverer is killed mid-run."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator

import httpx
import pytest

from crmstack.client import Session, signup
from crmstack.stack import Stack
from examples.webhook_receiver import Delivery, WebhookReceiver
from tests.integration.events_client import listen
from tests.integration.subscriptions_client import Socket, metric
from tests.integration.webhooks_client import (
    deliverer_metric,
    make_hooks,
    running_receiver,
    skipped,
    wait_skipped,
)

LIMIT = 100  # the scaled stack's API_RATE_LIMITING_LIMIT
EVENTS = 50


@pytest.fixture(scope="module")
def gateways(scaled_stack: Stack) -> list[str]:
    urls = scaled_stack.gateway_urls
    assert len(urls) == 2
    assert len(scaled_stack.instances["webhooks"]) == 2
    return urls


@pytest.fixture
def admin(gateways: list[str]) -> Session:
    with httpx.Client(base_url=gateways[0], timeout=30) as http:
        return signup(http)


def create_person(base_url: str, admin: Session, first_name: str) -> str:
    response = httpx.post(
        base_url + "/rest/people",
        json={"firstName": first_name},
        headers=admin.headers,
        timeout=30,
    )
    assert response.status_code == 201, response.text
    record_id: str = response.json()["data"]["id"]
    return record_id


def test_the_rate_limit_is_shared_by_both_gateways(gateways: list[str], admin: Session) -> None:
    with (
        httpx.Client(base_url=gateways[0], headers=admin.headers, timeout=30) as first,
        httpx.Client(base_url=gateways[1], headers=admin.headers, timeout=30) as second,
    ):
        for number, http in zip(range(1, LIMIT + 1), itertools.cycle([first, second])):
            response = http.get("/rest/people", params={"limit": 1})
            assert response.status_code == 200, (number, response.text)
            assert int(response.headers["x-ratelimit-remaining"]) == LIMIT - number
        # 50 calls through each: each gateway alone saw half the limit, yet both refuse now.
        for http in (first, second):
            refused = http.get("/rest/people", params={"limit": 1})
            assert refused.status_code == 429
            assert refused.headers["x-ratelimit-remaining"] == "0"


async def open_subscription(base_url: str, admin: Session) -> Socket:
    socket = await Socket.open(base_url)
    await socket.init(admin.access_token)
    before = await asyncio.to_thread(metric, base_url, "gateway_subscriptions_open")
    await socket.subscribe("p", "subscription { personCreated { id firstName } }")
    deadline = time.monotonic() + 30
    while await asyncio.to_thread(metric, base_url, "gateway_subscriptions_open") <= before:
        assert time.monotonic() < deadline, "the subscription was not registered"
        await asyncio.sleep(0.1)
    return socket


async def test_subscriptions_see_records_created_through_the_other_gateway(
    gateways: list[str], admin: Session
) -> None:
    on_first = await open_subscription(gateways[0], admin)
    on_second = await open_subscription(gateways[1], admin)
    try:
        through_second = await asyncio.to_thread(create_person, gateways[1], admin, "Second")
        through_first = await asyncio.to_thread(create_person, gateways[0], admin, "First")
        for socket in (on_first, on_second):
            assert await socket.next_data("p") == {
                "personCreated": {"id": through_second, "firstName": "Second"}
            }
            assert await socket.next_data("p") == {
                "personCreated": {"id": through_first, "firstName": "First"}
            }
    finally:
        await on_first.connection.close()
        await on_second.connection.close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[WebhookReceiver]:
    with running_receiver() as running:
        yield running


def delivered(stack: Stack, replica: int) -> float:
    return deliverer_metric(stack, 'webhook_deliveries_total{outcome="delivered"}', replica)


def test_every_webhook_event_arrives_when_a_deliverer_is_killed_mid_run(
    scaled_stack: Stack, gateways: list[str], receiver: WebhookReceiver
) -> None:
    with httpx.Client(base_url=gateways[0], timeout=30) as http:
        hooks = make_hooks(scaled_stack, http, receiver)
        webhook = hooks.create(["person.created"])

    def slow(delivery: Delivery) -> int:
        time.sleep(0.05)  # deliveries take a while, so some are in flight at the kill
        return 200

    hooks.handlers[webhook["path"]] = slow
    created: list[str] = []
    killed: int | None = None
    try:
        for number in range(EVENTS):
            created.append(create_person(gateways[number % 2], hooks.admin, f"P{number}"))
            if number == EVENTS // 2:
                hooks.wait_events(webhook["path"], 5)
                # Kill the busier deliverer (SIGKILL: its claims and unacknowledged events are
                # abandoned, not handed over).
                counts = [delivered(scaled_stack, replica) for replica in (0, 1)]
                killed = counts.index(max(counts))
                assert counts[killed] > 0, counts
                scaled_stack.kill("webhooks", killed)
        events = hooks.wait_events(webhook["path"], EVENTS, timeout=180)
    finally:
        hooks.handlers.pop(webhook["path"], None)
        if killed is not None:
            scaled_stack.restart("webhooks", killed)
    ids = {event.payload["id"] for event in events}
    assert len(ids) == EVENTS  # distinct event ids: each event at least once, deduplicated
    assert sorted(event.payload["record"]["id"] for event in events) == sorted(created)


def test_a_webhook_created_after_events_gets_every_later_one_on_both_deliverers(
    scaled_stack: Stack, gateways: list[str], receiver: WebhookReceiver
) -> None:
    with httpx.Client(base_url=gateways[0], timeout=30) as http:
        hooks = make_hooks(scaled_stack, http, receiver)
        # Both deliverers take events of this workspace while it has no webhook (skipped); they
        # are published because a subscriber's lease listens there.
        listen(scaled_stack, hooks.ws.id)
        before = skipped(scaled_stack)
        for number in range(10):
            create_person(gateways[number % 2], hooks.admin, f"Before {number}")
        wait_skipped(scaled_stack, before + 10)
        webhook = hooks.create(["person.created"])
    created = [create_person(gateways[n % 2], hooks.admin, f"After {n}") for n in range(EVENTS)]
    events = hooks.wait_events(webhook["path"], EVENTS, timeout=120)
    assert sorted(event.payload["record"]["id"] for event in events) == sorted(created)
