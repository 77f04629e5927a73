"""Helpers for workflow tests: a signed-up workspace, its workflows (GraphQL), record writes,
and a receiver on loopback that records every request a workflow sends."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import orjson
import pytest

from crmstack.client import Session, graphql, graphql_data, signup
from crmstack.stack import Stack
from tests.integration.records_client import Workspace
from tests.integration.webhooks_client import attach

WORKFLOW_FIELDS = """id name status createdAt updatedAt lastRunAt nextRunAt
  trigger { type object filter fields cron timezone }
  action { type method url headers body secretParams }"""
RUN_FIELDS = """id workflowId status triggerEvent responseStatus responseExcerpt durationMs
  attempts error isTest createdAt startedAt finishedAt request { method url headers body }"""
CREATE = f"""mutation($input: CreateWorkflowInput!) {{
  createWorkflow(input: $input) {{ {WORKFLOW_FIELDS} }}
}}"""
UPDATE = f"""mutation($input: UpdateWorkflowInput!) {{
  updateWorkflow(input: $input) {{ {WORKFLOW_FIELDS} }}
}}"""
GET = f"query($id: UUID!) {{ workflow(id: $id) {{ {WORKFLOW_FIELDS} }} }}"
LIST = f"""query($status: WorkflowStatus, $first: Int, $after: UUID) {{
  workflows(status: $status, first: $first, after: $after) {{ {WORKFLOW_FIELDS} }}
}}"""
DELETE = "mutation($id: UUID!) { deleteWorkflow(id: $id) }"
ACTIVATE = f"mutation($id: UUID!) {{ activateWorkflow(id: $id) {{ {WORKFLOW_FIELDS} }} }}"
DEACTIVATE = f"mutation($id: UUID!) {{ deactivateWorkflow(id: $id) {{ {WORKFLOW_FIELDS} }} }}"
TEST = f"""mutation($id: UUID!, $record: JSON) {{
  testWorkflow(id: $id, record: $record) {{ {RUN_FIELDS} }}
}}"""
RUNS = f"""query($workflowId: UUID!, $status: WorkflowRunStatus, $first: Int, $after: String) {{
  workflowRuns(workflowId: $workflowId, status: $status, first: $first, after: $after) {{
    edges {{ cursor node {{ {RUN_FIELDS} }} }}
    pageInfo {{ hasNextPage hasPreviousPage startCursor endCursor }}
  }}
}}"""


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # with the query string
    headers: dict[str, str]  # names in lower case
    body: bytes
    peer_port: int = 0  # the client's port: which connection carried the request

    def json(self) -> Any:
        return orjson.loads(self.body)


# Given a request, the status to answer.
Handler = Callable[[Request], int]


@dataclass
class Receiver:
    """An HTTP server on loopback that keeps every request and answers per-path handlers."""

    handlers: dict[str, Handler] = field(default_factory=dict)
    received: list[Request] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> Receiver:
        receiver = self

        class RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                request = Request(
                    self.command,
                    self.path,
                    {key.lower(): value for key, value in self.headers.items()},
                    self.rfile.read(length),
                    self.client_address[1],
                )
                with receiver._lock:
                    receiver.received.append(request)
                    handler = receiver.handlers.get(request.path.split("?")[0])
                status = handler(request) if handler is not None else 200
                data = b"ok" if 200 <= status <= 299 else b"not handled"
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_POST = do_PUT = do_PATCH = do_GET = do_DELETE = _any  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), RequestHandler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def url(self, path: str) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def requests(self, path: str) -> list[Request]:
        with self._lock:
            return [r for r in self.received if r.path.split("?")[0] == path]

    def wait(self, path: str, count: int, timeout: float = 60) -> list[Request]:
        deadline = time.monotonic() + timeout
        while True:
            found = self.requests(path)
            if len(found) >= count:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(found)} of {count} requests reached {path}")
            time.sleep(0.05)


@contextmanager
def running_receiver() -> Iterator[Receiver]:
    receiver = Receiver().start()
    try:
        yield receiver
    finally:
        receiver.stop()


# Shared fixtures: a test module takes them with `receiver = workflows_client.receiver` (and
# `flows = workflows_client.flows`), which gives it its own module-scoped receiver.
@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with running_receiver() as running:
        yield running


@pytest.fixture
def flows(local_stack: Stack, client: httpx.Client, receiver: Receiver) -> Flows:
    return make_flows(local_stack, client, receiver)


@dataclass
class Flows:
    """A workspace with an Admin session, record writes, and a receiver for its workflows."""

    client: httpx.Client
    admin: Session
    ws: Workspace
    receiver: Receiver

    def path(self) -> str:
        return f"/flows/{secrets.token_hex(4)}"

    def gql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        return graphql_data(self.client, self.admin.access_token, query, variables)

    def gql_error(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        response = graphql(self.client, self.admin.access_token, query, variables)
        body = response.json()
        assert body.get("errors"), response.text
        error: dict[str, Any] = body["errors"][0]
        return error

    def create(
        self,
        trigger: dict[str, Any],
        *,
        path: str | None = None,
        body: str = '{"id": "{{id}}"}',
        activate: bool = True,
        **action: Any,
    ) -> dict[str, Any]:
        """A workflow sending to the receiver at `path` (a fresh one by default), active."""
        path = path or self.path()
        workflow: dict[str, Any] = self.gql(
            CREATE,
            {
                "input": {
                    "name": f"flow {path}",
                    "trigger": trigger,
                    "action": {"url": self.receiver.url(path), "body": body, **action},
                }
            },
        )["createWorkflow"]
        if activate:
            workflow = self.gql(ACTIVATE, {"id": workflow["id"]})["activateWorkflow"]
        workflow["path"] = path
        return workflow

    def runs(self, workflow_id: str, **variables: Any) -> list[dict[str, Any]]:
        data = self.gql(RUNS, {"workflowId": workflow_id, "first": 200, **variables})
        return [edge["node"] for edge in data["workflowRuns"]["edges"]]

    def wait_runs(
        self, workflow_id: str, count: int, status: str, timeout: float = 60
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            runs = self.runs(workflow_id, status=status)
            if len(runs) >= count:
                return runs
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{len(runs)} of {count} {status} runs: {self.runs(workflow_id)}"
                )
            time.sleep(0.2)

    # -- records through the API (what a user does) ------------------------------------------
    def rest(
        self, method: str, path: str, headers: dict[str, str] | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        response = self.client.request(
            method, f"/rest/{path}", headers={**self.admin.headers, **(headers or {})}, **kwargs
        )
        assert response.status_code in (200, 201), response.text
        data: dict[str, Any] = response.json()["data"]
        return data


def make_flows(stack: Stack, client: httpx.Client, receiver: Receiver) -> Flows:
    admin = signup(client)
    return Flows(client, admin, attach(stack, admin.workspace_id), receiver)


def wait_for_api(flows: Flows) -> None:
    """Until the gateway reaches a restarted workflows service again (its channel backs off)."""
    deadline = time.monotonic() + 90
    while True:
        response = flows.client.post(
            "/graphql", json={"query": "{ workflows { id } }"}, headers=flows.admin.headers
        )
        if response.status_code == 200 and not response.json().get("errors"):
            return
        assert time.monotonic() < deadline, response.text
        time.sleep(1)
