"""When retries happen (docs/webhooks.md, "Delivery, retries and ordering"), received by
examples/webhook_receiver.py: a due retry is attempted on time while a backlog of fresh
deliveries to the same target drains, and a deliverer killed mid-attempt has its delivery sent
again within a delivery timeout and a few seconds, with both attempts in the delivery log.

The suite runs WEBHOOK_RETRY_DELAYS=1,2,3 and WEBHOOK_TIMEOUT=5 (tests/integration/conftest.py).
"""

from __future__ import annotations

import threading
import time

from crmstack.stack import Stack
from examples.webhook_receiver import Delivery
from tests.integration import webhooks_client
from tests.integration.webhooks_client import Hooks

DELAYS = (1.0, 2.0, 3.0)
TIMEOUT = 5.0


receiver = webhooks_client.receiver
hooks = webhooks_client.hooks


def test_due_retries_are_not_held_back_by_a_backlog_of_fresh_deliveries(hooks: Hooks) -> None:
    webhook = hooks.create(["person.created"])
    answered: list[float] = []  # when each attempt at the failing event was answered
    arrived: list[float] = []

    def handle(delivery: Delivery) -> int:
        if delivery.payload["record"]["firstName"] != "Retry":
            time.sleep(0.08)  # fresh ones: the target's 8 slots drain ~100 a second
            return 200
        arrived.append(time.monotonic())
        status = 500 if len(arrived) <= len(DELAYS) else 200
        answered.append(time.monotonic())
        return status

    hooks.handlers[webhook["path"]] = handle
    try:
        hooks.create_record("person", {"firstName": "Retry"})
        deadline = time.monotonic() + 30
        while not arrived:
            assert time.monotonic() < deadline, "the first attempt did not arrive"
            time.sleep(0.02)
        # ~10 s of fresh deliveries to the same target, queued while the retries fall due.
        for start in range(0, 1000, 100):
            hooks.ws.create_many("person", [{"firstName": f"f{start + i}"} for i in range(100)])
        hooks.wait_events(webhook["path"], 1001, timeout=120)
    finally:
        hooks.handlers.pop(webhook["path"], None)
    assert len(arrived) == len(DELAYS) + 1
    lateness = [arrived[n + 1] - answered[n] - DELAYS[n] for n in range(len(DELAYS))]
    assert min(lateness) > -0.05, lateness  # never early (clocks: the receiver's)
    # Generous for a shared machine: behind the backlog, they were ~5-10 s late.
    assert max(lateness) < 3.0, lateness


def test_a_killed_deliverer_s_attempt_is_sent_again_soon_and_counted(
    hooks: Hooks, local_stack: Stack
) -> None:
    webhook = hooks.create(["company.created"])
    first_arrived = threading.Event()

    def handle(delivery: Delivery) -> int:
        first_arrived.set()
        time.sleep(2)  # the deliverer dies while this attempt waits for its answer
        return 200

    hooks.handlers[webhook["path"]] = handle
    try:
        hooks.create_record("company", {"name": "Crash"})
        assert first_arrived.wait(30), "the first attempt did not arrive"
        local_stack.kill("webhooks")  # SIGKILL: no outcome is written for the attempt
        killed = time.time()
        local_stack.restart("webhooks")
        deadline = time.monotonic() + 60
        # The receiver answers the repeat as a duplicate (it dedupes by event id).
        while len(requests := hooks.receiver.requests(webhook["path"])) < 2:
            assert time.monotonic() < deadline, "the attempt was not sent again"
            time.sleep(0.05)
        [delivery] = hooks.wait_deliveries(webhook["id"], 1, timeout=60)
    finally:
        hooks.handlers.pop(webhook["path"], None)
    # Within a delivery timeout and a few seconds (the lease); generous for a shared machine.
    again = requests[1].received_at - killed
    assert again < TIMEOUT + 7.0, again
    # Both attempts reached the receiver; the log counts both.
    assert delivery["attempts"] == 2
    log = delivery["attemptLog"]
    assert [attempt["attempt"] for attempt in log] == [1, 2]
    assert log[0]["statusCode"] is None
    assert "deliverer stopped" in log[0]["error"]
    assert log[1]["statusCode"] == 200
    assert hooks.rejected(webhook["path"]) == []
