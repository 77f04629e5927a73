"""Costs that stay flat on large tables: keyset pages on nullable sort keys and capped counts.

The cursor walks run on a small workspace (every order, both directions, many nulls and ties);
the cost checks on a 20,000-row one: a page deep into an order on a nullable field reads about
a page of rows (Postgres' own per-table counters, no timing), and totalCount above the cap is
an estimate marked as such unless the client asks for an exact count.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from crm.common.v1 import common_pb2
from crmstack.stack import Stack
from records import counts, ddl
from records.sql import workspace_schema_name
from tests.integration.api_helpers import Api
from tests.integration.records_client import Workspace, provision

ASC, DESC = common_pb2.SORT_DIRECTION_ASC, common_pb2.SORT_DIRECTION_DESC
LARGE = 20_000
COUNT_CAP = 10_000  # RECORDS_COUNT_CAP's default


@pytest.fixture(scope="module")
def ws(stack: Stack | None) -> Workspace:
    if stack is None:
        pytest.skip("calls services over gRPC: needs the local launcher")
    workspace = provision(stack)
    rows = [
        {
            "name": f"c{i:03d}",
            "employees": None if i % 5 < 3 else [10, 20, 30][i % 3],
            "city": ["B", "A", None][i % 3],
        }
        for i in range(240)
    ]
    workspace.create_many("company", rows)
    return workspace


def field_of(name: str, row: dict[str, Any]) -> tuple[bool, Any]:
    value = row[name]
    return (value is None, value if value is not None else 0)


def expected(ws: Workspace, keys: list[tuple[str, bool]], id_descending: bool) -> list[str]:
    """The order computed in Python: nulls largest, id as the final tie breaker."""
    rows = list(ws.list_all("company", page=200))
    result = sorted(rows, key=lambda r: str(r["id"]), reverse=id_descending)
    for name, descending in reversed(keys):  # stable sorts, least significant key first
        result.sort(key=functools.partial(field_of, name), reverse=descending)
    return [str(r["id"]) for r in result]


def walk_backward(ws: Workspace, page: int, order_by: list[common_pb2.OrderBy]) -> list[str]:
    seen: list[str] = []
    before = ""
    while True:
        rows, response = ws.list("company", last=page, before=before, order_by=order_by)
        seen[:0] = [row["id"] for row in rows]
        if not response.page_info.has_previous_page:
            return seen
        before = response.page_info.start_cursor


ORDERS = [
    ([("employees", False)], False),
    ([("employees", True)], True),
    ([("employees", False)], True),  # id DESC after a nullable ASC key
    ([("employees", True)], False),
    ([("city", False), ("employees", True)], True),
    ([("city", True), ("employees", False)], False),
]


@pytest.mark.parametrize(("keys", "id_descending"), ORDERS)
def test_cursor_walks_cover_every_record_once_both_ways(
    ws: Workspace, keys: list[tuple[str, bool]], id_descending: bool
) -> None:
    order_by = [common_pb2.OrderBy(field=f, direction=DESC if d else ASC) for f, d in keys]
    order_by.append(common_pb2.OrderBy(field="id", direction=DESC if id_descending else ASC))
    want = expected(ws, keys, id_descending)
    assert len(want) == 240
    forward = [row["id"] for row in ws.list_all("company", page=7, order_by=order_by)]
    assert forward == want
    assert walk_backward(ws, 7, order_by) == want


# -- a large table ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def large(stack: Stack | None, client: httpx.Client) -> Api:
    if stack is None:
        pytest.skip("reads Postgres' table statistics: needs the local launcher")
    api = Api.signup(client)
    # Deep pages read about a page on an indexed key (company.employees is not by default).
    fields = api.data(
        "query($id: UUID!) { fields(filter: {objectMetadataId: {eq: $id}}) "
        "{ edges { node { id name } } } }",
        {"id": api.object_id("company")},
        path="/metadata",
    )["fields"]["edges"]
    employees = next(e["node"]["id"] for e in fields if e["node"]["name"] == "employees")
    api.data(
        "mutation($id: UUID!) { updateField(input: {id: $id, isIndexed: true}) { isIndexed } }",
        {"id": employees},
        path="/metadata",
    )
    for start in range(0, LARGE, 1000):
        batch = [
            {"name": f"big{i}", "employees": None if i % 10 < 3 else i % 500}
            for i in range(start, start + 1000)
        ]
        api.ok("POST", "/rest/batch/companies", 201, json=batch, timeout=120)
    analyze(stack, api.session.workspace_id)
    return api


def analyze(stack: Stack, workspace_id: str) -> None:
    """Table statistics as autovacuum keeps them on a settled table (a test cannot wait for it)."""

    async def run() -> None:
        connection = await asyncpg.connect(stack.env["DATABASE_URL"])
        try:
            await connection.execute(f"ANALYZE {workspace_schema_name(workspace_id)}.company")
        finally:
            await connection.close()

    asyncio.run(run())


def rows_read(stack: Stack, workspace_id: str) -> int:
    """Tuples Postgres read from the workspace's company table, by any scan, so far."""

    async def read() -> int:
        connection = await asyncpg.connect(stack.env["DATABASE_URL"])
        try:
            value = await connection.fetchval(
                "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) "
                "FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'company'",
                workspace_schema_name(workspace_id),
            )
            return int(value or 0)
        finally:
            await connection.close()

    return asyncio.run(read())


def settled_rows_read(stack: Stack, workspace_id: str) -> int:
    """The counter once every backend has flushed its statistics (they do within ~10 s idle)."""
    deadline = time.monotonic() + 120
    last = rows_read(stack, workspace_id)
    while time.monotonic() < deadline:
        time.sleep(11)
        now = rows_read(stack, workspace_id)
        if now == last:
            return now
        last = now
    raise AssertionError("the table's statistics did not settle")


PAGE = """query($after: String, $filter: CompanyFilter, $order: [CompanyOrderBy!]) {
  companies(first: 50, after: $after, filter: $filter, orderBy: $order) {
    edges { node { id employees } }
    pageInfo { endCursor hasNextPage }
  }
}"""


def test_a_deep_page_on_a_nullable_key_reads_about_a_page(large: Api, stack: Stack) -> None:
    order = [{"employees": "ASC"}]
    # A cursor about 65% into the order: the last record with employees 456 (of 0..499).
    near = large.data(PAGE, {"filter": {"employees": {"eq": 456}}, "order": order})
    cursor = near["companies"]["pageInfo"]["endCursor"]
    before = settled_rows_read(stack, large.session.workspace_id)
    page = large.data(PAGE, {"after": cursor, "order": order})["companies"]
    values = [edge["node"]["employees"] for edge in page["edges"]]
    assert len(values) == 50
    assert values[0] >= 456  # the page starts where the cursor points
    deadline = time.monotonic() + 60
    while (after := rows_read(stack, large.session.workspace_id)) == before:
        assert time.monotonic() < deadline, "the page's reads never showed in the statistics"
        time.sleep(0.5)
    time.sleep(2)
    read = rows_read(stack, large.session.workspace_id) - before
    # An OR of the keyset conditions walks the index from its start (~13,000 rows here).
    assert read < 1000, f"a 50-record page read {read} rows"
    assert after > before


COUNT = """query($exact: Boolean, $filter: CompanyFilter) {
  companies(first: 1, exactCount: $exact, filter: $filter) { totalCount totalCountIsEstimate }
}"""


def test_total_count_beyond_the_cap_is_a_marked_estimate(large: Api) -> None:
    counted = large.data(COUNT)["companies"]
    assert counted["totalCountIsEstimate"] is True
    assert counted["totalCount"] > COUNT_CAP


def test_exact_count_on_request_and_below_the_cap(large: Api) -> None:
    exact = large.data(COUNT, {"exact": True})["companies"]
    assert exact == {"totalCount": LARGE, "totalCountIsEstimate": False}
    few = large.data(COUNT, {"filter": {"employees": {"eq": 7}}})["companies"]
    assert few == {"totalCount": 40, "totalCountIsEstimate": False}


def test_an_unfiltered_capped_count_reads_the_first_pages_through_the_cache(
    large: Api, stack: Stack
) -> None:
    """Unfiltered, the cap's rows are the table's first pages, read by a TID range scan from the
    first page: through the shared buffer cache, where a large table's sequential scan reads
    through a small ring and its pages do not stay."""
    table = f'{workspace_schema_name(large.session.workspace_id)}."company"'

    async def plan(where: str, unfiltered: bool) -> dict[str, Any]:
        connection = await asyncpg.connect(stack.env["DATABASE_URL"])
        try:
            sql = counts.capped_count_sql(table, where, COUNT_CAP, unfiltered)
            text = await connection.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
            return dict(orjson.loads(text)[0]["Plan"])
        finally:
            await connection.close()

    def scans(node: dict[str, Any]) -> list[tuple[str, str]]:
        own = [(node["Node Type"], node.get("Index Name", ""))] if "Relation Name" in node else []
        return own + [scan for child in node.get("Plans", []) for scan in scans(child)]

    unfiltered = asyncio.run(plan('t."deletedAt" IS NULL', True))
    assert scans(unfiltered) == [("Tid Range Scan", "")]
    assert unfiltered["Actual Rows"] == 1
    counted = large.data(COUNT)["companies"]  # the same count through the API
    assert counted["totalCountIsEstimate"] is True


AGGREGATE = """query($exact: Boolean) {
  companiesAggregate(exactCount: $exact) { count countIsEstimate }
}"""


def test_an_aggregate_count_alone_is_capped_like_total_count(large: Api) -> None:
    counted = large.data(AGGREGATE)["companiesAggregate"]
    assert counted["countIsEstimate"] is True
    assert counted["count"] > COUNT_CAP
    exact = large.data(AGGREGATE, {"exact": True})["companiesAggregate"]
    assert exact == {"count": LARGE, "countIsEstimate": False}
    # With sums every matching row is read anyway: the count is exact.
    query = "{ companiesAggregate { count countIsEstimate sum { employees } } }"
    with_sums = large.data(query)["companiesAggregate"]
    assert with_sums["count"] == LARGE
    assert with_sums["countIsEstimate"] is False


async def catalog_by_schema_scan(connection: asyncpg.Connection, schema: str) -> ddl.Catalog:
    """The catalog as read before: every relation of the schema found by namespace name."""
    catalog = ddl.Catalog(exists=True)
    for row in await connection.fetch(
        "SELECT c.relname, coalesce(obj_description(c.oid, 'pg_class'), '') AS tag, a.attname, "
        "format_type(a.atttypid, a.atttypmod) AS type, "
        "coalesce(col_description(c.oid, a.attnum), '') AS column_tag, "
        "a.attgenerated <> '' AS generated FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_attribute a ON a.attrelid = c.oid "
        "AND a.attnum > 0 AND NOT a.attisdropped WHERE n.nspname = $1 AND c.relkind = 'r'",
        schema,
    ):
        table = catalog.tables.setdefault(row[0], ddl.CatalogTable(row[0], row[1]))
        table.columns[row[2]] = ddl.CatalogColumn(row[2], row[3], row[4], row[5])
    for row in await connection.fetch(
        "SELECT c.relname, t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = $1 AND c.relkind = 'r' AND NOT t.tgisinternal",
        schema,
    ):
        catalog.tables[row[0]].triggers.add(row[1])
    catalog.indexes = {
        row[0]
        for row in await connection.fetch(
            "SELECT indexname FROM pg_indexes WHERE schemaname = $1", schema
        )
    }
    catalog.constraints = {
        row[0]
        for row in await connection.fetch(
            "SELECT con.conname FROM pg_constraint con "
            "JOIN pg_namespace n ON n.oid = con.connamespace WHERE n.nspname = $1",
            schema,
        )
    }
    return catalog


def test_the_catalog_read_by_table_is_the_schema_scan(ws: Workspace, stack: Stack) -> None:
    async def compare() -> None:
        connection = await asyncpg.connect(stack.env["DATABASE_URL"])
        try:
            schema = workspace_schema_name(ws.id)
            read = await ddl.read_catalog(connection, schema)
            assert read == await catalog_by_schema_scan(connection, schema)
            assert len(read.tables) >= 5
            assert read.indexes
            assert read.constraints
            assert any(table.triggers for table in read.tables.values())
            missing = await ddl.read_catalog(connection, "ws_" + "0" * 32)
            assert missing == ddl.Catalog(exists=False)
        finally:
            await connection.close()

    asyncio.run(compare())
