"""Which fields get which index (docs/data-model.md, "Indexes"), as an operator sees it: the
workspace's indexes in the PostgreSQL catalog, and each index's own scan counter
(`pg_stat_user_indexes.idx_scan`) moving when an API request that needs it runs.

Text gets a btree on its first 256 characters (sort, keyset pages, `eq`); label fields and emails
also a trigram GIN (`contains`, `startsWith`, `endsWith`); no hash indexes; booleans none.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import httpx
import pytest

from crmstack.stack import Stack
from tests.integration.api_helpers import Api

ROWS = 3_000


def _email(i: int) -> str:
    """Varied addresses: a fragment's trigrams pick few rows, as in real data."""
    local = hashlib.md5(str(i).encode(), usedforsecurity=False).hexdigest()[:10]
    return f"{local}@{hashlib.md5(f'd{i}'.encode(), usedforsecurity=False).hexdigest()[:6]}.test"


@pytest.fixture(scope="module")
def seeded(client: httpx.Client, stack: Stack | None) -> tuple[Api, str, str]:
    if stack is None:
        pytest.skip("reads Postgres' catalog and statistics: needs the local launcher")
    api = Api.signup(client)
    for start in range(0, ROWS, 1000):
        api.ok(
            "POST",
            "/rest/batch/people",
            201,
            json=[
                {
                    "firstName": f"first{i:05d}",
                    "lastName": f"last{i % 997:04d}",
                    "email": _email(i),
                    "jobTitle": f"title{i % 13}",
                }
                for i in range(start, start + 1000)
            ],
        )
    dsn = stack.env["DATABASE_URL"]
    schema = "ws_" + api.session.workspace_id.replace("-", "")
    # As autovacuum would, sooner: statistics, and the GIN pending list merged into the index.
    asyncio.run(_execute(dsn, f'VACUUM ANALYZE "{schema}".person'))
    return api, dsn, schema


async def _execute(dsn: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(dsn)
    try:
        return list(await connection.fetch(sql, *args))
    finally:
        await connection.close()


def _definitions(dsn: str, schema: str, table: str) -> list[str]:
    rows = asyncio.run(
        _execute(
            dsn,
            "SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename = $2",
            schema,
            table,
        )
    )
    return [row[0] for row in rows]


def _ident(column: str) -> str:
    """`column` as pg_get_indexdef spells it (quoted only when it must be)."""
    return column if column == column.lower() else f'"{column}"'


def _on(definitions: list[str], column: str) -> list[str]:
    """The index definitions that cover `column`, reduced to their method and key."""
    pattern = re.compile(rf"[(\s]{re.escape(_ident(column))}[,)\s]")
    return sorted(
        definition.split(" USING ", 1)[1]
        for definition in definitions
        if pattern.search(definition)
    )


def _keyed(column: str) -> str:
    return f'btree ("left"({_ident(column)}, 256), id)'


def _trigram(column: str) -> str:
    return f"gin ({_ident(column)} records.gin_trgm_ops)"


def test_each_field_gets_the_indexes_its_kind_needs(seeded: tuple[Api, str, str]) -> None:
    _, dsn, schema = seeded
    person = _definitions(dsn, schema, "person")
    assert _on(person, "firstName") == [_keyed("firstName"), _trigram("firstName")]
    assert _on(person, "email") == [_keyed("email"), _trigram("email")]
    for column in ("lastName", "jobTitle", "phone", "city", "linkedinLink"):
        assert _on(person, column) == [_keyed(column)], column
    assert _on(person, "companyId") == ['btree ("companyId", id)']
    assert not any("USING hash" in definition for definition in person), person
    company = _definitions(dsn, schema, "company")
    assert _on(company, "idealCustomerProfile") == []
    assert _on(company, "name") == [_keyed("name"), _trigram("name")]


def _scans(dsn: str, schema: str) -> dict[str, int]:
    """Scans started on each index of the person table, by index definition key."""
    rows = asyncio.run(
        _execute(
            dsn,
            "SELECT i.indexdef, s.idx_scan FROM pg_stat_user_indexes s JOIN pg_indexes i "
            "ON i.schemaname = s.schemaname AND i.indexname = s.indexrelname "
            "WHERE s.schemaname = $1 AND s.relname = 'person'",
            schema,
        )
    )
    return {row[0].split(" USING ", 1)[1]: int(row[1] or 0) for row in rows}


def _served_by(dsn: str, schema: str, index: str, request: Callable[[], Any]) -> None:
    """`request` starts a scan of `index` (statistics reach the view within ~10 s of idle)."""
    before = _scans(dsn, schema)[index]
    request()
    deadline = time.monotonic() + 60
    while _scans(dsn, schema)[index] == before:
        assert time.monotonic() < deadline, f"no scan of {index}: {_scans(dsn, schema)}"
        time.sleep(1)


def test_sort_pages_equality_and_fragments_use_their_indexes(
    seeded: tuple[Api, str, str],
) -> None:
    api, dsn, schema = seeded
    last_name = _keyed("lastName")

    def sorted_page() -> None:
        page = api.ok("GET", "/rest/people", params={"orderBy[lastName]": "DESC", "limit": "20"})
        names = [row["lastName"] for row in page["data"]]
        assert names == sorted(names, reverse=True)
        assert names[0] == "last0996"

    _served_by(dsn, schema, last_name, sorted_page)

    def deep_page() -> None:
        near = api.ok(
            "GET",
            "/rest/people",
            params={"orderBy[lastName]": "ASC", "filter[lastName][eq]": "last0900", "limit": "5"},
        )
        cursor = near["pageInfo"]["endCursor"]
        page = api.ok(
            "GET",
            "/rest/people",
            params={"orderBy[lastName]": "ASC", "limit": "5", "after": cursor},
        )
        assert next(row["lastName"] for row in page["data"]) == "last0901"

    _served_by(dsn, schema, last_name, deep_page)

    def equal() -> None:
        found = api.ok("GET", "/rest/people", params={"filter[lastName][eq]": "last0042"})
        assert len(found["data"]) == 3

    _served_by(dsn, schema, last_name, equal)

    fragment_text = _email(1234)[3:9].upper()  # contains ignores case
    wanted = sorted(_email(i) for i in range(ROWS) if fragment_text.lower() in _email(i))

    def fragment() -> None:
        found = api.ok("GET", "/rest/people", params={"filter[email][contains]": fragment_text})
        assert sorted(row["email"] for row in found["data"]) == wanted

    _served_by(dsn, schema, _trigram("email"), fragment)

    def prefix() -> None:
        found = api.ok("GET", "/rest/people", params={"filter[firstName][startsWith]": "first0299"})
        assert len(found["data"]) == 10

    _served_by(dsn, schema, _trigram("firstName"), prefix)
