"""Record history through the public API (docs/api.md, "Record history"): who changed which
field from what to what and when, for users, API keys and workflows; access follows the record;
hidden fields stay hidden; merges show both sides; paging, filters and retention."""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from crmstack.client import Session, graphql_data, login, unique_email
from crmstack.stack import Stack
from tests.integration import workflows_client
from tests.integration.api_helpers import Api
from tests.integration.workflows_client import Flows

receiver = workflows_client.receiver
flows = workflows_client.flows

ENTRY = """id object recordId action occurredAt mergedFrom mergedInto
  actor { kind userId credentialId workflowId } changes { field old new }"""


@pytest.fixture(scope="module")
def api(client: httpx.Client) -> Api:
    return Api.signup(client)


def _history(api: Api, plural: str, record_id: str, **params: Any) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = api.ok(
        "GET", f"/rest/{plural}/{record_id}/history", params=params
    )["data"]
    return entries


def _api_key(api: Api) -> tuple[str, str]:
    """A new API key of the workspace: (id, token)."""
    data = api.data('mutation { createApiKey(input: {name: "history"}) { id token } }')
    return data["createApiKey"]["id"], data["createApiKey"]["token"]


def _as(api: Api, token: str) -> Api:
    session = Session(token, "", "", api.session.workspace_id, "", "")
    return Api(api.http, session)


def test_changes_name_the_user_or_api_key_with_old_and_new_values(api: Api) -> None:
    person = api.create("people", {"firstName": "Ada", "city": "London"})
    key_id, token = _api_key(api)
    keyed = _as(api, token)
    keyed.ok("PATCH", f"/rest/people/{person['id']}", json={"city": "Paris", "lastName": None})
    updated, created = _history(api, "people", person["id"])
    assert created["action"] == "created"
    assert created["actor"]["kind"] == "user"
    assert created["actor"]["userId"] == api.session.user_id
    assert created["changes"] == []
    assert updated["action"] == "updated"
    assert updated["object"] == "person"
    assert updated["recordId"] == person["id"]
    assert updated["actor"]["kind"] == "api_key"
    assert updated["actor"]["credentialId"] == key_id
    assert updated["actor"]["workflowId"] is None
    # Only the field the update changed (lastName was already null).
    assert updated["changes"] == [{"field": "city", "old": "London", "new": "Paris"}]
    assert updated["occurredAt"] >= created["occurredAt"]

    # GraphQL: the query and the record's `history` field answer the same entries.
    by_query = api.data(
        f"query($id: UUID!) {{ personHistory(id: $id) {{ edges {{ cursor node {{ {ENTRY} }} }}"
        " pageInfo { hasNextPage endCursor } } }",
        {"id": person["id"]},
    )["personHistory"]
    assert [edge["node"] for edge in by_query["edges"]] == [updated, created]
    assert by_query["pageInfo"]["hasNextPage"] is False
    nested = api.data(
        f"query($id: UUID!) {{ person(id: $id) {{ history(first: 1) {{ edges {{ node {{ {ENTRY} }}"
        " } pageInfo { hasNextPage } } } }",
        {"id": person["id"]},
    )["person"]["history"]
    assert [edge["node"] for edge in nested["edges"]] == [updated]
    assert nested["pageInfo"]["hasNextPage"] is True


def test_a_workflow_write_names_the_workflow(flows: Flows) -> None:
    key = graphql_data(
        flows.client,
        flows.admin.access_token,
        'mutation { createApiKey(input: {name: "flow"}) { token } }',
    )["createApiKey"]["token"]
    base = flows.client.base_url
    workflow = flows.create({"type": "RECORD_UPDATED", "object": "opportunity"}, path="/unused")
    flows.gql(
        "mutation($input: UpdateWorkflowInput!) { updateWorkflow(input: $input) { id } }",
        {
            "input": {
                "id": workflow["id"],
                "action": {
                    "method": "PATCH",
                    "url": f"{base}/rest/opportunities/{{{{id}}}}",
                    "headers": {"Authorization": f"Bearer {key}"},
                    "body": '{"amount": 99}',
                },
            }
        },
    )
    deal = flows.rest("POST", "opportunities", json={"name": "Deal", "amount": 1})
    flows.rest("PATCH", f"opportunities/{deal['id']}", json={"name": "Deal 2"})
    flows.wait_runs(workflow["id"], 1, "SUCCEEDED")
    response = flows.client.get(
        f"/rest/opportunities/{deal['id']}/history", headers=flows.admin.headers
    )
    assert response.status_code == 200, response.text
    by_workflow, by_person, created = response.json()["data"]
    assert by_workflow["actor"]["workflowId"] == workflow["id"]
    assert by_workflow["actor"]["kind"] == "api_key"
    assert by_workflow["changes"] == [{"field": "amount", "old": 1, "new": 99}]
    assert by_person["actor"] == {
        "kind": "user",
        "userId": flows.admin.user_id,
        "credentialId": by_person["actor"]["credentialId"],
        "workflowId": None,
    }
    assert by_person["changes"] == [{"field": "name", "old": "Deal", "new": "Deal 2"}]
    assert created["action"] == "created"


def _member(api: Api) -> Api:
    email = unique_email("member")
    api.data(
        "mutation($input: AddWorkspaceMemberInput!) { addWorkspaceMember(input: $input) { id } }",
        {"input": {"email": email, "password": "member password"}},
    )
    return Api(api.http, login(api.http, email, "member password", api.session.workspace_id))


def test_a_member_cannot_read_the_history_of_a_record_it_cannot_read(api: Api) -> None:
    member = _member(api)
    theirs = api.create("people", {"firstName": "Admin's"})
    mine = member.create("people", {"firstName": "Member's"})
    body = member.bad("GET", f"/rest/people/{theirs['id']}/history", 404)
    assert body["details"]["field"] == "id"
    assert member.bad("GET", f"/rest/people/{theirs['id']}", 404)["statusCode"] == 404
    error = member.error(
        "query($id: UUID!) { personHistory(id: $id) { edges { node { id } } } }",
        {"id": theirs["id"]},
    )
    assert error["extensions"]["code"] == "NOT_FOUND"
    (created,) = _history(member, "people", mine["id"])
    assert created["actor"]["userId"] == member.session.user_id
    # A deleted record keeps its history for whoever could read it.
    member.ok("DELETE", f"/rest/people/{mine['id']}")
    assert [e["action"] for e in _history(member, "people", mine["id"])] == ["deleted", "created"]


def test_custom_fields_have_history_and_a_hidden_field_is_not_shown(api: Api) -> None:
    suffix = uuid.uuid4().hex[:6]
    object_id = api.create_object(f"gadget{suffix}", f"gadgets{suffix}")
    api.create_field(object_id, "title", "TEXT")
    secret = api.create_field(object_id, "secret", "TEXT")
    plural = f"gadgets{suffix}"
    record = api.create(plural, {"title": "one", "secret": "s1"})
    api.ok("PATCH", f"/rest/{plural}/{record['id']}", json={"title": "two", "secret": "s2"})
    api.ok("PATCH", f"/rest/{plural}/{record['id']}", json={"secret": "s3"})
    only_secret, both, _ = _history(api, plural, record["id"])
    assert only_secret["changes"] == [{"field": "secret", "old": "s2", "new": "s3"}]
    assert both["changes"] == [  # in the record's field order
        {"field": "title", "old": "one", "new": "two"},
        {"field": "secret", "old": "s1", "new": "s2"},
    ]
    api.data(
        "mutation($id: UUID!) { deleteField(id: $id) { id } }", {"id": secret["id"]},
        path="/metadata",
    )  # fmt: skip
    # The deactivated field is no longer readable: the update that changed only it is gone, the
    # other shows only the title.
    update, created = _history(api, plural, record["id"])
    assert update["changes"] == [{"field": "title", "old": "one", "new": "two"}]
    assert created["action"] == "created"
    refused = api.bad("GET", f"/rest/{plural}/{record['id']}/history", params={"field": "secret"})
    assert refused["details"]["field"] == "field"


def test_a_merge_shows_both_sides(api: Api) -> None:
    target = api.create("companies", {"name": "Acme", "city": None})
    source = api.create("companies", {"name": "Acme Inc", "city": "Lyon"})
    person = api.create("people", {"firstName": "Pat", "companyId": source["id"]})
    merge = {"sourceId": source["id"], "targetId": target["id"]}
    api.ok("PATCH", "/rest/companies/merge", json=merge)
    merged, _ = _history(api, "companies", target["id"])
    assert merged["action"] == "merged"
    assert merged["mergedFrom"] == source["id"]
    assert merged["mergedInto"] is None
    assert merged["changes"] == [{"field": "city", "old": None, "new": "Lyon"}]
    absorbed, _ = _history(api, "companies", source["id"])
    assert absorbed["action"] == "merged"
    assert absorbed["mergedInto"] == target["id"]
    assert absorbed["changes"] == []
    repointed, _ = _history(api, "people", person["id"])
    assert repointed["action"] == "updated"
    assert repointed["changes"] == [
        {"field": "companyId", "old": source["id"], "new": target["id"]}
    ]


def test_pages_newest_first_and_filters_by_field_and_time(api: Api) -> None:
    person = api.create("people", {"firstName": "P0"})
    path = f"/rest/people/{person['id']}"
    for n in range(1, 5):
        api.ok("PATCH", path, json={"firstName": f"P{n}"})
    api.ok("PATCH", path, json={"city": "Oslo"})
    api.ok("PATCH", path, json={"city": "Oslo"})  # changes nothing: no entry
    api.ok("DELETE", path)
    api.ok("PATCH", f"/rest/restore/people/{person['id']}")
    everything = _history(api, "people", person["id"], limit=200)
    actions = [entry["action"] for entry in everything]
    assert actions == ["restored", "deleted", "updated", *["updated"] * 4, "created"]
    seen: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        page = api.ok(
            "GET", f"{path}/history", params={"limit": 3, **({"after": after} if after else {})}
        )
        seen += page["data"]
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = page["pageInfo"]["endCursor"]
    assert seen == everything
    names = _history(api, "people", person["id"], field="firstName")
    assert [entry["changes"][0]["new"] for entry in names] == ["P4", "P3", "P2", "P1"]
    assert len(_history(api, "people", person["id"], field="firstName,city")) == 5
    created_at = everything[-1]["occurredAt"]
    assert [e["action"] for e in _history(api, "people", person["id"], until=created_at)] == []
    later = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
    assert _history(api, "people", person["id"], since=later) == []
    assert len(_history(api, "people", person["id"], since=created_at)) == len(everything)
    for params, field in (
        ({"after": "not-a-cursor"}, "after"),
        ({"after": base64.urlsafe_b64encode(b"h:99999999999999999999").decode()}, "after"),
        ({"since": "9999-12-31T23:59:59-01:00"}, "since"),
        ({"until": "2026-01-01T00:00:00"}, "until"),
        ({"since": "yesterday"}, "since"),
        ({"limit": 0}, "limit"),
        ({"field": "nope"}, "field"),
        ({"orderBy": "x"}, "orderBy"),
    ):
        body = api.bad("GET", f"{path}/history", params=params)
        assert body["details"]["field"] == field, (params, body)
    assert api.bad("GET", f"/rest/people/{uuid.uuid4()}/history", 404)["details"]["field"] == "id"


def _backdate(stack: Stack, record_id: str, days: int) -> None:
    async def run() -> None:
        connection = await asyncpg.connect(stack.env["DATABASE_URL"])
        try:
            await connection.execute(
                "UPDATE records.record_history SET occurred_at = occurred_at - make_interval("
                "days => $2) WHERE record_id = $1 AND action = 'created'",
                uuid.UUID(record_id),
                days,
            )
        finally:
            await connection.close()

    asyncio.run(run())


def test_retention_prunes_old_entries(api: Api, local_stack: Stack) -> None:
    records = local_stack.instances["records"][0]
    before = dict(records.process.env)
    records.process.env = {**before, "RECORD_HISTORY_PRUNE_INTERVAL": "1"}
    local_stack.restart("records")
    try:
        old = api.create("people", {"firstName": "Old"})
        api.ok("PATCH", f"/rest/people/{old['id']}", json={"firstName": "Newer"})
        _backdate(local_stack, old["id"], 366)  # past the default 365 days
        kept = api.create("people", {"firstName": "Recent"})
        _backdate(local_stack, kept["id"], 364)
        deadline = time.monotonic() + 30
        while len(_history(api, "people", old["id"])) > 1:
            assert time.monotonic() < deadline, _history(api, "people", old["id"])
            time.sleep(0.3)
        (update,) = _history(api, "people", old["id"])
        assert update["action"] == "updated"
        assert [e["action"] for e in _history(api, "people", kept["id"])] == ["created"]
        metrics = httpx.get(f"http://127.0.0.1:{records.metrics_port}/metrics", timeout=10).text
        pruned = [
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("records_history_pruned_total ")
        ]
        assert pruned
        assert pruned[0] >= 1
    finally:
        records.process.env = before
        local_stack.restart("records")


def test_batch_and_filter_writes_write_one_entry_per_record(api: Api) -> None:
    tag = uuid.uuid4().hex[:8]
    batch = [{"firstName": f"{tag}-{n}", "jobTitle": "Intern"} for n in range(3)]
    created = api.ok("POST", "/rest/batch/people", 201, json=batch)["data"]
    where = {"firstName": {"startsWith": tag}}
    api.data(
        'mutation($f: PersonFilter!) { updatePeople(filter: $f, data: {jobTitle: "Lead"}) { id } }',
        {"f": where},
    )
    api.data("mutation($f: PersonFilter!) { deletePeople(filter: $f) { id } }", {"f": where})
    for person in created:
        deleted, updated, made = _history(api, "people", person["id"])
        assert [deleted["action"], updated["action"], made["action"]] == [
            "deleted",
            "updated",
            "created",
        ]
        assert updated["changes"] == [{"field": "jobTitle", "old": "Intern", "new": "Lead"}]
