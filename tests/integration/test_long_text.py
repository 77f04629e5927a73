"""Text up to the documented 65,536 characters round-trips and stays filterable; longer text
is the client's 400 naming the field (issue 17.7: b-tree index rows cap at ~2.7 kB)."""

from __future__ import annotations

import asyncio
import hashlib
import random
import string
import subprocess
import sys
from typing import Any

import asyncpg
import httpx
import pytest

from crmstack.stack import Stack
from tests.integration.api_helpers import Api

LIMIT = 65_536


@pytest.fixture
def api(client: httpx.Client) -> Api:
    return Api.signup(client)


def _random_ascii(length: int, seed: int) -> str:
    generator = random.Random(seed)
    return "".join(generator.choice(string.ascii_letters + string.digits) for _ in range(length))


@pytest.mark.parametrize(
    "value",
    [
        _random_ascii(2_800, 1),
        _random_ascii(LIMIT, 2),
        "\U0001f600" * LIMIT,
    ],
    ids=["2800-ascii", "limit-ascii", "limit-emoji"],
)
def test_long_text_round_trips_and_stays_filterable(api: Api, value: str) -> None:
    created = api.create("people", {"firstName": value, "city": value})
    other = api.create("people", {"firstName": value[:-1] + "!", "city": "x"})
    assert api.ok("GET", f"/rest/people/{created['id']}")["data"]["firstName"] == value
    middle = value[len(value) // 2 : len(value) // 2 + 40]
    for field, operator, operand in (
        ("city", "eq", value),
        ("city", "contains", middle),
        ("city", "startsWith", value[:-1]),
        ("firstName", "eq", value),
        ("firstName", "endsWith", value[-300:]),  # searchable: prefiltered by 256 characters
    ):
        assert _found(api, {field: {operator: operand}}) == [created["id"]], operator
    both = sorted([created["id"], other["id"]])
    for operator, operand in (("contains", middle), ("startsWith", value[:-1])):
        assert sorted(_found(api, {"firstName": {operator: operand}})) == both, operator
    if len(value) < 4_000:  # the REST form too, within what a query string holds
        found = api.ok("GET", "/rest/people", params={"filter[city][eq]": value})["data"]
        assert [row["id"] for row in found] == [created["id"]]
    updated = api.ok("PATCH", f"/rest/people/{other['id']}", json={"firstName": value})
    assert updated["data"]["firstName"] == value
    ordered = api.ok("GET", "/rest/people", params={"orderBy[firstName]": "ASC"})["data"]
    assert len(ordered) == 2


def _found(api: Api, flt: dict[str, Any]) -> list[str]:
    data = api.data(
        "query($f: PersonFilter) { people(filter: $f) { edges { node { id } } } }", {"f": flt}
    )
    return [edge["node"]["id"] for edge in data["people"]["edges"]]


def test_text_above_the_limit_is_bad_request_naming_the_field(api: Api) -> None:
    for value in ("a" * (LIMIT + 1), "\U0001f600" * (LIMIT + 1)):
        body = api.bad("POST", "/rest/people", json={"firstName": "Ada", "jobTitle": value})
        assert body["details"]["field"] == "jobTitle", body
    assert api.ok("GET", "/rest/people")["data"] == []


def test_a_unique_text_field_takes_long_values(api: Api) -> None:
    api.create_field(api.object_id("company"), "code", "TEXT", isUnique=True)
    value = _random_ascii(10_000, 3)
    api.create("companies", {"name": "A", "code": value})
    body = api.bad("POST", "/rest/companies", json={"name": "B", "code": value})
    assert body["details"]["field"] == "code", body
    api.create("companies", {"name": "C", "code": value + "x"})


async def _indexes(dsn: str, schema: str, *, old_shape: bool = False) -> list[str]:
    """The index definitions on person.firstName; with old_shape, first put back the hash and
    per-field trigram indexes earlier versions built, named as they named them."""
    connection = await asyncpg.connect(dsn)
    try:
        sql = (
            "SELECT i.indexname, i.indexdef FROM pg_indexes i WHERE i.schemaname = $1 "
            "AND i.tablename = 'person' AND i.indexdef LIKE '%\"firstName\"%'"
        )
        if old_shape:
            ids = await connection.fetchrow(
                "SELECT obj_description(c.oid, 'pg_class'), col_description(c.oid, a.attnum) "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "JOIN pg_attribute a ON a.attrelid = c.oid "
                "WHERE n.nspname = $1 AND c.relname = 'person' AND a.attname = 'firstName'",
                schema,
            )
            assert ids is not None
            object_id, field_id = ids[0].split(":")[-1], ids[1].split(":")[-1]
            digest = hashlib.sha256(f"{object_id}:{field_id}".encode()).hexdigest()[:24]
            for row in await connection.fetch(sql, schema):
                await connection.execute(f'DROP INDEX "{schema}"."{row[0]}"')
            await connection.execute(
                f'CREATE INDEX "hx_{digest}" ON "{schema}".person USING hash ("firstName")'
            )
            await connection.execute(
                f'CREATE INDEX "tg_{digest}" ON "{schema}".person '
                'USING gin ("firstName" records.gin_trgm_ops)'
            )
        return sorted(row[1] for row in await connection.fetch(sql, schema))
    finally:
        await connection.close()


def test_a_workspace_planned_before_gets_the_new_index_shape(api: Api, local_stack: Stack) -> None:
    dsn, schema = local_stack.env["DATABASE_URL"], "ws_" + api.session.workspace_id.replace("-", "")
    before = asyncio.run(_indexes(dsn, schema, old_shape=True))
    assert len(before) == 2, before
    assert "USING hash" in before[0], before
    assert "USING gin" in before[1], before
    subprocess.run(
        [sys.executable, "-m", "records", "migrate"], env=local_stack.env, check=True, timeout=120
    )
    after = asyncio.run(_indexes(dsn, schema))
    # The label field: a btree on its first 256 characters; fragments go through the search
    # column's GIN (data-model.md, "Indexes").
    assert len(after) == 1, after
    assert 'USING btree ("left"("firstName", 256), id)' in after[0], after
    value = _random_ascii(5_000, 5)
    created = api.create("people", {"firstName": value})
    assert _found(api, {"firstName": {"eq": value}}) == [created["id"]]
