"""Every process's /metrics after some traffic, against the reference in docs/observability.md:
each documented metric is served, with its documented type, by each process the document names,
and no process serves a metric the document does not list."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from crmstack.stack import GATEWAY, Stack
from examples.webhook_receiver import WebhookReceiver
from tests.integration.webhooks_client import make_hooks, running_receiver
from tests.metrics_reference import documented

_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$")

# Metrics of work merged from other branches: required once the code that serves them is here
# (the module named), so the check tightens by itself when that work is merged. The workflows
# service's pool gauges need one line in its serve() (`observe_pools`), added with that work.
_POOL = ("db_pool_connections", "db_pool_connections_in_use", "db_pool_connections_idle",
         "db_pool_connections_max")  # fmt: skip
_SERVED_WITH: dict[tuple[str, str], str] = {
    ("gateway_rate_limit_rejections_total", "gateway"): "gateway.ratelimit",
    ("gateway_rate_limit_failures_total", "gateway"): "gateway.ratelimit",
    **{(name, "workflows"): "workflows.metrics" for name in _POOL},
    **{
        (name, "workflows"): "workflows.metrics"
        for name in (
            "workflow_events_consumed_total",
            "workflow_runs_queued_total",
            "workflow_runs_total",
            "workflow_run_duration_seconds",
            "workflow_trigger_to_request_seconds",
            "workflow_runs_in_flight",
        )
    },
}


def expected(process: str) -> dict[str, str]:
    """Documented metric name -> type, for `process`, leaving out what is not merged yet."""
    wanted = {}
    for row in documented():
        needs = _SERVED_WITH.get((row.name, process))
        if process in row.processes and (needs is None or importlib.util.find_spec(needs)):
            wanted[row.name] = row.type
    return wanted


def scrape(stack: Stack, process: str) -> dict[str, tuple[str, list[tuple[dict[str, str], float]]]]:
    """Metric name, as on its `# TYPE` line -> (type, samples). The `_created` timestamps
    prometheus_client adds beside each counter and histogram are left out."""
    instance = stack.instances[process][0]
    text = httpx.get(f"http://127.0.0.1:{instance.metrics_port}/metrics", timeout=10).text
    types = {}
    for line in text.splitlines():
        match = _TYPE.match(line)
        if match and not match.group(1).endswith("_created"):
            types[match.group(1)] = match.group(2)
    samples: dict[str, list[tuple[dict[str, str], float]]] = {name: [] for name in types}
    for family in text_string_to_metric_families(text):
        name = family.name + "_total" if family.type == "counter" else family.name
        if name in samples:
            samples[name] = [(sample.labels, sample.value) for sample in family.samples]
    return {name: (kind, samples[name]) for name, kind in types.items()}


def value(samples: list[tuple[dict[str, str], float]], **labels: str) -> float:
    return sum(v for got, v in samples if all(got.get(k) == want for k, want in labels.items()))


@pytest.fixture(scope="module")
def receiver() -> Iterator[WebhookReceiver]:
    with running_receiver() as running:
        yield running


@pytest.fixture(scope="module")
def traffic(stack: Stack | None, client: httpx.Client, receiver: WebhookReceiver) -> None:
    """A workspace with a webhook, a REST create and read, a GraphQL query and one delivery."""
    if stack is None:
        pytest.skip("needs the local launcher: it reads each process's own metrics port")
    hooks = make_hooks(stack, client, receiver)
    webhook = hooks.create(["person.created"])
    headers = hooks.admin.headers
    created = client.post("/rest/people", json={"firstName": "Ada"}, headers=headers)
    assert created.status_code == 201, created.text
    person = created.json()["data"]["id"]
    assert client.get(f"/rest/people/{person}", headers=headers).status_code == 200
    query = client.post("/graphql", json={"query": "{ apiVersion }"}, headers=headers)
    assert query.status_code == 200
    hooks.wait_events(webhook["path"], 1)


def test_the_reference_lists_every_process() -> None:
    processes = set().union(*(row.processes for row in documented()))
    assert processes == {"gateway", "identity", "metadata", "records", "webhooks", "workflows"}
    names = [row.name for row in documented()]
    assert len(names) == len(set(names)), "a metric is listed twice"
    for name, kind in ((row.name, row.type) for row in documented()):
        assert (kind == "counter") == name.endswith("_total"), name


@pytest.mark.parametrize(
    "process", ["gateway", "identity", "metadata", "records", "webhooks", "workflows"]
)
def test_each_process_serves_exactly_the_documented_metrics(
    local_stack: Stack, traffic: None, process: str
) -> None:
    served = scrape(local_stack, process)
    wanted = expected(process)
    missing = sorted(name for name in wanted if name not in served)
    wrong_type = sorted(n for n, t in wanted.items() if n in served and served[n][0] != t)
    undocumented = sorted(name for name in served if name not in {row.name for row in documented()})
    assert (missing, wrong_type, undocumented) == ([], [], [])


def test_traffic_shows_in_the_metrics(local_stack: Stack, traffic: None) -> None:
    gateway = scrape(local_stack, "gateway")
    requests = gateway["http_requests_total"][1]
    assert value(requests, route="/rest/{object}", method="POST", status="201") >= 1
    assert value(requests, route="/rest/{object}/{id}", method="GET", status="200") >= 1
    assert not [labels for labels, _ in requests if "/rest/people" in labels.get("route", "")]
    assert value(gateway["gateway_revocation_checks_total"][1], result="hit") >= 1

    records = scrape(local_stack, "records")
    handled = records["grpc_server_handled_total"][1]
    assert value(handled, grpc_method="CreateRecord", grpc_code="OK") >= 1
    assert value(records["grpc_server_handling_seconds"][1], grpc_method="CreateRecord") > 0
    assert value(records["records_outbox_published_total"][1]) >= 1
    assert value(records["db_pool_connections"][1], pool="records") >= 1
    assert value(records["db_pool_connections_max"][1], pool="records") >= 1

    webhooks = scrape(local_stack, "webhooks")
    assert value(webhooks["webhook_deliveries_total"][1], outcome="delivered") >= 1
    assert value(webhooks["webhook_delivery_attempt_seconds"][1]) > 0
    assert {labels["pool"] for labels, _ in webhooks["db_pool_connections"][1]} == {
        "webhooks",
        "webhooks-dispatch",
    }


def test_the_gateway_serves_metrics_on_its_metrics_port_only(local_stack: Stack) -> None:
    gateway = local_stack.instances[GATEWAY][0]
    public = httpx.get(f"http://127.0.0.1:{gateway.port}/metrics", timeout=10)
    assert public.status_code == 404
    assert public.json()["statusCode"] == 404
    own = httpx.get(f"http://127.0.0.1:{gateway.metrics_port}/metrics", timeout=10)
    assert own.status_code == 200
    assert "http_requests_total" in own.text
