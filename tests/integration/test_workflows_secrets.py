"""A workflow's secrets are write-only: header values and secret query parameters are stored
encrypted, read back masked by every read path (workflow, workflows, mutation answers, run
records, logs), still sent for real, and kept by an update that leaves them masked."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import orjson

from crmstack.stack import Stack
from tests.integration import workflows_client
from tests.integration.workflows_client import (
    CREATE,
    GET,
    LIST,
    TEST,
    UPDATE,
    Flows,
    wait_for_api,
)

MASK = "***"
SECRETS = {
    "query": "QueryS3cretValue",
    "marked": "MarkedS3cretValue",
    "authorization": "Bearer HeaderS3cretOne",
    "custom": "Bearer CustomS3cretTwo",
    "plain": "PlainS3cretThree",
}


receiver = workflows_client.receiver
flows = workflows_client.flows


def _action(flows: Flows, path: str) -> dict[str, Any]:
    url = flows.receiver.url(
        f"{path}?api_token={SECRETS['query']}&q={{{{name}}}}&code={SECRETS['marked']}"
    )
    return {
        "url": url,
        "secretParams": ["code"],
        "headers": {
            "Authorization": SECRETS["authorization"],
            "X-Custom": SECRETS["custom"],
            "X-Plain": SECRETS["plain"],
            "X-Stage": "{{stage}}",
            "Content-Type": "application/json",
        },
        "body": '{"name": "{{name}}"}',
    }


def _assert_no_secret(where: str, value: Any) -> None:
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    for secret in SECRETS.values():
        assert secret.split()[-1] not in text, f"{where} shows {secret!r}: {text}"


def _assert_sent_for_real(request: Any) -> None:
    assert f"api_token={SECRETS['query']}" in request.path
    assert f"code={SECRETS['marked']}" in request.path
    assert request.headers["authorization"] == SECRETS["authorization"]
    assert request.headers["x-custom"] == SECRETS["custom"]
    assert request.headers["x-plain"] == SECRETS["plain"]


def _stored(stack: Stack, workflow_id: str) -> str:
    async def read() -> str:
        connection = await asyncpg.connect(stack.infra.database_url)  # type: ignore[union-attr]
        try:
            row = await connection.fetchrow(
                "SELECT url, headers::text AS headers, encode(secrets, 'escape') AS sealed "
                "FROM workflows.workflows WHERE id = $1::uuid",
                workflow_id,
            )
        finally:
            await connection.close()
        assert row is not None
        return f"{row['url']} {row['headers']} {row['sealed']}"

    return asyncio.run(read())


def test_secrets_are_never_read_back_but_are_sent(flows: Flows, local_stack: Stack) -> None:
    path = flows.path()
    create = {"input": {"name": "Secrets", "trigger": {"type": "RECORD_CREATED",
              "object": "opportunity"}, "action": _action(flows, path)}}  # fmt: skip
    created = flows.gql(CREATE, create)["createWorkflow"]
    _assert_no_secret("createWorkflow", created)
    action = created["action"]
    assert action["headers"] == {
        "Authorization": MASK,
        "X-Custom": MASK,
        "X-Plain": MASK,
        "X-Stage": MASK,
        "Content-Type": "application/json",
    }
    assert action["url"] == flows.receiver.url(
        f"{path}?api_token={MASK}&q={{{{name}}}}&code={MASK}"
    )
    assert action["secretParams"] == ["code"]
    _assert_no_secret("workflow", flows.gql(GET, {"id": created["id"]}))
    _assert_no_secret("workflows", flows.gql(LIST))
    _assert_no_secret("the database", _stored(local_stack, created["id"]))

    run = flows.gql(TEST, {"id": created["id"], "record": {"name": "Acme", "stage": "WON"}})
    run = run["testWorkflow"]
    assert run["status"] == "SUCCEEDED", run
    _assert_no_secret("testWorkflow", run)
    assert run["request"]["headers"]["X-Stage"] == "WON"  # values from the record stay visible
    assert "q=Acme" in run["request"]["url"]
    [sent] = flows.receiver.wait(path, 1)
    _assert_sent_for_real(sent)
    _assert_no_secret("workflowRuns", flows.runs(created["id"]))

    # Saved back as read (masked), with another body: the stored secrets are kept.
    kept = {**action, "body": '{"name": "{{name}}", "again": true}'}
    updated = flows.gql(UPDATE, {"input": {"id": created["id"], "action": kept}})
    _assert_no_secret("updateWorkflow", updated)
    flows.gql(TEST, {"id": created["id"], "record": {"name": "Acme", "stage": "WON"}})
    second = flows.receiver.wait(path, 2)[1]
    assert second.json() == {"name": "Acme", "again": True}
    _assert_sent_for_real(second)

    # A masked value never follows the request to another target.
    elsewhere = {**kept, "url": kept["url"].replace("127.0.0.1", "localhost")}
    error = flows.gql_error(UPDATE, {"input": {"id": created["id"], "action": elsewhere}})
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    assert error["extensions"]["field"] == "action.url"

    for log in sorted(local_stack.logs.glob("*.log")):
        _assert_no_secret(f"log {log.name}", log.read_text(errors="replace"))


def test_workflows_saved_before_secrets_were_sealed_are_read_masked_and_sealed_at_start(
    flows: Flows, local_stack: Stack
) -> None:
    path = flows.path()
    create = {"input": {"name": "Old", "trigger": {"type": "RECORD_CREATED",
              "object": "opportunity"}, "action": _action(flows, path)}}  # fmt: skip
    workflow_id = flows.gql(CREATE, create)["createWorkflow"]["id"]
    action = _action(flows, path)

    async def as_before_the_upgrade() -> None:
        connection = await asyncpg.connect(local_stack.infra.database_url)  # type: ignore[union-attr]
        try:
            await connection.execute(
                "UPDATE workflows.workflows SET url = $2, headers = $3::jsonb, secrets = NULL "
                "WHERE id = $1::uuid",
                workflow_id,
                action["url"],
                orjson.dumps(action["headers"]).decode(),
            )
        finally:
            await connection.close()

    asyncio.run(as_before_the_upgrade())
    read = flows.gql(GET, {"id": workflow_id})["workflow"]
    _assert_no_secret("workflow", read)
    run = flows.gql(TEST, {"id": workflow_id, "record": {"name": "Acme", "stage": "WON"}})
    _assert_no_secret("testWorkflow", run)
    [sent] = flows.receiver.wait(path, 1)
    _assert_sent_for_real(sent)
    assert SECRETS["plain"] in _stored(local_stack, workflow_id)  # still in clear at rest

    local_stack.restart("workflows")  # sealed when the service starts
    wait_for_api(flows)
    _assert_no_secret("the database", _stored(local_stack, workflow_id))
    flows.gql(TEST, {"id": workflow_id, "record": {"name": "Acme", "stage": "WON"}})
    _assert_sent_for_real(flows.receiver.wait(path, 2)[1])
