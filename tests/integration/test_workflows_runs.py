"""Workflows running on their triggers, end to end: records written through the API, requests
received on loopback, runs listed over GraphQL."""

from __future__ import annotations

import httpx

from crmstack.stack import Stack
from tests.integration import workflows_client
from tests.integration.workflows_client import (
    DEACTIVATE,
    Flows,
)

CREATED = {"type": "RECORD_CREATED", "object": "opportunity"}
UPDATED = {"type": "RECORD_UPDATED", "object": "opportunity"}


receiver = workflows_client.receiver
flows = workflows_client.flows


def test_the_chat_example_posts_when_an_opportunity_is_created(flows: Flows) -> None:
    chat = flows.create(CREATED, body='{"text": "New deal: {{name}} ({{amount}})"}')
    idle = flows.create(CREATED, activate=False)  # configured only: never runs
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    deal = flows.rest(
        "POST",
        "opportunities",
        json={"name": 'Rénovation "Tour Eiffel" \\ 🚀', "amount": 1500},
        headers={"traceparent": traceparent},
    )
    (sent,) = flows.receiver.wait(chat["path"], 1)
    assert sent.method == "POST"
    assert sent.json() == {"text": 'New deal: Rénovation "Tour Eiffel" \\ 🚀 (1500)'}
    assert sent.headers["content-type"] == "application/json"
    # The request continues the trace of the write that caused it.
    assert sent.headers["traceparent"].split("-")[1] == traceparent.split("-")[1]
    (run,) = flows.wait_runs(chat["id"], 1, "SUCCEEDED")
    assert run["attempts"] == 1
    assert run["responseStatus"] == 200
    assert run["isTest"] is False
    assert run["durationMs"] >= 0
    assert run["triggerEvent"]["type"] == "opportunity.created"
    assert run["triggerEvent"]["recordId"] == deal["id"]
    assert run["triggerEvent"]["record"]["name"] == deal["name"]
    assert run["request"]["url"] == flows.receiver.url(chat["path"])
    assert run["request"]["body"] == sent.body.decode()
    assert flows.runs(idle["id"]) == []
    assert flows.receiver.requests(idle["path"]) == []


def test_updated_trigger_runs_only_for_records_matching_its_filter(flows: Flows) -> None:
    qualified = flows.create(
        {**UPDATED, "filter": {"stage": {"eq": "QUALIFIED"}}},
        body='{"deal": "{{name}}", "stage": "{{stage}}"}',
    )
    deal = flows.rest("POST", "opportunities", json={"name": "Deal A", "stage": "PROSPECTING"})
    other = flows.rest("POST", "opportunities", json={"name": "Deal B", "stage": "PROSPECTING"})
    flows.rest("PATCH", f"opportunities/{other['id']}", json={"amount": 10})  # no match
    flows.rest("PATCH", f"opportunities/{deal['id']}", json={"stage": "QUALIFIED"})  # match
    (sent,) = flows.receiver.wait(qualified["path"], 1)
    assert sent.json() == {"deal": "Deal A", "stage": "QUALIFIED"}
    (run,) = flows.wait_runs(qualified["id"], 1, "SUCCEEDED")
    assert run["triggerEvent"]["type"] == "opportunity.updated"
    assert run["triggerEvent"]["previousRecord"]["stage"] == "PROSPECTING"
    # Events are handled in order: the non-matching update came first and started nothing.
    assert len(flows.runs(qualified["id"])) == 1
    assert len(flows.receiver.requests(qualified["path"])) == 1


def test_watched_fields_run_only_when_one_of_them_changed(flows: Flows) -> None:
    watched = flows.create({**UPDATED, "fields": ["amount"]}, body='{"amount": {{amount}}}')
    deal = flows.rest("POST", "opportunities", json={"name": "Deal", "amount": 1})
    flows.rest("PATCH", f"opportunities/{deal['id']}", json={"name": "Renamed"})
    flows.rest("PATCH", f"opportunities/{deal['id']}", json={"amount": 2})
    flows.rest("PATCH", f"opportunities/{deal['id']}", json={"name": "Again"})
    flows.rest("PATCH", f"opportunities/{deal['id']}", json={"amount": 3, "name": "Both"})
    sent = flows.receiver.wait(watched["path"], 2)
    flows.wait_runs(watched["id"], 2, "SUCCEEDED")
    assert sorted(request.json()["amount"] for request in sent) == [2, 3]
    assert len(flows.runs(watched["id"])) == 2


def test_relations_fill_dotted_variables_and_urls_encode_values(flows: Flows) -> None:
    workflow = flows.create(
        CREATED,
        body='{"text": "{{name}} at {{company.name}}", "companyId": "{{companyId}}"}',
    )
    path = workflow["path"]
    company = flows.rest("POST", "companies", json={"name": 'Acme "Ünïcode" & Co'})
    flows.rest(
        "POST", "opportunities", json={"name": "Deal", "company": {"connect": company["id"]}}
    )
    (sent,) = flows.receiver.wait(path, 1)
    assert sent.json() == {
        "text": 'Deal at Acme "Ünïcode" & Co',
        "companyId": company["id"],
    }


def metric(stack: Stack, line_start: str) -> float:
    """The value of a sample of the (first) workflows process's /metrics."""
    port = stack.instances["workflows"][0].metrics_port
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(line_start)]
    return sum(values)


def test_failed_attempts_are_retried_with_backoff_then_succeed_or_fail(
    flows: Flows, local_stack: Stack
) -> None:
    retries_before = metric(local_stack, 'workflow_runs_total{status="retry"}')
    flaky_path, dead_path = flows.path(), flows.path()
    answers = iter([500, 502])
    flows.receiver.handlers[flaky_path] = lambda request: next(answers, 200)
    flows.receiver.handlers[dead_path] = lambda request: 500
    flaky = flows.create(CREATED, path=flaky_path)
    dead = flows.create(CREATED, path=dead_path)
    flows.rest("POST", "opportunities", json={"name": "Retried"})
    (run,) = flows.wait_runs(flaky["id"], 1, "SUCCEEDED")
    assert run["attempts"] == 3
    assert run["responseStatus"] == 200
    assert run["error"] is None
    (failed,) = flows.wait_runs(dead["id"], 1, "FAILED")
    assert failed["attempts"] == 4  # the first attempt and three retries
    assert failed["responseStatus"] == 500
    assert failed["error"] == "HTTP 500: not handled"
    sent = flows.receiver.requests(dead_path)
    assert len(sent) == 4
    # Runs by status and their duration are on the service's /metrics.
    assert metric(local_stack, 'workflow_runs_total{status="retry"}') >= retries_before + 5
    assert metric(local_stack, 'workflow_runs_total{status="failed"}') >= 1
    assert metric(local_stack, "workflow_run_duration_seconds_count") >= 7
    # Four attempts of one run (the same origin header names the run).
    assert len({request.headers["x-crm-workflow-run"] for request in sent}) == 1


def test_a_workflows_own_write_does_not_trigger_it_again(flows: Flows) -> None:
    """The action updates the record that triggered it, through the API: the update it makes
    carries the workflow's origin and starts no second run (no loop)."""
    base = flows.client.base_url
    loop = flows.create(
        UPDATED,
        path="/unused",
        body='{"amount": 99}',
        activate=True,
    )
    flows.gql(
        "mutation($input: UpdateWorkflowInput!) { updateWorkflow(input: $input) { id } }",
        {
            "input": {
                "id": loop["id"],
                "action": {
                    "method": "PATCH",
                    "url": f"{base}/rest/opportunities/{{{{id}}}}",
                    "headers": {"Authorization": f"Bearer {flows.admin.access_token}"},
                    "body": '{"amount": 99}',
                },
            }
        },
    )
    deal = flows.rest("POST", "opportunities", json={"name": "Loop", "amount": 1})
    flows.rest("PATCH", f"opportunities/{deal['id']}", json={"name": "Loop 2"})
    (run,) = flows.wait_runs(loop["id"], 1, "SUCCEEDED")
    assert run["responseStatus"] == 200
    assert flows.rest("GET", f"opportunities/{deal['id']}")["amount"] == 99
    # A later change by a person does trigger it; the workflow's own write in between did not.
    flows.rest("PATCH", f"opportunities/{deal['id']}", json={"name": "Loop 3"})
    runs = flows.wait_runs(loop["id"], 2, "SUCCEEDED")
    assert len(flows.runs(loop["id"])) == 2
    assert {r["triggerEvent"]["record"]["name"] for r in runs} == {"Loop 2", "Loop 3"}


def test_a_seconds_cron_fires_on_every_tick_until_deactivated(flows: Flows) -> None:
    workflow = flows.create(
        {"type": "SCHEDULED", "cron": "*/2 * * * * *", "timezone": "Europe/Paris"},
        body='{"at": "{{scheduledAt}}", "workflow": "{{workflowName}}"}',
    )
    assert workflow["nextRunAt"] is not None
    sent = flows.receiver.wait(workflow["path"], 3, timeout=30)
    flows.gql(DEACTIVATE, {"id": workflow["id"]})
    ticks = [request.json()["at"] for request in sent[:3]]
    assert len(set(ticks)) == 3
    assert all(request.json()["workflow"] == workflow["name"] for request in sent)
    runs = flows.runs(workflow["id"])
    assert all(run["triggerEvent"]["type"] == "scheduled" for run in runs)
    keys = [run["triggerEvent"]["scheduledAt"] for run in runs]
    assert len(keys) == len(set(keys))  # one run per tick
    assert flows.gql(
        "query($id: UUID!) { workflow(id: $id) { nextRunAt status } }", {"id": workflow["id"]}
    )["workflow"] == {"nextRunAt": None, "status": "CONFIGURED"}
