"""Record writes reach GraphQL subscribers (REST/GraphQL write → outbox → relay → JetStream →
gateway → WebSocket): through the Python gql client, the reference JavaScript graphql-ws client
and the legacy protocol; only in their workspace, only what their role may read, through their
filter; 1,000 subscribers at once; a slow one never slows the others; nothing lost or repeated
across a NATS restart."""

from __future__ import annotations

import asyncio
import secrets
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import pytest
import websockets
from gql import Client, gql
from gql.transport.websockets import WebsocketsTransport

from crmstack.client import Session, graphql_data, login, signup, unique_email
from crmstack.stack import Stack
from tests.integration.api_helpers import Api, Record
from tests.integration.events_client import read_stream
from tests.integration.subscriptions_client import (
    Socket,
    metric,
    publish_raw,
    wait_for_subscriptions,
    ws_url,
)

JS_CLIENT = Path(__file__).parent / "js"
PERSON_FIELDS = """
  id firstName lastName email phone jobTitle city createdAt updatedAt deletedAt ownerId
  company { id name }
"""


async def create(api: Api, plural: str, data: Record) -> Record:
    """Creates a record through REST; its event flows through the outbox and the relay."""
    record: Record = await asyncio.to_thread(api.create, plural, data)
    return record


async def settled(base_url: str) -> float:
    """The open subscriptions of a gateway once the previous test's sockets are gone."""
    for _ in range(300):
        current = await asyncio.to_thread(metric, base_url, "gateway_subscriptions_open")
        if current == 0:
            return current
        await asyncio.sleep(0.1)
    raise AssertionError(f"{current} subscriptions still open before the test")


def _member(client: httpx.Client, admin: Session) -> Session:
    email = unique_email("member")
    graphql_data(
        client,
        admin.access_token,
        "mutation($input: AddWorkspaceMemberInput!) { addWorkspaceMember(input: $input) { id } }",
        {"input": {"email": email, "password": "member password"}},
    )
    return login(client, email, "member password", admin.workspace_id)


# -- clients ----------------------------------------------------------------------------------


def _gql_transport(base_url: str, token: str, subprotocol: str) -> WebsocketsTransport:
    return WebsocketsTransport(
        url=ws_url(base_url),
        init_payload={"authorization": f"Bearer {token}"},
        subprotocols=[subprotocol],
    )


@pytest.mark.parametrize(
    "subprotocol",
    [WebsocketsTransport.GRAPHQLWS_SUBPROTOCOL, WebsocketsTransport.APOLLO_SUBPROTOCOL],
)
async def test_the_gql_client_receives_person_created_with_the_person_s_fields(
    base_url: str, client: httpx.Client, subprotocol: str
) -> None:
    api = Api.signup(client)
    await settled(base_url)
    acme = await create(api, "companies", {"name": "Acme"})
    transport = _gql_transport(base_url, api.session.access_token, subprotocol)
    async with Client(transport=transport) as session:
        stream = session.subscribe(gql(f"subscription {{ personCreated {{ {PERSON_FIELDS} }} }}"))
        first = asyncio.ensure_future(anext(stream))
        await wait_for_subscriptions(base_url, 1)
        person = await create(
            api,
            "people",
            {
                "firstName": "Ada",
                "lastName": "Lovelace",
                "email": "ada@example.com",
                "jobTitle": "Analyst",
                "company": {"connect": acme["id"]},
            },
        )
        received = await asyncio.wait_for(first, 30)
        await stream.aclose()
    assert received == {
        "personCreated": {
            "id": person["id"],
            "firstName": "Ada",
            "lastName": "Lovelace",
            "email": "ada@example.com",
            "phone": None,
            "jobTitle": "Analyst",
            "city": None,
            "createdAt": person["createdAt"],
            "updatedAt": person["updatedAt"],
            "deletedAt": None,
            "ownerId": api.session.user_id,
            "company": {"id": acme["id"], "name": "Acme"},
        }
    }


@pytest.fixture(scope="module")
def js_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference graphql-ws client from npm, installed into a temporary folder."""
    npm = shutil.which("npm")
    assert npm, "npm (with node) is needed to install the graphql-ws client"
    assert shutil.which("node"), "node is needed to run the graphql-ws client"
    folder = tmp_path_factory.mktemp("graphql-ws-client")
    for name in ("package.json", "subscribe.mjs"):
        shutil.copy(JS_CLIENT / name, folder / name)
    subprocess.run(
        [npm, "install", "--no-package-lock", "--no-audit", "--no-fund", "--ignore-scripts"],
        cwd=folder,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return folder


async def test_the_reference_javascript_graphql_ws_client_receives_events(
    base_url: str, client: httpx.Client, js_client: Path
) -> None:
    api = Api.signup(client)
    await settled(base_url)
    node = shutil.which("node")
    assert node
    process = await asyncio.create_subprocess_exec(
        node,
        "subscribe.mjs",
        ws_url(base_url),
        api.session.access_token,
        "subscription { personCreated { id firstName } }",
        "2",
        cwd=js_client,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        first = orjson.loads(await asyncio.wait_for(process.stdout.readline(), 60))
        assert first == {"type": "connected"}
        await wait_for_subscriptions(base_url, 1)
        people = [await create(api, "people", {"firstName": name}) for name in ("Grace", "Linus")]
        lines = [
            orjson.loads(await asyncio.wait_for(process.stdout.readline(), 60)) for _ in people
        ]
        assert lines == [
            {
                "type": "next",
                "payload": {"data": {"personCreated": {"id": p["id"], "firstName": n}}},
            }
            for p, n in zip(people, ("Grace", "Linus"), strict=True)
        ]
        assert await asyncio.wait_for(process.wait(), 60) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


# -- what each subscriber sees ----------------------------------------------------------------


async def test_updated_and_deleted_carry_the_record_after_and_custom_objects_have_fields(
    base_url: str, client: httpx.Client
) -> None:
    api = Api.signup(client)
    object_id = await asyncio.to_thread(api.create_object, "invoice", "invoices")
    await asyncio.to_thread(api.create_field, object_id, "total", "NUMBER")
    await settled(base_url)
    async with await Socket.open(base_url) as socket:
        await socket.init(api.session.access_token)
        for action in ("Created", "Updated", "Deleted"):
            await socket.subscribe(
                action, f"subscription {{ invoice{action} {{ id total deletedAt }} }}"
            )
        await wait_for_subscriptions(base_url, 3)
        invoice = await create(api, "invoices", {"total": 10})
        assert await socket.next_data("Created") == {
            "invoiceCreated": {"id": invoice["id"], "total": 10, "deletedAt": None}
        }
        await asyncio.to_thread(
            api.ok, "PATCH", f"/rest/invoices/{invoice['id']}", json={"total": 12}
        )
        assert await socket.next_data("Updated") == {
            "invoiceUpdated": {"id": invoice["id"], "total": 12, "deletedAt": None}
        }
        deleted = (await asyncio.to_thread(api.ok, "DELETE", f"/rest/invoices/{invoice['id']}"))[
            "data"
        ]
        assert await socket.next_data("Deleted") == {
            "invoiceDeleted": {"id": invoice["id"], "total": 12, "deletedAt": deleted["deletedAt"]}
        }
        assert deleted["deletedAt"]
        await socket.quiet(0.5)


async def test_a_subscriber_sees_only_its_own_workspace(
    base_url: str, client: httpx.Client
) -> None:
    ours, theirs = Api.signup(client), Api.signup(client)
    await settled(base_url)
    async with await Socket.open(base_url) as socket:
        await socket.init(ours.session.access_token)
        await socket.subscribe("p", "subscription { personCreated { id firstName } }")
        await wait_for_subscriptions(base_url, 1)
        await create(theirs, "people", {"firstName": "Theirs"})
        mine = await create(ours, "people", {"firstName": "Ours"})
        assert await socket.next_data("p") == {
            "personCreated": {"id": mine["id"], "firstName": "Ours"}
        }
        await socket.quiet(0.5)


async def test_a_member_gets_only_its_own_records_and_the_admin_gets_all(
    base_url: str, client: httpx.Client
) -> None:
    admin = Api.signup(client)
    member = Api(client, await asyncio.to_thread(_member, client, admin.session))
    await settled(base_url)
    query = "subscription { personCreated { firstName ownerId } }"
    async with (
        await Socket.open(base_url) as member_socket,
        await Socket.open(base_url) as admin_socket,
    ):
        await member_socket.init(member.session.access_token)
        await admin_socket.init(admin.session.access_token)
        await member_socket.subscribe("m", query)
        await admin_socket.subscribe("a", query)
        await wait_for_subscriptions(base_url, 2)
        await create(admin, "people", {"firstName": "Admin's"})
        await create(member, "people", {"firstName": "Member's"})
        assert await member_socket.next_data("m") == {
            "personCreated": {"firstName": "Member's", "ownerId": member.session.user_id}
        }
        await member_socket.quiet(0.5)
        assert [await admin_socket.next_data("a") for _ in range(2)] == [
            {"personCreated": {"firstName": "Admin's", "ownerId": admin.session.user_id}},
            {"personCreated": {"firstName": "Member's", "ownerId": member.session.user_id}},
        ]


async def test_the_filter_argument_selects_events(base_url: str, client: httpx.Client) -> None:
    api = Api.signup(client)
    await settled(base_url)
    async with await Socket.open(base_url) as socket:
        await socket.init(api.session.access_token)
        await socket.subscribe(
            "paris",
            'subscription { personCreated(filter: {city: {eq: "Paris"}}) { firstName } }',
        )
        await socket.subscribe(
            "named",
            "subscription($f: PersonFilter) { personCreated(filter: $f) { firstName } }",
            {"f": {"or": [{"firstName": {"startsWith": "Jo"}}, {"jobTitle": {"contains": "cto"}}]}},
        )
        await wait_for_subscriptions(base_url, 2)
        for data in (
            {"firstName": "Rome", "city": "Rome"},
            {"firstName": "Jo", "city": "Paris"},
            {"firstName": "Kim", "jobTitle": "CTO"},
        ):
            await create(api, "people", data)
        received: dict[str, list[str]] = {"paris": [], "named": []}
        for _ in range(3):
            message = await socket.receive()
            assert message["type"] == "next", message
            received[message["id"]].append(message["payload"]["data"]["personCreated"]["firstName"])
        assert received == {"paris": ["Jo"], "named": ["Jo", "Kim"]}
        await socket.quiet(0.5)


# -- scale and isolation ----------------------------------------------------------------------


async def test_one_event_reaches_1000_subscribers_on_one_gateway(
    base_url: str, client: httpx.Client
) -> None:
    api = Api.signup(client)
    await settled(base_url)
    token = api.session.access_token
    sockets: list[Socket] = []

    async def subscriber(number: int) -> Socket:
        socket = await Socket.open(base_url, open_timeout=60)
        await socket.init(token)
        await socket.subscribe(str(number), "subscription { personCreated { id } }")
        return socket

    try:
        for start in range(0, 1000, 100):
            sockets.extend(
                await asyncio.gather(*(subscriber(n) for n in range(start, start + 100)))
            )
        await wait_for_subscriptions(base_url, 1000, timeout=120)
        person = await create(api, "people", {"firstName": "Everyone"})
        received = await asyncio.gather(
            *(socket.next_data(str(n), timeout=120) for n, socket in enumerate(sockets))
        )
        assert received == [{"personCreated": {"id": person["id"]}}] * 1000
    finally:
        await asyncio.gather(*(socket.connection.close() for socket in sockets))


async def test_a_batch_of_1000_creates_reaches_a_subscriber_in_full(
    base_url: str, client: httpx.Client
) -> None:
    api = Api.signup(client)
    await settled(base_url)
    async with await Socket.open(base_url) as socket:
        await socket.init(api.session.access_token)
        await socket.subscribe("p", "subscription { personCreated { id } }")
        await wait_for_subscriptions(base_url, 1)
        people = [{"firstName": f"Imported {n}"} for n in range(1000)]
        body = await asyncio.to_thread(api.ok, "POST", "/rest/batch/people", 201, json=people)
        received = [(await socket.next_data("p"))["personCreated"]["id"] for _ in people]
        assert sorted(received) == sorted(record["id"] for record in body["data"])
        await socket.quiet(0.5)


async def test_a_slow_subscriber_is_closed_and_never_slows_the_others(
    client: httpx.Client, extra_gateway: Callable[[dict[str, str]], str]
) -> None:
    gateway = extra_gateway({"SUBSCRIPTION_QUEUE_SIZE": "256"})
    api = Api.signup(client)
    await asyncio.to_thread(api.create_field, api.object_id("person"), "notes", "RAW_JSON")
    token = api.session.access_token
    query = "subscription { personCreated { id notes } }"
    events, batch = 800, 100
    fast = await Socket.open(gateway)
    # The slow client never reads: its library stops reading the socket after one frame, its
    # kernel buffers 16 kB at most, and it asks for no compression (which would shrink the
    # padding to nothing).
    slow = await Socket.open(gateway, max_queue=1, receive_buffer=16_384, compression=None)
    try:
        await fast.init(token)
        await slow.init(token)
        await fast.subscribe("f", query)
        await slow.subscribe("s", query)
        await wait_for_subscriptions(gateway, 2)

        async def read_all() -> set[str]:
            seen: set[str] = set()
            while len(seen) < events:
                data = await fast.next_data("f", timeout=120)
                seen.add(data["personCreated"]["id"])
            return seen

        reader = asyncio.ensure_future(read_all())
        created: set[str] = set()
        for start in range(0, events, batch):
            # 800 people of 16 kB: more than every buffer between the gateway and the slow
            # client can hold (about 4 MB) plus its queue, while the fast reader stays far
            # from that.
            people = [
                {"firstName": f"Busy {n}", "notes": secrets.token_urlsafe(12_000)}
                for n in range(start, start + batch)
            ]
            body = await asyncio.to_thread(api.ok, "POST", "/rest/batch/people", 201, json=people)
            created.update(record["id"] for record in body["data"])
        assert await asyncio.wait_for(reader, 300) == created
        assert await asyncio.to_thread(metric, gateway, "gateway_subscription_overflows_total") == 1
        # The slow subscriber reads what was buffered for it, then the close frame.
        slow_count = 0
        frame = None
        try:
            while True:
                message = await slow.receive(timeout=120)
                assert message["type"] == "next"
                slow_count += 1
        except websockets.ConnectionClosed as closed:
            frame = closed.rcvd
        assert frame is not None
        assert frame.code == 1013
        assert frame.reason.startswith("subscriber too slow")
        assert slow_count < events
    finally:
        await fast.connection.close()
        await slow.connection.close()


async def test_a_nats_outage_delays_events_but_loses_and_repeats_none(
    base_url: str, client: httpx.Client, local_stack: Stack
) -> None:
    api = Api.signup(client)
    await settled(base_url)
    resets = await asyncio.to_thread(metric, base_url, "gateway_record_feed_resets_total")
    async with await Socket.open(base_url) as socket:
        await socket.init(api.session.access_token)
        await socket.subscribe("p", "subscription { personCreated { firstName } }")
        await wait_for_subscriptions(base_url, 1)
        await create(api, "people", {"firstName": "Before"})
        assert await socket.next_data("p") == {"personCreated": {"firstName": "Before"}}
        await asyncio.to_thread(local_stack.stop_infra, "nats")
        try:
            # Writes succeed while NATS is away; their events wait in the outbox.
            await create(api, "people", {"firstName": "During"})
        finally:
            await asyncio.to_thread(local_stack.start_infra, "nats")
        await create(api, "people", {"firstName": "After"})
        received = [await socket.next_data("p", timeout=120) for _ in range(2)]
        assert received == [
            {"personCreated": {"firstName": "During"}},
            {"personCreated": {"firstName": "After"}},
        ]
        await socket.quiet(1.0)
    assert await asyncio.to_thread(metric, base_url, "gateway_record_feed_resets_total") > resets


async def test_a_record_too_large_for_its_event_is_read_by_id(
    base_url: str, client: httpx.Client, local_stack: Stack
) -> None:
    api = Api.signup(client)
    await asyncio.to_thread(api.create_field, api.object_id("person"), "notes", "RAW_JSON")
    await settled(base_url)
    async with await Socket.open(base_url, max_size=None) as socket:
        await socket.init(api.session.access_token)
        await socket.subscribe("p", "subscription { personCreated { id notes } }")
        await wait_for_subscriptions(base_url, 1)
        # 1.2 MB (in parts under the 64 k text limit): over the NATS message limit.
        big = {"parts": [secrets.token_urlsafe(40_000) for _ in range(23)]}
        person = await create(api, "people", {"firstName": "Big", "notes": big})
        data = await socket.next_data("p", timeout=60)
        assert data == {"personCreated": {"id": person["id"], "notes": big}}
    (published,) = await asyncio.to_thread(read_stream, local_stack, api.session.workspace_id, 1)
    assert published.event.record_omitted  # the gateway read it by id


async def test_a_malformed_message_on_a_record_subject_does_not_stop_the_feed(
    base_url: str, client: httpx.Client, local_stack: Stack
) -> None:
    api = Api.signup(client)
    await settled(base_url)
    async with await Socket.open(base_url) as socket:
        await socket.init(api.session.access_token)
        await socket.subscribe("p", "subscription { personCreated { firstName } }")
        await wait_for_subscriptions(base_url, 1)
        subject = f"crm.records.{api.session.workspace_id}.person.created"
        await publish_raw(local_stack.env["NATS_URL"], subject, b"\xff not a RecordEvent")
        await create(api, "people", {"firstName": "Next"})
        assert await socket.next_data("p") == {"personCreated": {"firstName": "Next"}}


async def test_a_revoked_credential_closes_the_socket_with_4401(
    client: httpx.Client, extra_gateway: Callable[[dict[str, str]], str]
) -> None:
    gateway = extra_gateway({"SUBSCRIPTION_REVALIDATE_INTERVAL": "0.5"})
    admin = signup(client)
    key = graphql_data(
        client,
        admin.access_token,
        'mutation { createApiKey(input: {name: "listener"}) { id token } }',
    )["createApiKey"]
    async with await Socket.open(gateway) as socket:
        await socket.init(key["token"])
        await socket.subscribe("p", "subscription { personCreated { id } }")
        await wait_for_subscriptions(gateway, 1)
        await asyncio.to_thread(
            graphql_data,
            client,
            admin.access_token,
            "mutation($id: UUID!) { deleteApiKey(id: $id) }",
            {"id": key["id"]},
        )
        code, reason = await socket.closed(timeout=60)
        assert code == 4401
        assert "revoked" in reason
