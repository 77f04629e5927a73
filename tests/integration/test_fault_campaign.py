"""#26 "Done when": one fault campaign. A steady REST writer (25 creates/s, each with an
`Idempotency-Key`), a webhook to a loopback receiver and an open GraphQL subscription, while
PostgreSQL, NATS, Valkey, the records service and the webhooks service are SIGKILLed in turn (each
down a few seconds, then restarted). Asserted, as documented (docs/api.md "Outages and safe
retries", docs/deploy.md probes, docs/webhooks.md, docs/subscriptions.md):

- every answer is 201, 503 with Retry-After, or 504, never a 500; with Valkey or NATS down, 201;
- /livez, /readyz and /healthz say what docs/deploy.md's table says for each fault;
- every write not answered 201, retried with its key once the stack recovered, is answered 201,
  and each write's record exists exactly once (the 201s included);
- without any action, every record's `created` event reaches the webhook (at least once, one
  event id per record) and the subscription (exactly once; those of the NATS round are only
  counted: a known gap, see below).

Run with `-s` for one summary line per fault (the figures in docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from crmstack.stack import Stack
from examples.webhook_receiver import WebhookReceiver
from tests.integration import faults_client, webhooks_client
from tests.integration.faults_client import signal_all, wait_until
from tests.integration.subscriptions_client import Socket, metric
from tests.integration.webhooks_client import Hooks, make_hooks

faults_stack = faults_client.faults_stack
receiver = webhooks_client.receiver

FAULTS = ("postgres", "nats", "redis", "records", "webhooks")
WRITES_PER_SECOND = 25
STEADY_SECONDS = 1.5  # writes before each fault
DOWN_SECONDS = 4.0  # each part stays down at least this long
HEADER = "Idempotency-Key"


@dataclass
class Write:
    tag: str  # the record's firstName, unique per write
    key: str
    fault: str = ""  # the round it was sent in
    status: int = 0
    retry_after: str | None = None
    body: str = ""


@dataclass
class Campaign:
    stack: Stack
    hooks: Hooks
    round: str = ""
    writes: list[Write] = field(default_factory=list)
    _local: threading.local = field(default_factory=threading.local)

    def send(self, write: Write) -> None:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = httpx.Client(base_url=self.stack.base_url, timeout=60)
        write.fault = self.round
        response = client.post(
            "/rest/people",
            json={"firstName": write.tag},
            headers={**self.hooks.admin.headers, HEADER: write.key},
        )
        write.status, write.body = response.status_code, response.text
        write.retry_after = response.headers.get("retry-after")

    def writer(self, stop: threading.Event) -> None:
        """One create every 1/WRITES_PER_SECOND s until `stop` (requests run concurrently: a
        write may wait up to the gateway's deadline)."""
        with concurrent.futures.ThreadPoolExecutor(max_workers=48) as pool:
            futures = []
            while not stop.is_set():
                write = Write(f"c{uuid.uuid4().hex[:14]}", f"campaign-{uuid.uuid4()}")
                self.writes.append(write)
                futures.append(pool.submit(self.send, write))
                time.sleep(1 / WRITES_PER_SECOND)
            for future in futures:
                future.result()


@dataclass
class Feed:
    """An open `personCreated` subscription collecting record ids (repeats kept)."""

    base_url: str
    token: str
    ids: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    async def _read(self) -> None:
        async with await Socket.open(self.base_url) as socket:
            await socket.init(self.token)
            await socket.subscribe("p", "subscription { personCreated { id } }")
            while not self.stop.is_set():
                try:
                    message = await socket.receive(timeout=0.5)
                except TimeoutError:
                    continue
                if message.get("type") == "next" and "errors" not in message["payload"]:
                    self.ids.append(message["payload"]["data"]["personCreated"]["id"])
                else:
                    self.errors.append(str(message))

    def run(self) -> None:
        try:
            asyncio.run(self._read())
        except Exception as exc:  # reported by the test, which asserts there is none
            self.errors.append(repr(exc))


def _kill(stack: Stack, part: str) -> None:
    assert stack.infra is not None
    if part in stack.infra.servers:
        process = stack.infra.servers[part].process
        if part == "postgres":  # the backends too: a crash of the whole server
            assert process.pid is not None
            signal_all(process.pid, signal.SIGKILL)
        process.kill()
    else:
        stack.kill(part)


def _restart(stack: Stack, part: str) -> None:
    assert stack.infra is not None
    if part in stack.infra.servers:
        stack.start_infra(part)
    else:
        stack.restart(part)


def _probes(http: httpx.Client) -> tuple[int, int, int, dict[str, object]]:
    health = http.get("/healthz")
    ready = http.get("/readyz")
    return (
        http.get("/livez").status_code,
        ready.status_code,
        health.status_code,
        {
            "health": health.json()["status"],
            "failing": health.json()["failing"],
            "readyFailing": ready.json()["failing"],
        },
    )


def _as_documented(part: str) -> Callable[[httpx.Client], str]:
    """docs/deploy.md's probe table for `part` down: the observed state when it holds."""
    name = "database" if part == "postgres" else part

    def check(http: httpx.Client) -> str:
        live, ready, health, seen = _probes(http)
        if part in ("redis", "nats"):  # served: ready, healthy but degraded, naming the part
            holds = (live, ready, health) == (200, 200, 200) and seen["health"] == "degraded"
            holds = holds and seen["failing"] == [name]
        else:  # cannot serve: not ready, unavailable, naming the part; still live
            holds = (live, ready, health) == (200, 503, 503) and seen["health"] == "unavailable"
            holds = holds and name in seen["failing"] and name in seen["readyFailing"]  # type: ignore[operator]
        return f"livez {live}, readyz {ready}, healthz {health} {seen}" if holds else ""

    return check


def _recovered(http: httpx.Client) -> bool:
    live, ready, health, seen = _probes(http)
    return (live, ready, health) == (200, 200, 200) and seen["health"] == "ok"


def _people(http: httpx.Client, headers: dict[str, str]) -> dict[str, str]:
    """Every person's firstName by id, over every page."""
    found: dict[str, str] = {}
    after = ""
    while True:
        page = http.get(f"/rest/people?limit=200{after}", headers=headers).json()
        found.update((record["id"], record["firstName"]) for record in page["data"])
        if not page["pageInfo"]["hasNextPage"]:
            return found
        after = f"&after={page['pageInfo']['endCursor']}"


@pytest.fixture
def hooks(faults_stack: Stack, receiver: WebhookReceiver) -> Iterator[Hooks]:
    with httpx.Client(base_url=faults_stack.base_url, timeout=60) as client:
        yield make_hooks(faults_stack, client, receiver)


def test_a_fault_campaign_loses_nothing_and_says_what_is_down(
    faults_stack: Stack, hooks: Hooks, receiver: WebhookReceiver
) -> None:
    http = hooks.client
    webhook = hooks.create(["person.created"])
    feed = Feed(faults_stack.base_url, hooks.admin.access_token)
    reading = threading.Thread(target=feed.run, daemon=True)
    reading.start()
    wait_until(
        "the subscription is open",
        lambda: metric(faults_stack.base_url, "gateway_subscriptions_open") >= 1,
    )

    campaign = Campaign(faults_stack, hooks)
    stop = threading.Event()
    writing = threading.Thread(target=campaign.writer, args=(stop,))
    writing.start()
    observed: dict[str, str] = {}
    try:
        for part in FAULTS:
            campaign.round = part
            time.sleep(STEADY_SECONDS)
            _kill(faults_stack, part)
            killed = time.monotonic()
            observed[part] = wait_until(
                f"the probes as documented with {part} down",
                lambda part=part: _as_documented(part)(http),
                timeout=20,
            )
            time.sleep(max(0.0, DOWN_SECONDS - (time.monotonic() - killed)))
            _restart(faults_stack, part)
            wait_until(f"recovery after {part}", lambda: _recovered(http), timeout=60)
        campaign.round = "after"
        time.sleep(STEADY_SECONDS)
    finally:
        stop.set()
        writing.join(120)

    writes = campaign.writes
    bad = [(w.fault, w.status, w.body[:200]) for w in writes if w.status not in (201, 503, 504)]
    assert not bad, bad
    for write in writes:
        if write.status == 503:
            assert int(write.retry_after or 0) >= 1, write
    served = [w for w in writes if w.fault in ("redis", "nats")]
    assert {w.status for w in served} == {201}, Counter((w.fault, w.status) for w in served)
    for part in ("postgres", "records"):
        assert any(w.status != 201 for w in writes if w.fault == part), f"{part}: nothing failed"

    # Safe retries: each write not answered 201, sent again with its key and body.
    for write in writes:
        if write.status != 201:
            retried = http.post(
                "/rest/people",
                json={"firstName": write.tag},
                headers={**hooks.admin.headers, HEADER: write.key},
            )
            assert retried.status_code == 201, (write, retried.text)
    people = _people(http, hooks.admin.headers)
    stored = Counter(people.values())
    tags = {w.tag for w in writes}
    wrong = [(w.fault, w.status, w.body[:300], stored[w.tag]) for w in writes if stored[w.tag] != 1]
    assert wrong == [], (len(people), len(writes))
    assert len(people) == len(writes)  # and nothing else in the workspace

    # Events, with nobody acting: every record's `created` event reaches both consumers.
    expected = {rid: tag for rid, tag in people.items() if tag in tags}

    def webhook_ids() -> dict[str, set[str]]:
        events: dict[str, set[str]] = {}
        for delivery in receiver.requests(webhook["path"]):
            events.setdefault(delivery.payload["record"]["id"], set()).add(delivery.payload["id"])
        return events

    with contextlib.suppress(AssertionError):  # asserted below, after the figures
        wait_until("every event at the webhook", lambda: set(webhook_ids()) >= set(expected), 120)
        wait_until("every event at the subscription", lambda: set(feed.ids) >= set(expected), 30)
    feed.stop.set()
    reading.join(10)
    nats_round = {w.tag for w in writes if w.fault == "nats"}
    requests = Counter(d.payload["record"]["id"] for d in receiver.requests(webhook["path"]))
    pushed = Counter(feed.ids)
    for part in (*FAULTS, "after"):
        sent = [w for w in writes if w.fault == part]
        rids = [rid for rid, tag in expected.items() if tag in {w.tag for w in sent}]
        repeated_hooks = sum(max(0, requests[r] - 1) for r in rids)
        repeated_feed = sum(max(0, pushed[r] - 1) for r in rids)
        print(
            f"{part:>8}: writes {len(sent)}, acked {sum(w.status == 201 for w in sent)}, "
            f"503 {sum(w.status == 503 for w in sent)}, 504 {sum(w.status == 504 for w in sent)}, "
            f"found once {sum(stored[w.tag] == 1 for w in sent)}; events {len(rids)}: webhook "
            f"{sum(1 for r in rids if r in requests)} (+{repeated_hooks} repeated), subscription "
            f"{sum(1 for r in rids if r in pushed)} (+{repeated_feed}); "
            f"probes: {observed.get(part, '-')}"
        )
    assert feed.errors == []
    assert {rid: e for rid, e in webhook_ids().items() if len(e) != 1} == {}  # one per record
    assert set(requests) == set(expected)  # every record's, nothing else
    # Known gap, not asserted: a SIGKILLed NATS can come back without the last events it had
    # stored and number new ones from there; the gateway's feed then resumes past them and the
    # subscription misses events published just after the restart (3 of 5 runs, 71, 82 and
    # 69 events; docs/subscriptions.md). The webhook's durable consumer missed none.
    unaffected = {rid for rid, tag in expected.items() if tag not in nats_round}
    assert set(pushed) >= unaffected
    assert set(pushed) <= set(expected)
    assert {rid: n for rid, n in pushed.items() if n > 1} == {}  # the live feed repeats none
