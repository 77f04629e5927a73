"""examples/paging_client.py pages through a list larger than the rate limit allows in one
window and gets every record exactly once, waiting as the 429 answers say. A gateway of its own
with a short window (30 calls per 5 s) keeps it to seconds; the client reads the same headers
whatever the window (the default, 100 per 60 s, is checked in test_rate_limits.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from crmstack.client import signup
from examples.paging_client import RestClient, iter_records, retry_delay

LIMIT, WINDOW_MS = 30, 5000
RECORDS = 45


def test_pages_through_a_list_over_the_rate_limit_backing_off_on_429(
    extra_gateway: Callable[[dict[str, str]], str],
) -> None:
    url = extra_gateway(
        {"API_RATE_LIMITING_LIMIT": str(LIMIT), "API_RATE_LIMITING_TTL": str(WINDOW_MS)}
    )
    with httpx.Client(base_url=url, timeout=30) as http:
        session = signup(http)  # /auth/* is not counted
        created = http.post(
            "/rest/batch/companies",
            json=[{"name": f"Company {i:03}"} for i in range(RECORDS)],
            headers=session.headers,
        )
        assert created.status_code == 201, created.text
    client = RestClient(url, session.access_token, on_wait=lambda _: None)
    started = time.monotonic()
    names = [r["name"] for r in iter_records(client, "companies", limit=1)]
    elapsed = time.monotonic() - started

    assert sorted(names) == [f"Company {i:03}" for i in range(RECORDS)]  # each exactly once
    assert client.waits, f"{RECORDS} calls within a {LIMIT}-call window must have been refused"
    assert all(0 < wait <= WINDOW_MS / 1000 for wait in client.waits), client.waits
    assert elapsed >= min(client.waits)  # it did wait before asking again


def test_retry_delay_prefers_retry_after_then_the_reset_time() -> None:
    assert retry_delay({"Retry-After": "17", "X-RateLimit-Reset": "2000000000"}) == 17
    assert retry_delay({"X-RateLimit-Reset": "1000"}, now=990.5) == 9.5
    assert retry_delay({"X-RateLimit-Reset": "1000"}, now=1000) == 1.0
    assert retry_delay({}) == 1.0
    assert retry_delay({"retry-after": "3"}) == 3
