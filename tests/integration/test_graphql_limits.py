"""GraphQL request limits (docs/api.md, Query cost), checked before anything runs: too many
aliases or top-level fields, too deep, too many tokens or too costly is BAD_USER_INPUT (400)
naming the limit and nothing is executed; each top-level mutation field is one call against
the rate limit; every response reports its cost in `extensions.cost`. Default limits."""

from __future__ import annotations

import httpx
import pytest

from crmstack.client import Session, graphql, graphql_data, signup
from tests.integration.subscriptions_client import Socket

MAX_COST = 25_000  # GRAPHQL_MAX_COST's default
PEOPLE_COUNT = "{ people { totalCount } }"


@pytest.fixture(scope="module")
def admin(client: httpx.Client) -> Session:
    return signup(client)


def people(client: httpx.Client, admin: Session) -> int:
    count: int = graphql_data(client, admin.access_token, PEOPLE_COUNT)["people"]["totalCount"]
    return count


def refused(response: httpx.Response, named: str) -> dict[str, object]:
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["data"] is None
    (error,) = body["errors"]
    assert error["extensions"]["code"] == "BAD_USER_INPUT", body
    assert named in error["message"], error
    return body  # type: ignore[no-any-return]


def test_every_response_reports_its_cost_and_the_maximum(
    client: httpx.Client, admin: Session
) -> None:
    response = graphql(
        client,
        admin.access_token,
        "{ people(first: 10) { edges { node { id } } } companies { totalCount } }",
    )
    assert response.status_code == 200, response.text
    assert response.json()["extensions"]["cost"] == {
        "requestedQueryCost": 10 + 50,  # ten people, a default page of companies
        "maximumQueryCost": MAX_COST,
    }
    nested = """query($n: Int) { companies(first: $n) { edges { node {
        people(first: 20) { edges { node { id } } } } } } }"""
    response = graphql(client, admin.access_token, nested, {"n": 30})
    assert response.json()["extensions"]["cost"]["requestedQueryCost"] == 30 + 30 * 20


def test_five_hundred_aliased_pages_are_refused_before_running(
    client: httpx.Client, admin: Session
) -> None:
    aliases = " ".join(
        f"p{i}: people(first: 200) {{ edges {{ node {{ id }} }} }}" for i in range(500)
    )
    refused(graphql(client, admin.access_token, "{ " + aliases + " }"), "aliases")
    many = " ".join(f"p{i}: people(first: 1) {{ totalCount }}" for i in range(2000))
    refused(graphql(client, admin.access_token, "{ " + many + " }"), "tokens")


def test_a_query_over_the_cost_limit_is_refused_with_its_cost(
    client: httpx.Client, admin: Session
) -> None:
    query = """{ companies(first: 200) { edges { node {
        people(first: 200) { edges { node { id } } } } } } }"""
    body = refused(graphql(client, admin.access_token, query), f"maximum of {MAX_COST}")
    assert body["extensions"] == {
        "cost": {"requestedQueryCost": 200 + 200 * 200, "maximumQueryCost": MAX_COST}
    }


def test_too_deep_a_query_is_refused(client: httpx.Client, admin: Session) -> None:
    # Each hop nests four levels (company, people, edges, node): 3 + 4 * 4 = 19 > 15.
    opened = (
        "people(first: 1) { edges { node { " + "company { people(first: 1) { edges { node { " * 4
    )
    query = "{ " + opened + "id" + " }" * opened.count("{") + " }"
    refused(graphql(client, admin.access_token, query), "deeper than 15")


def test_aliased_mutations_count_one_call_each_and_too_many_run_none(
    client: httpx.Client, admin: Session
) -> None:
    before = people(client, admin)
    fifty = " ".join(f'c{i}: createPerson(data: {{firstName: "A{i}"}}) {{ id }}' for i in range(50))
    response = graphql(client, admin.access_token, "mutation { " + fifty + " }")
    assert response.status_code == 200, response.text
    remaining = int(response.headers["x-ratelimit-remaining"])
    check = graphql(client, admin.access_token, PEOPLE_COUNT)
    assert int(check.headers["x-ratelimit-remaining"]) == remaining - 1
    assert check.json()["data"]["people"]["totalCount"] == before + 50
    # The 50 creations were 50 calls: the remaining budget before them was 50 higher.
    first = graphql(client, admin.access_token, PEOPLE_COUNT)
    fifty_more = graphql(client, admin.access_token, "mutation { " + fifty + " }")
    assert (
        int(first.headers["x-ratelimit-remaining"])
        - int(fifty_more.headers["x-ratelimit-remaining"])
        == 50
    )

    over = " ".join(f'c{i}: createPerson(data: {{firstName: "B{i}"}}) {{ id }}' for i in range(51))
    refused(graphql(client, admin.access_token, "mutation { " + over + " }"), "aliases")
    assert people(client, admin) == before + 100


async def test_websocket_operations_get_the_same_limits(
    client: httpx.Client, base_url: str, admin: Session
) -> None:
    aliases = " ".join(f"p{i}: people(first: 1) {{ totalCount }}" for i in range(51))
    three = " ".join(f'c{i}: createPerson(data: {{firstName: "W{i}"}}) {{ id }}' for i in range(3))
    async with await Socket.open(base_url) as socket:
        await socket.init(admin.access_token)
        before = graphql(client, admin.access_token, PEOPLE_COUNT)
        await socket.subscribe("0", "mutation { " + three + " }")
        assert len(await socket.next_data("0")) == 3
        after = graphql(client, admin.access_token, PEOPLE_COUNT)
        spent = int(before.headers["x-ratelimit-remaining"]) - int(
            after.headers["x-ratelimit-remaining"]
        )
        assert spent == 3 + 1  # the three creations over the socket, then this call
        assert await socket.receive() == {"type": "complete", "id": "0"}
        await socket.subscribe("1", "{ " + aliases + " }")
        message = await socket.receive()
        assert (message["type"], message["id"]) == ("error", "1"), message
        (error,) = message["payload"]
        assert error["extensions"]["code"] == "BAD_USER_INPUT"
        assert "aliases" in error["message"]
