"""Open WebSockets follow revocation and role changes: every `subscribe` verifies the credential
again, and open subscriptions apply a revocation or a role change within the re-check interval
(default 5 s; the bounds below are generous, the machine is shared)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from crmstack.client import Session, graphql_data, login, signup, unique_email
from tests.integration.api_helpers import Api
from tests.integration.subscriptions_client import Socket, wait_for_subscriptions

CREATE_KEY = 'mutation { createApiKey(input: {name: "socket"}) { id token } }'
DELETE_KEY = "mutation($id: UUID!) { deleteApiKey(id: $id) }"


def _people(admin: Session, client: httpx.Client) -> list[Any]:
    edges: list[Any] = graphql_data(
        client, admin.access_token, "{ people(first: 50) { edges { node { firstName } } } }"
    )["people"]["edges"]
    return edges


@asynccontextmanager
async def _key_socket(
    base_url: str, client: httpx.Client
) -> AsyncIterator[tuple[Session, dict[str, Any], Socket]]:
    """A new workspace's admin, an API key of theirs, and a socket initialised with the key."""
    admin = signup(client)
    key = graphql_data(client, admin.access_token, CREATE_KEY)["createApiKey"]
    async with await Socket.open(base_url) as socket:
        await socket.init(key["token"])
        yield admin, key, socket


async def test_a_mutation_after_the_key_is_deleted_closes_4401_and_writes_nothing(
    base_url: str, client: httpx.Client
) -> None:
    async with _key_socket(base_url, client) as (admin, key, socket):
        await socket.subscribe("q", "{ people(first: 1) { edges { node { id } } } }")
        assert (await socket.receive())["type"] == "next"
        assert (await socket.receive())["type"] == "complete"
        await asyncio.to_thread(graphql_data, client, admin.access_token, DELETE_KEY, key)
        await socket.subscribe("m", 'mutation { createPerson(data: {firstName: "Ghost"}) { id } }')
        code, reason = await socket.closed(timeout=20)
        assert code == 4401
        assert "revoked" in reason
    assert await asyncio.to_thread(_people, admin, client) == []


async def test_an_open_subscription_closes_4401_soon_after_its_key_is_deleted(
    base_url: str, client: httpx.Client
) -> None:
    async with _key_socket(base_url, client) as (admin, key, socket):
        await socket.subscribe("p", "subscription { personCreated { id } }")
        await wait_for_subscriptions(base_url, 1)
        await asyncio.to_thread(graphql_data, client, admin.access_token, DELETE_KEY, key)
        code, reason = await socket.closed(timeout=30)  # default re-check: every 5 s
        assert code == 4401
        assert "revoked" in reason


def _member_with_role(client: httpx.Client, admin: Session) -> tuple[Session, str]:
    role_id: str = graphql_data(
        client,
        admin.access_token,
        "mutation($input: CreateRoleInput!) { createRole(input: $input) { id } }",
        {
            "input": {
                "name": f"Readers {unique_email()}",
                "permissions": [{"object": "*", "actions": ["READ"]}],
            }
        },
    )["createRole"]["id"]
    email = unique_email("reader")
    graphql_data(
        client,
        admin.access_token,
        "mutation($input: AddWorkspaceMemberInput!) { addWorkspaceMember(input: $input) { id } }",
        {"input": {"email": email, "password": "reader password", "roleId": role_id}},
    )
    return login(client, email, "reader password", admin.workspace_id), role_id


async def test_a_role_losing_read_on_company_stops_company_in_open_subscriptions(
    base_url: str, client: httpx.Client
) -> None:
    admin = Api.signup(client)
    reader, role_id = await asyncio.to_thread(_member_with_role, client, admin.session)
    company = await asyncio.to_thread(admin.create, "companies", {"name": "Secret Co"})
    person = {"firstName": "P", "company": {"connect": company["id"]}}
    async with await Socket.open(base_url) as socket:
        await socket.init(reader.access_token)
        await socket.subscribe("p", "subscription { personCreated { firstName company { name } } }")
        await wait_for_subscriptions(base_url, 1)
        await asyncio.to_thread(admin.create, "people", person)
        assert await socket.next_data("p") == {
            "personCreated": {"firstName": "P", "company": {"name": "Secret Co"}}
        }
        await asyncio.to_thread(
            graphql_data,
            client,
            admin.session.access_token,
            "mutation($input: UpdateRoleInput!) { updateRole(input: $input) { id } }",
            {"input": {"id": role_id, "permissions": [{"object": "person", "actions": ["READ"]}]}},
        )
        deadline = time.monotonic() + 40
        seen: list[Any] = []
        while time.monotonic() < deadline:
            await asyncio.to_thread(admin.create, "people", person)
            try:
                message = await socket.receive(timeout=3)
            except TimeoutError:
                continue  # an event during the restart of the subscription
            assert message["type"] == "next", message
            seen.append(message["payload"]["data"]["personCreated"])
            if seen[-1]["company"] is None:
                break
        assert seen, "no event arrived after the role change"
        assert seen[-1] == {"firstName": "P", "company": None}, seen
        # Every event after that hides the company too.
        last = {"firstName": "Last", "company": {"connect": company["id"]}}
        await asyncio.to_thread(admin.create, "people", last)
        while True:
            message = await socket.receive()
            data = message["payload"]["data"]["personCreated"]
            assert data["company"] is None, data
            assert message["payload"]["errors"][0]["extensions"]["code"] == "FORBIDDEN", message
            if data["firstName"] == "Last":
                break
