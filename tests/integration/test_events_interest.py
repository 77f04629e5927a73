"""Events cost nothing where nobody listens (docs/events.md, "Who listens"): the relay publishes
a workspace's events only while a webhook, a record-triggered workflow or an open subscription
listens there. A workspace without any gets its outbox drained and nothing in the stream; a
webhook created right before a write gets its event, and once the last one is deleted the
workspace's events stop; an opened subscription gets its events; a lapsed lease stops them. The
internal RPCs refuse callers that are not services and name the bad field."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import grpc
import httpx
import pytest

from crm.records.v1 import records_pb2, records_pb2_grpc
from crmkit.errors import from_rpc_error
from crmkit.principal import PrincipalCodec, system_principal
from crmstack.client import signup
from crmstack.stack import Stack
from examples.webhook_receiver import WebhookReceiver
from tests.integration import webhooks_client
from tests.integration.api_helpers import Api
from tests.integration.events_client import (
    listen,
    metric,
    query,
    stream_count,
    wait_drained,
    wait_until,
)
from tests.integration.records_client import provision, user_principal
from tests.integration.subscriptions_client import Socket, wait_for_subscriptions
from tests.integration.webhooks_client import DELETE, Hooks

receiver = webhooks_client.receiver
hooks = webhooks_client.hooks


def records_metric(stack: Stack, name: str) -> float:
    return metric(stack.instances["records"][0].metrics_port, name) or 0.0


@pytest.fixture
def gated(local_stack: Stack) -> Stack:
    """The stack once webhooks and workflows have synced their interest (they do at start):
    from then on the relay skips the events of workspaces nobody listens to."""
    wait_until(
        lambda: records_metric(local_stack, "records_events_gated") == 1.0,
        60,
        "webhooks and workflows did not sync their interest",
    )
    return local_stack


def outbox_rows(stack: Stack, workspace_id: str) -> int:
    return int(
        query(
            stack, "SELECT count(*) AS n FROM records.outbox WHERE workspace_id = $1", workspace_id
        )[0]["n"]
    )


def test_a_workspace_nobody_listens_to_writes_no_event_and_publishes_nothing(
    gated: Stack, client: httpx.Client
) -> None:
    api = Api.signup(client)
    person = api.create("people", {"firstName": "Quiet"})
    api.ok("PATCH", f"/rest/people/{person['id']}", json={"city": "Nowhere"})
    api.ok("DELETE", f"/rest/people/{person['id']}")
    api.ok("POST", "/rest/batch/people", 201, json=[{"firstName": "A"}, {"firstName": "B"}])
    assert outbox_rows(gated, api.session.workspace_id) == 0
    assert stream_count(gated, api.session.workspace_id) == 0

    listen(gated, api.session.workspace_id)
    api.create("people", {"firstName": "Heard"})
    assert outbox_rows(gated, api.session.workspace_id) == 1
    wait_until(lambda: stream_count(gated, api.session.workspace_id) == 1, 30, "not published")


def test_a_declaration_waits_for_the_writes_that_decided_without_it(gated: Stack) -> None:
    """A write decides whether to record its events under the workspace's lock (shared, to its
    commit); a declaration takes the lock exclusively: it returns only after such a write
    committed (so a webhook created with it commits after that write's events), and every write
    after it records its events."""
    ws = provision(gated)

    async def run() -> tuple[bool, bool, bool]:
        writer = await asyncpg.connect(
            gated.env["DATABASE_URL"], server_settings={"records.skip_unheard_events": "on"}
        )
        try:
            transaction = writer.transaction()
            await transaction.start()
            before = await writer.fetchval("SELECT records.events_wanted($1)", ws.id)
            declaring = asyncio.ensure_future(asyncio.to_thread(listen, gated, ws.id))
            done, _ = await asyncio.wait([declaring], timeout=1.0)
            waited = not done
            await transaction.commit()
            await asyncio.wait_for(declaring, 30)
            after = await writer.fetchval("SELECT records.events_wanted($1)", ws.id)
        finally:
            await writer.close()
        return before, waited, after

    before, waited, after = asyncio.run(run())
    assert before is False
    assert waited, "the declaration returned while a write that did not see it was open"
    assert after is True


def test_a_write_during_a_declaration_waits_for_it_and_records_its_events(gated: Stack) -> None:
    """The other side of the lock: a write that starts while a declaration holds the
    workspace's lock (its interest added, not yet committed) waits for it, then sees the
    interest and records its events (the check reads after the lock was granted)."""
    ws = provision(gated)

    async def run() -> tuple[bool, bool]:
        declarer = await asyncpg.connect(gated.env["DATABASE_URL"])
        writer = await asyncpg.connect(
            gated.env["DATABASE_URL"], server_settings={"records.skip_unheard_events": "on"}
        )
        try:
            declaring = declarer.transaction()
            await declaring.start()
            await declarer.execute(
                "SELECT pg_advisory_xact_lock(hashtext('records.event_writes'), hashtext($1))",
                ws.id,
            )
            await declarer.execute(
                "INSERT INTO records.event_interest (workspace_id, holder) VALUES ($1, 'webhooks')",
                ws.id,
            )
            deciding = asyncio.ensure_future(
                writer.fetchval("SELECT records.events_wanted($1)", ws.id)
            )
            done, _ = await asyncio.wait([deciding], timeout=1.0)
            waited = not done
            await declaring.commit()
            wanted: bool = await asyncio.wait_for(deciding, 30)
            await declarer.execute(
                "DELETE FROM records.event_interest WHERE workspace_id = $1", ws.id
            )
        finally:
            await writer.close()
            await declarer.close()
        return waited, wanted

    waited, wanted = asyncio.run(run())
    assert waited, "the write decided while a declaration held the workspace's lock"
    assert wanted, "the write did not see the interest committed while it waited"


def test_a_webhook_gets_the_write_right_after_it_and_none_after_the_last_is_deleted(
    gated: Stack, hooks: Hooks
) -> None:
    workspace = hooks.ws.id
    webhook = hooks.create(["person.created"])
    first = hooks.create_record("person", {"firstName": "Right after"})
    [event] = hooks.wait_events(webhook["path"], 1)
    assert event.payload["record"]["id"] == first["id"]
    assert stream_count(gated, workspace) == 1

    hooks.gql(DELETE, {"id": webhook["id"]})  # the sweep releases the workspace's interest
    hooks.create_record("person", {"firstName": "Nobody listens"})
    wait_drained(gated, workspace)
    assert stream_count(gated, workspace) == 1


async def test_an_opened_subscription_gets_the_events_of_its_workspace(
    gated: Stack, base_url: str, client: httpx.Client
) -> None:
    admin = await asyncio.to_thread(signup, client)
    async with await Socket.open(base_url) as socket:
        await socket.init(admin.access_token)
        await socket.subscribe("p", "subscription { personCreated { id firstName } }")
        await wait_for_subscriptions(base_url, 1)
        response = await asyncio.to_thread(
            client.post, "/rest/people", json={"firstName": "Seen"}, headers=admin.headers
        )
        assert response.status_code == 201, response.text
        created = response.json()["data"]["id"]
        assert await socket.next_data("p") == {
            "personCreated": {"id": created, "firstName": "Seen"}
        }


def test_a_lapsed_lease_stops_the_events(gated: Stack) -> None:
    ws = provision(gated)
    listen(gated, ws.id, seconds=1)
    time.sleep(1.5)
    ws.create("person", {"firstName": "After the lease"})
    wait_drained(gated, ws.id)
    assert stream_count(gated, ws.id) == 0


def test_only_services_declare_interest_and_bad_input_names_its_field(local_stack: Stack) -> None:
    ws = provision(local_stack)
    codec = PrincipalCodec(local_stack.env["APP_SECRET"])
    service = codec.metadata(system_principal(ws.id))
    with grpc.insecure_channel(local_stack.grpc_address("records")) as channel:
        stub = records_pb2_grpc.EventInterestServiceStub(channel)

        def refused(
            request: records_pb2.DeclareEventInterestRequest,
            metadata: list[tuple[str, str | bytes]],
        ) -> grpc.RpcError:
            with pytest.raises(grpc.RpcError) as caught:
                stub.DeclareEventInterest(request, metadata=metadata, timeout=30)
            return caught.value

        user = codec.metadata(user_principal(ws.id))
        error = refused(
            records_pb2.DeclareEventInterestRequest(holder="webhooks", workspace_ids=[ws.id]), user
        )
        assert from_rpc_error(error).code == grpc.StatusCode.PERMISSION_DENIED
        for request, field in (
            (records_pb2.DeclareEventInterestRequest(holder="someone"), "holder"),
            (
                records_pb2.DeclareEventInterestRequest(
                    holder="gateway:g1", workspace_ids=["x"], lease_seconds=60
                ),
                "workspaceIds",
            ),
            (
                records_pb2.DeclareEventInterestRequest(
                    holder="gateway:g1", workspace_ids=[ws.id], lease_seconds=0
                ),
                "leaseSeconds",
            ),
            (
                records_pb2.DeclareEventInterestRequest(
                    holder="webhooks", workspace_ids=[ws.id], lease_seconds=60
                ),
                "leaseSeconds",
            ),
        ):
            problem = from_rpc_error(refused(request, service))
            assert (problem.code, problem.field) == (grpc.StatusCode.INVALID_ARGUMENT, field)


def test_a_webhook_is_not_created_without_its_interest(
    gated: Stack, receiver: WebhookReceiver, client: httpx.Client
) -> None:
    """Records down: creating a webhook fails (503) rather than miss its events."""
    admin = signup(client)
    gated.kill("records")
    try:
        response = client.post(
            "/graphql",
            json={
                "query": webhooks_client.CREATE,
                "variables": {
                    "input": {"targetUrl": receiver.url("/down"), "operations": ["person.*"]}
                },
            },
            headers=admin.headers,
        )
    finally:
        gated.restart("records")
    body = response.json()
    assert body["errors"][0]["extensions"]["code"] == "SERVICE_UNAVAILABLE", body
    listed = client.post(
        "/graphql", json={"query": "{ webhooks { id } }"}, headers=admin.headers
    ).json()
    assert listed["data"]["webhooks"] == [], listed
