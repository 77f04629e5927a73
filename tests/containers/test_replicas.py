"""records runs two replicas from the values: both serve the gateway's calls, and one killed
mid-traffic is restarted while every acknowledged write stays readable."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from typing import Any

import httpx

from crmstack.client import Session, signup
from tests.containers.conftest import ContainerStack

RECORDS = "crm-records"
METRICS = (
    "import urllib.request; "
    "print(urllib.request.urlopen('http://127.0.0.1:9464/metrics', timeout=10).read().decode())"
)
RECOVERY_TIMEOUT = 120.0


def handled_calls(stack: ContainerStack, container: str) -> float:
    """gRPC calls the container has answered (grpc_server_handled_total over all labels)."""
    text = stack.podman("exec", container, "python", "-c", METRICS)
    return sum(
        float(match.group(1))
        for match in re.finditer(r"^grpc_server_handled_total\{[^}]*\} (\S+)$", text, re.M)
    )


def create_person(http: httpx.Client, session: Session, name: str) -> str | None:
    try:
        response = http.post("/rest/people", json={"firstName": name}, headers=session.headers)
    except httpx.HTTPError:
        return None
    return str(response.json()["data"]["id"]) if response.status_code == 201 else None


def first_name(http: httpx.Client, session: Session, person_id: str) -> Any:
    response = http.get(f"/rest/people/{person_id}", headers=session.headers)
    assert response.status_code == 200, response.text
    return response.json()["data"]["firstName"]


def test_both_records_replicas_serve(container_stack: ContainerStack, http: httpx.Client) -> None:
    replicas = container_stack.containers_of(RECORDS)
    (deployment,) = [
        d for d in container_stack.of_kind("Deployment") if d["metadata"]["name"] == RECORDS
    ]
    assert len(replicas) == deployment["spec"]["replicas"] == 2
    before = {name: handled_calls(container_stack, name) for name in replicas}
    session = signup(http)
    created = [create_person(http, session, f"replica-{i}") for i in range(30)]
    assert all(created)
    after = {name: handled_calls(container_stack, name) for name in replicas}
    served = {name: after[name] - before[name] for name in replicas}
    assert all(count > 0 for count in served.values()), served


def test_a_killed_records_container_restarts_and_no_acknowledged_write_is_lost(
    container_stack: ContainerStack, http: httpx.Client
) -> None:
    session = signup(http)
    victim = container_stack.containers_of(RECORDS)[0]
    old_pid = container_stack.inspect("container", victim)["State"]["Pid"]
    acknowledged: dict[str, str] = {}
    stop = threading.Event()

    def write() -> None:
        with httpx.Client(base_url=container_stack.base_url, timeout=30) as client:
            number = 0
            while not stop.is_set():
                name = f"kill-{number}"
                person = create_person(client, session, name)
                if person is not None:
                    acknowledged[person] = name
                number += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        time.sleep(2)
        os.kill(old_pid, signal.SIGKILL)  # the container's main process: a crash, not a stop
        deadline = time.monotonic() + RECOVERY_TIMEOUT
        while True:
            state = container_stack.inspect("container", victim)["State"]
            if state["Running"] and state["Pid"] not in (0, old_pid):
                break
            assert time.monotonic() < deadline, f"{victim} was not restarted: {state}"
            time.sleep(1)
        written = len(acknowledged)
        deadline = time.monotonic() + RECOVERY_TIMEOUT
        while len(acknowledged) < written + 20:  # writes keep succeeding after the restart
            assert time.monotonic() < deadline, "writes did not resume after the restart"
            time.sleep(0.5)
    finally:
        stop.set()
        writer.join(timeout=60)
    assert http.get("/healthz").status_code == 200
    assert len(acknowledged) > 20
    for person, name in acknowledged.items():
        assert first_name(http, session, person) == name
