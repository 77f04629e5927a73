"""Workflows under failure: a runner killed mid-run loses no run (the lease runs out and the run
is sent again), and with two runner processes every scheduled tick fires exactly once."""

from __future__ import annotations

import sys
import threading
import time

from crmstack.ports import free_port, wait_for_port
from crmstack.processes import ManagedProcess
from crmstack.stack import Stack
from tests.integration import workflows_client
from tests.integration.workflows_client import (
    DEACTIVATE,
    Flows,
    Request,
    wait_for_api,
)

receiver = workflows_client.receiver
flows = workflows_client.flows


def test_a_runner_killed_mid_run_loses_no_run(flows: Flows, local_stack: Stack) -> None:
    path = flows.path()
    release = threading.Event()
    seen: list[str] = []

    def hold_the_first(request: Request) -> int:
        seen.append(request.json()["name"])
        if len(seen) == 1:
            release.wait(30)  # in flight while the runner is killed
        return 200

    flows.receiver.handlers[path] = hold_the_first
    workflow = flows.create(
        {"type": "RECORD_CREATED", "object": "opportunity"}, path=path, body='{"name": "{{name}}"}'
    )
    try:
        flows.rest("POST", "opportunities", json={"name": "first"})
        flows.receiver.wait(path, 1)
        local_stack.kill("workflows")  # SIGKILL with the request in flight
        release.set()
        for name in ("second", "third", "fourth"):  # queued in JetStream while no runner runs
            flows.rest("POST", "opportunities", json={"name": name})
        local_stack.restart("workflows")
        wait_for_api(flows)
        runs = flows.wait_runs(workflow["id"], 4, "SUCCEEDED", timeout=120)
    finally:
        release.set()
        flows.receiver.handlers.pop(path, None)
    assert sorted(run["triggerEvent"]["record"]["name"] for run in runs) == [
        "first",
        "fourth",
        "second",
        "third",
    ]
    assert len(flows.runs(workflow["id"])) == 4  # one run per event, none lost, none doubled
    # The interrupted run was sent again (at least once), as the same run.
    first = [r for r in flows.receiver.requests(path) if r.json()["name"] == "first"]
    assert len(first) == 2
    assert first[0].headers["x-crm-workflow-run"] == first[1].headers["x-crm-workflow-run"]
    (interrupted,) = [r for r in runs if r["triggerEvent"]["record"]["name"] == "first"]
    assert interrupted["attempts"] == 1  # the killed attempt's outcome was never written


def extra_runner(stack: Stack) -> ManagedProcess:
    """Another workflows process (API and runner) on the running stack."""
    port = free_port()
    process = ManagedProcess(
        name=f"workflows-extra-{port}",
        command=[sys.executable, "-m", "workflows"],
        env={
            **stack.env,
            "GRPC_PORT": str(port),
            "GRPC_HOST": "127.0.0.1",
            "METRICS_PORT": str(free_port()),
            "METRICS_HOST": "127.0.0.1",
        },
        log_path=stack.logs / f"workflows-extra-{port}.log",
    )
    process.start()
    assert wait_for_port(port, 60), process.tail()
    return process


def test_two_runners_fire_each_scheduled_tick_once(flows: Flows, local_stack: Stack) -> None:
    process = extra_runner(local_stack)
    try:
        workflow = flows.create(
            {"type": "SCHEDULED", "cron": "* * * * * *"},  # every second
            body='{"at": "{{scheduledAt}}"}',
        )
        flows.receiver.wait(workflow["path"], 8, timeout=60)
        flows.gql(DEACTIVATE, {"id": workflow["id"]})
        assert process.is_running(), process.tail()
    finally:
        process.stop()
    deadline = time.monotonic() + 30
    while any(run["status"] in ("QUEUED", "RUNNING") for run in flows.runs(workflow["id"])):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    runs = flows.runs(workflow["id"])
    ticks = [run["triggerEvent"]["scheduledAt"] for run in runs]
    assert len(ticks) == len(set(ticks)) >= 8  # one run per tick
    sent = [request.json()["at"] for request in flows.receiver.requests(workflow["path"])]
    assert sorted(sent) == sorted(ticks)  # each tick's request sent once
    assert all(run["status"] == "SUCCEEDED" for run in runs)
