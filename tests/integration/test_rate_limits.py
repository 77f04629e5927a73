"""The API rate limit (API_RATE_LIMITING_LIMIT calls per API_RATE_LIMITING_TTL, sliding) on a
stack with two gateways sharing one Redis: REST and GraphQL count together whichever gateway
answers, headers on every authenticated response, 429 in both shapes, the window slides, opening
a subscription counts and its events do not, and without Redis calls are still served."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from datetime import datetime

import httpx
import pytest

from crmstack.client import Session, graphql_data, login, signup
from crmstack.stack import Stack
from tests.integration.conftest import gateway_starter
from tests.integration.subscriptions_client import Socket, metric, wait_for_subscriptions

LIMIT = 100  # the scaled stack's API_RATE_LIMITING_LIMIT (the default)
WINDOW_SECONDS = 60
REJECTIONS = "gateway_rate_limit_rejections_total"
FAILURES = "gateway_rate_limit_failures_total"
CREATE_KEY = """mutation($input: CreateApiKeyInput!) {
  createApiKey(input: $input) { id token }
}"""


class Gateway:
    """One gateway process and a kept-alive HTTP client to it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=30)

    def rest(self, token: str) -> httpx.Response:
        return self.http.get(
            "/rest/people", params={"limit": 1}, headers={"Authorization": f"Bearer {token}"}
        )

    def graphql(self, token: str) -> httpx.Response:
        return self.http.post(
            "/graphql",
            json={"query": "{ people(first: 1) { edges { node { id } } } }"},
            headers={"Authorization": f"Bearer {token}"},
        )


def limits(response: httpx.Response) -> tuple[int, int, int]:
    """X-RateLimit-Limit, -Remaining and -Reset of a response (all must be there)."""
    headers = response.headers
    return (
        int(headers["x-ratelimit-limit"]),
        int(headers["x-ratelimit-remaining"]),
        int(headers["x-ratelimit-reset"]),
    )


def rejections(stack: Stack) -> float:
    return sum(metric(url, REJECTIONS) for url in stack.gateway_urls)


@pytest.fixture(scope="module")
def gateways(scaled_stack: Stack) -> Iterator[list[Gateway]]:
    urls = scaled_stack.gateway_urls
    assert len(urls) == 2
    opened = [Gateway(url) for url in urls]
    yield opened
    for gateway in opened:
        gateway.http.close()


@pytest.fixture
def admin(gateways: list[Gateway]) -> Session:
    return signup(gateways[1].http)


def api_key(gateway: Gateway, admin: Session) -> str:
    data = graphql_data(
        gateway.http, admin.access_token, CREATE_KEY, {"input": {"name": "rate limit test"}}
    )
    token: str = data["createApiKey"]["token"]
    return token


def test_the_101st_call_in_a_window_is_refused_across_gateways_rest_and_graphql(
    scaled_stack: Stack, gateways: list[Gateway], admin: Session
) -> None:
    # The admin's key has its own counter (created with the admin's session, which counts 1).
    token = api_key(gateways[0], admin)
    before = rejections(scaled_stack)
    resets = set()
    for number in range(1, LIMIT + 1):
        gateway = gateways[(number // 2) % 2]
        response = gateway.rest(token) if number % 2 else gateway.graphql(token)
        assert response.status_code == 200, (number, response.text)
        limit, remaining, reset = limits(response)
        assert (limit, remaining) == (LIMIT, LIMIT - number), number
        resets.add(reset)
    # The next slot frees when the first call leaves the window: the same moment for all 100.
    assert len(resets) == 1, resets
    (reset,) = resets
    assert time.time() < reset <= math.ceil(time.time()) + WINDOW_SECONDS

    refused = gateways[1].rest(token)
    assert refused.status_code == 429
    assert limits(refused) == (LIMIT, 0, reset)
    body = refused.json()
    assert body["statusCode"] == 429
    assert body["error"] == "Too Many Requests"
    assert set(body) == {"statusCode", "message", "error", "details"}
    assert set(body["details"]) == {"field", "message"}
    retry_after = int(refused.headers["retry-after"])
    assert 1 <= retry_after <= WINDOW_SECONDS

    refused = gateways[0].graphql(token)
    assert refused.status_code == 429
    assert limits(refused) == (LIMIT, 0, reset)
    assert 1 <= int(refused.headers["retry-after"]) <= WINDOW_SECONDS
    error = refused.json()["errors"][0]
    assert error["extensions"]["code"] == "RATE_LIMIT_EXCEEDED"
    reset_at = datetime.fromisoformat(error["extensions"]["resetAt"])
    assert reset_at.utcoffset() is not None
    assert math.ceil(reset_at.timestamp()) == reset

    assert rejections(scaled_stack) - before == 2
    # Another credential of the same workspace counts on its own: the admin's session.
    other = gateways[1].rest(admin.access_token)
    assert other.status_code == 200
    assert limits(other)[:2] == (LIMIT, LIMIT - 2)  # createApiKey, then this call


async def test_concurrent_calls_through_both_gateways_admit_exactly_the_limit(
    gateways: list[Gateway], admin: Session
) -> None:
    token = api_key(gateways[0], admin)
    headers = {"Authorization": f"Bearer {token}"}
    gate = asyncio.Semaphore(16)

    async def call(http: httpx.AsyncClient, number: int) -> int:
        async with gate:
            if number % 2:
                response = await http.get("/rest/people", params={"limit": 1}, headers=headers)
            else:
                response = await http.post(
                    "/graphql",
                    json={"query": "{ people(first: 1) { edges { cursor } } }"},
                    headers=headers,
                )
            return response.status_code

    async with (
        httpx.AsyncClient(base_url=gateways[0].url, timeout=30) as first,
        httpx.AsyncClient(base_url=gateways[1].url, timeout=30) as second,
    ):
        statuses = await asyncio.gather(
            *(call(first if number % 4 < 2 else second, number) for number in range(LIMIT + 30))
        )
    assert sorted(set(statuses)) == [200, 429]
    assert statuses.count(200) == LIMIT
    assert statuses.count(429) == 30


def test_probes_and_refused_credentials_are_not_counted_but_errors_after_auth_are(
    gateways: list[Gateway], admin: Session
) -> None:
    http = gateways[0].http
    assert "x-ratelimit-limit" not in http.get("/healthz").headers
    unauthenticated = http.get("/rest/people")
    assert unauthenticated.status_code == 401
    assert "x-ratelimit-limit" not in unauthenticated.headers
    # Authenticated, then a 404: counted, and the response says so.
    missing = http.get("/rest/nonexistents", headers=admin.headers)
    assert missing.status_code == 404
    assert limits(missing)[:2] == (LIMIT, LIMIT - 1)


def test_calls_with_a_credential_revoked_after_use_are_not_counted(
    gateways: list[Gateway], admin: Session
) -> None:
    """A user's sessions share one counter; once one of them is revoked, its calls are refused
    and take nothing from the others', through REST and GraphQL alike."""
    gateway = gateways[0]
    other = login(gateway.http, admin.email, admin.password, admin.workspace_id)
    assert gateway.rest(admin.access_token).status_code == 200
    logout = gateway.http.post("/auth/logout", json={"refreshToken": admin.refresh_token})
    assert logout.status_code == 204
    for refused in (gateway.rest(admin.access_token), gateway.graphql(admin.access_token)) * 2:
        assert refused.status_code == 401, refused.text
        assert "x-ratelimit-limit" not in refused.headers
    answered = gateway.graphql(other.access_token)
    assert answered.status_code == 200
    assert limits(answered)[:2] == (LIMIT, LIMIT - 2)  # the revoked session's one call, this one


async def test_opening_a_subscription_counts_and_its_events_do_not(
    gateways: list[Gateway], admin: Session
) -> None:
    async with await Socket.open(gateways[0].url) as socket:
        await socket.init(admin.access_token)  # connection_init is not a call
        await socket.subscribe("p", "subscription { personCreated { firstName } }")  # 1 call
        await wait_for_subscriptions(gateways[0].url, 1)
        async with httpx.AsyncClient(
            base_url=gateways[1].url, headers=admin.headers, timeout=30
        ) as http:
            for name in ("A", "B", "C"):  # 3 calls, 3 events
                created = await http.post("/rest/people", json={"firstName": name})
                assert created.status_code == 201, created.text
            for name in ("A", "B", "C"):
                assert await socket.next_data("p") == {"personCreated": {"firstName": name}}
            after = await http.get("/rest/people", params={"limit": 1})
    assert limits(after)[:2] == (LIMIT, LIMIT - 5)


async def test_operations_over_a_socket_beyond_the_limit_get_rate_limit_exceeded(
    gateways: list[Gateway], admin: Session
) -> None:
    token = api_key(gateways[0], admin)
    for number in range(LIMIT):
        assert gateways[number % 2].rest(token).status_code == 200
    async with await Socket.open(gateways[1].url) as socket:
        await socket.init(token)
        await socket.subscribe("p", "subscription { personCreated { id } }")
        message = await socket.receive()
        assert (message["type"], message["id"]) == ("error", "p"), message
        extensions = message["payload"][0]["extensions"]
        assert extensions["code"] == "RATE_LIMIT_EXCEEDED"
        assert datetime.fromisoformat(extensions["resetAt"]).timestamp() > time.time()


@pytest.fixture
def short_window_gateway(scaled_stack: Stack) -> Iterator[Gateway]:
    """A third gateway on the scaled stack with a 6-second window of 3 calls."""
    with gateway_starter(scaled_stack) as start:
        gateway = Gateway(start({"API_RATE_LIMITING_TTL": "6000", "API_RATE_LIMITING_LIMIT": "3"}))
        yield gateway
        gateway.http.close()


def test_the_window_slides_a_slot_frees_when_the_oldest_call_leaves(
    short_window_gateway: Gateway, gateways: list[Gateway]
) -> None:
    token = signup(gateways[0].http).access_token
    short = short_window_gateway
    first = short.rest(token)
    assert limits(first)[:2] == (3, 2)
    time.sleep(3)  # the next two calls enter the window 3 s after the first
    assert limits(short.graphql(token))[:2] == (3, 1)
    assert limits(short.rest(token))[:2] == (3, 0)
    refused = short.graphql(token)
    assert refused.status_code == 429
    first_leaves = limits(refused)[2]
    assert first_leaves == limits(first)[2]

    time.sleep(max(0.0, first_leaves - time.time()) + 0.2)
    # The first call has left; the other two are still in the window. A fixed window that
    # began with the first call would have reset here and offered all 3 slots.
    freed = short.rest(token)
    assert freed.status_code == 200, freed.text
    assert limits(freed)[:2] == (3, 0)
    refused = short.rest(token)
    assert refused.status_code == 429
    assert limits(refused)[2] > first_leaves  # now the second call's exit frees the next slot


def test_without_redis_calls_are_served_and_the_failures_counted(
    scaled_stack: Stack, gateways: list[Gateway], admin: Session
) -> None:
    if scaled_stack.infra is None or "redis" not in scaled_stack.infra.servers:
        pytest.skip("Redis is an external server (REDIS_URL): the test cannot stop it")
    before = [metric(gateway.url, FAILURES) for gateway in gateways]
    scaled_stack.stop_infra("redis")
    try:
        for number in range(6):
            gateway = gateways[number // 3]
            token = admin.access_token
            response = gateway.rest(token) if number % 2 else gateway.graphql(token)
            assert response.status_code == 200, response.text
            assert "x-ratelimit-remaining" not in response.headers  # no count to report
    finally:
        scaled_stack.start_infra("redis")
    after = [metric(gateway.url, FAILURES) for gateway in gateways]
    assert after[0] - before[0] >= 3, (before, after)
    assert after[1] - before[1] >= 3, (before, after)
    deadline = time.monotonic() + 30
    while "x-ratelimit-remaining" not in gateways[0].rest(admin.access_token).headers:
        assert time.monotonic() < deadline, "the limiter did not resume after Redis came back"
        time.sleep(0.5)
