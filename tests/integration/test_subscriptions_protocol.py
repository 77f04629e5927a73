"""GraphQL over WebSocket at /graphql: the graphql-transport-ws protocol rules, authentication in
connection_init (4401 / 4403), and queries and mutations over the socket."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from crmstack.client import Session, graphql_data, login, signup, unique_email
from tests.integration.subscriptions_client import LEGACY_WS, Socket, wait_for_subscriptions

PERSON_CREATED = "subscription { personCreated { id firstName } }"


@pytest.fixture(scope="module")
def admin(client: httpx.Client) -> Session:
    return signup(client)


def _member(client: httpx.Client, admin: Session, role_id: str | None = None) -> Session:
    email = unique_email("member")
    graphql_data(
        client,
        admin.access_token,
        "mutation($input: AddWorkspaceMemberInput!) { addWorkspaceMember(input: $input) { id } }",
        {"input": {"email": email, "password": "member password", "roleId": role_id}},
    )
    return login(client, email, "member password", admin.workspace_id)


async def test_connection_ack_ping_pong_and_a_query_over_the_socket(
    base_url: str, admin: Session
) -> None:
    async with await Socket.open(base_url) as socket:
        assert socket.connection.subprotocol == "graphql-transport-ws"
        await socket.send({"type": "ping", "payload": {"n": 1}})
        assert await socket.receive() == {"type": "pong", "payload": {"n": 1}}
        await socket.init(admin.access_token)
        await socket.send({"type": "ping"})
        assert await socket.receive() == {"type": "pong"}
        await socket.send({"type": "pong"})  # unsolicited pongs are allowed and ignored
        await socket.subscribe("q1", "{ currentUser { id email } }")
        assert await socket.next_data("q1") == {
            "currentUser": {"id": admin.user_id, "email": admin.email}
        }
        assert await socket.receive() == {"id": "q1", "type": "complete"}
        # The id is free again once its operation completed.
        await socket.subscribe("q1", "{ apiVersion }")
        assert await socket.next_data("q1") == {"apiVersion": "v1"}
        assert await socket.receive() == {"id": "q1", "type": "complete"}


async def test_a_mutation_over_the_socket_writes_like_http(
    base_url: str, client: httpx.Client, admin: Session
) -> None:
    async with await Socket.open(base_url) as socket:
        await socket.init(admin.access_token)
        await socket.subscribe(
            "m",
            "mutation($data: PersonCreateInput!) { createPerson(data: $data) { id firstName } }",
            {"data": {"firstName": "Over the socket"}},
        )
        created = (await socket.next_data("m"))["createPerson"]
        assert created["firstName"] == "Over the socket"
        assert await socket.receive() == {"id": "m", "type": "complete"}
    fetched = graphql_data(
        client,
        admin.access_token,
        "query($id: UUID!) { person(id: $id) { firstName } }",
        {"id": created["id"]},
    )
    assert fetched == {"person": {"firstName": "Over the socket"}}


async def test_invalid_operations_get_an_error_message_and_the_socket_stays(
    base_url: str, admin: Session
) -> None:
    async with await Socket.open(base_url) as socket:
        await socket.init(admin.access_token)
        await socket.subscribe("bad", "subscription { personCreated { nope } }")
        error = await socket.receive()
        assert error["type"] == "error"
        assert error["id"] == "bad"
        assert error["payload"][0]["extensions"]["code"] == "BAD_USER_INPUT"
        await socket.subscribe("unknown", "subscription { spaceshipCreated { id } }")
        assert (await socket.receive())["type"] == "error"
        await socket.subscribe(
            "relation",
            'subscription { personCreated(filter: {company: {name: {eq: "Acme"}}}) { id } }',
        )
        refused = await socket.receive()
        assert refused["type"] == "error", refused
        assert refused["payload"][0]["extensions"] == {
            "code": "BAD_USER_INPUT",
            "field": "filter.company",
        }
        # Still open and usable.
        await socket.subscribe("ok", "{ apiVersion }")
        assert await socket.next_data("ok") == {"apiVersion": "v1"}


async def test_subscribe_before_the_ack_closes_with_4401(base_url: str) -> None:
    async with await Socket.open(base_url) as socket:
        await socket.subscribe("1", PERSON_CREATED)
        assert await socket.closed() == (4401, "Unauthorized")


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"authorization": "Bearer not-a-token"}, "invalid token"),
        ({}, "missing credential"),
        ({"authorization": "Basic dXNlcjpwYXNz"}, "invalid credential"),
    ],
)
async def test_a_bad_credential_closes_with_4401(
    base_url: str, payload: dict[str, str], reason: str
) -> None:
    async with await Socket.open(base_url) as socket:
        await socket.send({"type": "connection_init", "payload": payload})
        code, message = await socket.closed()
        assert code == 4401
        assert message.startswith(reason)


async def test_an_expired_or_revoked_session_token_closes_with_4401(
    base_url: str, client: httpx.Client
) -> None:
    session = signup(client)
    logout = await asyncio.to_thread(
        client.post,
        "/auth/logout",
        json={"refreshToken": session.refresh_token},
        headers=session.headers,
    )
    assert logout.status_code in (200, 204), logout.text
    async with await Socket.open(base_url) as socket:
        await socket.send(
            {
                "type": "connection_init",
                "payload": {"authorization": f"Bearer {session.access_token}"},
            }
        )
        code, _ = await socket.closed()
        assert code == 4401


async def test_a_credential_that_may_read_nothing_closes_with_4403(
    base_url: str, client: httpx.Client, admin: Session
) -> None:
    role = graphql_data(
        client,
        admin.access_token,
        'mutation { createRole(input: {name: "Nothing to read", permissions: []}) { id } }',
    )["createRole"]
    nobody = _member(client, admin, role["id"])
    async with await Socket.open(base_url) as socket:
        await socket.send(
            {
                "type": "connection_init",
                "payload": {"authorization": f"Bearer {nobody.access_token}"},
            }
        )
        code, reason = await socket.closed()
        assert code == 4403
        assert "may not read" in reason


async def test_subscribing_to_an_object_the_role_cannot_read_is_forbidden(
    base_url: str, client: httpx.Client, admin: Session
) -> None:
    role = graphql_data(
        client,
        admin.access_token,
        """mutation { createRole(input: {name: "Company readers",
             permissions: [{object: "company", actions: [READ]}]}) { id } }""",
    )["createRole"]
    reader = _member(client, admin, role["id"])
    async with await Socket.open(base_url) as socket:
        await socket.init(reader.access_token)
        await socket.subscribe("p", PERSON_CREATED)
        error = await socket.receive()
        assert error["type"] == "error"
        assert error["id"] == "p"
        assert error["payload"][0]["extensions"]["code"] == "FORBIDDEN"
        assert error["payload"][0]["path"] == ["personCreated"]
        await socket.subscribe("c", "subscription { companyCreated { id } }")
        await socket.quiet(1.0)  # accepted: nothing to say until a company is created


async def test_no_connection_init_closes_with_4408_after_the_timeout(base_url: str) -> None:
    async with await Socket.open(base_url) as socket:
        started = time.monotonic()
        assert await socket.closed() == (4408, "Connection initialisation timeout")
        assert time.monotonic() - started >= 2.5  # the default timeout is 3 s


async def test_a_second_connection_init_closes_with_4429(base_url: str, admin: Session) -> None:
    async with await Socket.open(base_url) as socket:
        await socket.init(admin.access_token)
        await socket.send({"type": "connection_init", "payload": {}})
        assert await socket.closed() == (4429, "Too many initialisation requests")


async def test_a_duplicate_subscription_id_closes_with_4409(base_url: str, admin: Session) -> None:
    async with await Socket.open(base_url) as socket:
        await socket.init(admin.access_token)
        await socket.subscribe("same", PERSON_CREATED)
        await socket.subscribe("same", PERSON_CREATED)
        assert await socket.closed() == (4409, "Subscriber for same already exists")


@pytest.mark.parametrize(
    "message",
    [
        "not json",
        '{"type": "start", "id": "1", "payload": {"query": "{ apiVersion }"}}',
        '{"type": "subscribe", "payload": {"query": "{ apiVersion }"}}',
        '{"type": "subscribe", "id": "1", "payload": {"variables": {}}}',
    ],
)
async def test_an_invalid_message_closes_with_4400(
    base_url: str, admin: Session, message: str
) -> None:
    async with await Socket.open(base_url) as socket:
        await socket.init(admin.access_token)
        await socket.connection.send(message)
        code, reason = await socket.closed()
        assert code == 4400
        assert reason


async def test_without_a_known_subprotocol_the_socket_closes_with_4406(base_url: str) -> None:
    for offered in (None, ["mqtt"]):
        async with await Socket.open(base_url, subprotocols=offered) as socket:
            code, _ = await socket.closed()
            assert code == 4406


async def test_complete_stops_a_subscription(base_url: str, admin: Session) -> None:
    from tests.integration.subscriptions_client import metric

    async with await Socket.open(base_url) as socket:
        await socket.init(admin.access_token)
        before = await asyncio.to_thread(metric, base_url, "gateway_subscriptions_open")
        await socket.subscribe("s", PERSON_CREATED)
        await wait_for_subscriptions(base_url, before + 1)
        await socket.send({"id": "s", "type": "complete"})
        deadline = time.monotonic() + 30
        while await asyncio.to_thread(metric, base_url, "gateway_subscriptions_open") > before:
            assert time.monotonic() < deadline, "the subscription stayed open"
            await asyncio.sleep(0.1)
        await socket.quiet(0.5)  # no `complete` echo in graphql-transport-ws


async def test_legacy_graphql_ws_acks_keeps_alive_and_answers_operations(
    base_url: str, admin: Session
) -> None:
    async with await Socket.open(base_url, subprotocols=[LEGACY_WS]) as socket:
        assert socket.connection.subprotocol == LEGACY_WS
        await socket.send(
            {
                "type": "connection_init",
                "payload": {"authorization": f"Bearer {admin.access_token}"},
            }
        )
        assert await socket.receive() == {"type": "connection_ack"}
        assert await socket.receive() == {"type": "ka"}
        await socket.send({"id": "1", "type": "start", "payload": {"query": "{ apiVersion }"}})
        assert await socket.receive() == {
            "id": "1",
            "type": "data",
            "payload": {"data": {"apiVersion": "v1"}},
        }
        assert await socket.receive() == {"id": "1", "type": "complete"}
        await socket.send({"id": "2", "type": "start", "payload": {"query": "{ nope }"}})
        failed = await socket.receive()
        assert failed["type"] == "data"
        assert failed["payload"]["data"] is None
        assert failed["payload"]["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"
        assert await socket.receive() == {"id": "2", "type": "complete"}
        await socket.send({"id": "3", "type": "start", "payload": {"query": PERSON_CREATED}})
        await socket.send({"id": "3", "type": "stop"})
        assert await socket.receive() == {"id": "3", "type": "complete"}
        await socket.send({"type": "connection_terminate"})
        assert (await socket.closed())[0] == 1000


async def test_legacy_graphql_ws_refuses_a_bad_credential_with_connection_error_and_4401(
    base_url: str,
) -> None:
    async with await Socket.open(base_url, subprotocols=[LEGACY_WS]) as socket:
        await socket.send({"type": "connection_init", "payload": {"authorization": "Bearer x"}})
        refusal = await socket.receive()
        assert refusal["type"] == "connection_error"
        assert refusal["payload"]["message"]
        assert (await socket.closed())[0] == 4401
