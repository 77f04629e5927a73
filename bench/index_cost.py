"""What each group of a person row's indexes costs a batch insert, in PostgreSQL alone (#27
item 4): the records service's own create statement (`records.writes.create_statement`: the
INSERT of 1,000 people with its outbox and history CTEs) run over asyncpg, with the table's
index set as the records planner made it, then without each group, blocks alternated round by
round. The cost is the CPU time of the PostgreSQL backend running the statements (from /proc),
per row: on a shared machine latency says little, CPU time of the one process doing the work
does.

    .venv/bin/python bench/index_cost.py [--rounds 8] [--batches 4] [--rows 1000000]

Groups (each dropped alone, then rebuilt from its catalog definition):
  trigram GINs: the per-field `tg_` GIN indexes (gin_trgm_ops), where the planner still makes them
  text btrees: every `tx_` (left(column, 256), id) btree
  search column: the `_search_` column, its triggers and its GIN
  history CTE: the statement without its record_history insert
  FK check: the foreign key of `companyId` (a lookup of the company per row)
  #27 rule: the index set of docs/data-model.md "Indexes" (btrees on firstName, lastName and
            email only among text fields; no per-field trigram GIN)
  earlier set: where the planner already makes the #27 set, the earlier one put back (trigram
            GINs on firstName and email, btrees on phone, jobTitle, city and linkedinLink)
Each block starts from the same table of 10,000 people (the block's rows deleted and the table
vacuumed after it); a variant's figure is the median of its blocks' means. Then a second
workspace's person table grows to `--rows` people (the same statement, history kept; the outbox
truncated as a relay would drain it) and blocks alternate between the two tables: the write cost
at that size beside the one at 10,000 under the same machine load (issue 27: within 1.3x), and
fragment filters on the large table (p50, backend CPU, plan). PostgreSQL runs
without fsync (crmstack's fast_postgres), so the figures are CPU rather than the disk. Prints a
table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import asyncpg
import httpx
import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from crm.common.v1 import common_pb2
from crm.metadata.v1 import metadata_pb2 as md
from crm.records.v1 import records_pb2
from crmkit.authz import Access
from crmstack.client import signup
from crmstack.stack import Stack, StackConfig
from records import history, inputs, reads, search_ddl, writes
from records.context import RequestContext
from records.model import ObjectModel, WorkspaceModel
from records.sql import quote

BATCH = 1000
START_ROWS = 10_000
INDEXED_TEXT = ("firstName", "lastName", "email")  # the #27 rule's text btrees on person
# What the planner made before the #27 rule, where it is gone: put back for the A/B in one run.
EARLIER_TRIGRAM = ("firstName", "email")
EARLIER_TEXT = ("phone", "jobTitle", "city", "linkedinLink")
ENV = {"LOG_LEVEL": "WARNING", "API_RATE_LIMITING_LIMIT": "1000000000"}
FIRST = ("Ada", "Grace", "Alan", "Linus", "Margaret", "Ken", "Barbara", "Dennis", "Radia")
LAST = ("Lovelace", "Hopper", "Turing", "Torvalds", "Hamilton", "Thompson", "Liskov", "Allen")
TITLES = ("Engineer", "Account Executive", "VP Sales", "CTO", "Product Manager", "Designer")
CITIES = ("Paris", "Berlin", "Lisbon", "Montréal", "São Paulo", "Zürich", "Kraków", "Oslo")


def _person(i: int, rng: random.Random, companies: list[str]) -> dict[str, Any]:
    """A person with every text field filled, as imported contacts usually are."""
    first, last = rng.choice(FIRST), rng.choice(LAST)
    return {
        "firstName": first,
        "lastName": f"{last} {i}",
        "email": f"{first.lower()}.{last.lower()}{i}@{secrets.token_hex(3)}.example.com",
        "phone": f"+1 555 {i:07d}",
        "jobTitle": rng.choice(TITLES),
        "city": rng.choice(CITIES),
        "linkedinLink": f"https://www.linkedin.com/in/{first.lower()}-{last.lower()}-{i}",
        "companyId": rng.choice(companies),
    }


@dataclass
class Variant:
    name: str
    drop_indexes: list[str] = field(default_factory=list)
    drop_search: bool = False
    drop_fk: bool = False
    history: bool = True
    add_indexes: dict[str, str] = field(default_factory=dict)  # name -> CREATE INDEX


@dataclass
class Shape:
    """The person table's removable parts, read from the catalog (to drop and rebuild)."""

    indexes: dict[str, str]  # name -> CREATE INDEX definition
    search_column: str  # "" when none
    search_indexes: dict[str, str]
    foreign_key: str
    foreign_key_definition: str


async def _shape(connection: asyncpg.Connection, obj: ObjectModel) -> Shape:
    rows = await connection.fetch(
        "SELECT c.relname, pg_get_indexdef(c.oid) FROM pg_index i JOIN pg_class c "
        "ON c.oid = i.indexrelid WHERE i.indrelid = to_regclass($1)",
        f'"{obj.schema}"."{obj.name_singular}"',
    )
    indexes = {row[0]: row[1] for row in rows}
    search_column = (
        await connection.fetchval(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass($1) "
            "AND attname LIKE '\\_search\\_%' AND NOT attisdropped",
            f'"{obj.schema}"."{obj.name_singular}"',
        )
        or ""
    )
    search = {n: d for n, d in indexes.items() if search_column and f"({search_column} " in d}
    fk = await connection.fetchrow(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = to_regclass($1) AND contype = 'f'",
        f'"{obj.schema}"."{obj.name_singular}"',
    )
    return Shape(
        {n: d for n, d in indexes.items() if n not in search},
        search_column,
        search,
        fk[0] if fk else "",
        fk[1] if fk else "",
    )


def _earlier(shape: Shape, obj: ObjectModel) -> dict[str, str]:
    """The per-field trigram GINs and text btrees of the earlier index set that are missing."""
    if any(name.startswith("tg_") for name in shape.indexes):
        return {}
    wanted = {
        f"bench_tg_{name}": f"USING gin ({quote(name)} records.gin_trgm_ops)"
        for name in EARLIER_TRIGRAM
    }
    wanted |= {f"bench_tx_{name}": f"(left({quote(name)}, 256), id)" for name in EARLIER_TEXT}
    return {
        name: f"CREATE INDEX {quote(name)} ON {obj.table} {key}" for name, key in wanted.items()
    }


def _variants(shape: Shape, obj: ObjectModel) -> list[Variant]:
    trigram = sorted(n for n in shape.indexes if n.startswith("tg_"))
    text = sorted(n for n in shape.indexes if n.startswith("tx_"))
    unwanted_text = [  # pg_get_indexdef quotes only mixed-case names: "left"(email, 256)
        n
        for n in text
        if not any(
            f"({quote(name) if name != name.lower() else name}, 256)" in shape.indexes[n]
            for name in INDEXED_TEXT
        )
    ]
    found = [
        Variant("as planned"),
        Variant("- trigram GINs", drop_indexes=trigram),
        Variant("- text btrees", drop_indexes=text),
        Variant("- search column", drop_search=True),
        Variant("- history CTE", history=False),
        Variant("- FK check", drop_fk=True),
        Variant("#27 rule", drop_indexes=trigram + unwanted_text),
        Variant("earlier set", add_indexes=_earlier(shape, obj)),
    ]
    return [
        v
        for v in found
        if v.name == "as planned"
        or v.drop_indexes
        or v.add_indexes
        or (v.drop_search and shape.search_column)
        or (v.drop_fk and shape.foreign_key)
        or not v.history
    ]


class Table:
    def __init__(self, connection: asyncpg.Connection, obj: ObjectModel, shape: Shape) -> None:
        self.connection = connection
        self.obj = obj
        self.shape = shape

    async def apply(self, variant: Variant) -> None:
        for definition in variant.add_indexes.values():
            await self.connection.execute(definition)
        for name in variant.drop_indexes:
            await self.connection.execute(f"DROP INDEX {quote(self.obj.schema)}.{quote(name)}")
        if variant.drop_search:
            fields = search_ddl.searchable_fields(self.obj)
            triggers = search_ddl.trigger_names(self.obj, fields)
            for statement in search_ddl.drop_trigger_statements(self.obj, triggers):
                await self.connection.execute(statement)
            await self.connection.execute(
                f"ALTER TABLE {self.obj.table} DROP COLUMN {quote(self.shape.search_column)}"
            )
        if variant.drop_fk:
            await self.connection.execute(
                f"ALTER TABLE {self.obj.table} DROP CONSTRAINT {quote(self.shape.foreign_key)}"
            )

    async def restore(self, variant: Variant) -> None:
        for name in variant.add_indexes:
            await self.connection.execute(f"DROP INDEX {quote(self.obj.schema)}.{quote(name)}")
        for name in variant.drop_indexes:
            await self.connection.execute(self.shape.indexes[name])
        if variant.drop_search:  # as the records planner adds it (records.search_ddl)
            fields = search_ddl.searchable_fields(self.obj)
            for statement in (
                *search_ddl.add_column_statements(self.obj, fields),
                *search_ddl.trigger_statements(self.obj, fields),
            ):
                await self.connection.execute(statement)
            for definition in self.shape.search_indexes.values():
                await self.connection.execute(definition)
        if variant.drop_fk:
            await self.connection.execute(
                f"ALTER TABLE {self.obj.table} ADD CONSTRAINT {quote(self.shape.foreign_key)} "
                f"{self.shape.foreign_key_definition}"
            )


@contextmanager
def _statement(obj: ObjectModel, with_history: bool, with_search: bool) -> Iterator[None]:
    """The create statement without its history CTE, or without the search column's value (the
    variant that dropped the column), while the block runs."""
    if with_history and with_search:
        yield
        return
    # The statement is built once per model (ObjectModel.statements): built again without the
    # part here, and again with it afterwards.
    obj.statements.clear()
    with contextlib.ExitStack() as patches:
        if not with_history:
            patches.enter_context(
                mock.patch.object(
                    history, "history_cte", lambda name, *a, **k: f"{name} AS (SELECT 1)"
                )
            )
        if not with_search:
            patches.enter_context(mock.patch.object(search_ddl, "insert_value", return_value=None))
        try:
            yield
        finally:
            obj.statements.clear()


class Writer:
    """Batches of people through records' own create statement, on one connection."""

    def __init__(
        self,
        connection: asyncpg.Connection,
        principal: common_pb2.Principal,
        obj: ObjectModel,
        companies: list[str],
    ) -> None:
        self.connection = connection
        self.principal = principal
        self.obj = obj
        self.companies = companies
        self.access = Access(own_records_only=False, owner_id=principal.user_id)
        self.ids = inputs.RecordIds()
        self.rng = random.Random(7)
        self.written = 0
        self.block: list[str] = []  # ids written since the last forget()
        self.backend: psutil.Process | None = None

    async def start(self) -> None:
        self.backend = psutil.Process(await self.connection.fetchval("SELECT pg_backend_pid()"))

    def cpu(self) -> float:
        assert self.backend is not None, "start() first"
        times = self.backend.cpu_times()
        return float(times.user + times.system)

    async def batch(
        self, with_history: bool = True, with_search: bool = True
    ) -> tuple[float, float]:
        """One statement of BATCH rows; (backend CPU seconds, wall seconds)."""
        data = [_person(self.written + n, self.rng, self.companies) for n in range(BATCH)]
        rows = inputs.prepare_batch(self.obj, data, self.access, self.ids)
        with _statement(self.obj, with_history, with_search):
            sql, params = writes.create_statement(self.principal, self.obj, rows, ())
        cpu, started = self.cpu(), time.perf_counter()
        async with self.connection.transaction():
            found = await self.connection.fetch(sql, *params.values)
        wall = time.perf_counter() - started
        assert len(found) == BATCH
        self.written += BATCH
        self.block += [row.columns["id"] for row in rows]
        return self.cpu() - cpu, wall

    async def forget(self) -> None:
        """Delete the people written since the last call and their history, drain the outbox
        (as the relay would), vacuum: each block of the comparison starts from the same table."""
        for table, key in ((self.obj.table, "id"), ("records.record_history", "record_id")):
            await self.connection.execute(
                f"DELETE FROM {table} WHERE {key} = ANY($1::uuid[])", self.block
            )
        await self.connection.execute("TRUNCATE records.outbox")
        await self.connection.execute(f"VACUUM {self.obj.table}")
        self.block = []


Samples = dict[str, list[list[tuple[float, float]]]]  # variant -> blocks -> (CPU s, wall s)


async def _block(writer: Writer, variant: Variant, batches: int, into: Samples) -> None:
    into.setdefault(variant.name, []).append(
        [await writer.batch(variant.history, not variant.drop_search) for _ in range(batches)]
    )


def _per_row(blocks: list[list[tuple[float, float]]]) -> dict[str, float]:
    """CPU per row: the median of the blocks' means (a burst of load on the machine moves one
    block, not the figure); wall time per batch: the median batch."""
    means = [sum(s[0] for s in block) / (len(block) * BATCH) for block in blocks]
    walls = [s[1] for block in blocks for s in block]
    return {
        "cpu_us_per_row": round(statistics.median(means) * 1e6, 1),
        "cpu_us_per_row_mean": round(statistics.fmean(means) * 1e6, 1),
        "wall_ms_per_batch_p50": round(statistics.median(walls) * 1000, 1),
        "batches": len(walls),
    }


async def _grow(writer: Writer, rows: int, say: Callable[[str], None]) -> None:
    count = await writer.connection.fetchval(f"SELECT count(*) FROM {writer.obj.table}")
    while count < rows:
        await writer.batch()
        count += BATCH
        if count % 50_000 == 0:
            await writer.connection.execute("TRUNCATE records.outbox")
            writer.block = []
            say(f"  {count:,} people")


@dataclass
class Workspace:
    workspace_id: str
    user_id: str
    companies: list[str]


async def _writer(connection: asyncpg.Connection, workspace: Workspace) -> tuple[Writer, Any]:
    payload = await connection.fetchval(
        "SELECT schema_proto FROM records.workspace_schemas WHERE workspace_id = $1",
        workspace.workspace_id,
    )
    model = WorkspaceModel.from_proto(md.WorkspaceSchema.FromString(payload))
    person = model.object("person")
    assert person is not None
    principal = common_pb2.Principal(
        workspace_id=workspace.workspace_id,
        user_id=workspace.user_id,
        kind=common_pb2.PRINCIPAL_KIND_USER,
    )
    writer = Writer(connection, principal, person, workspace.companies)
    await writer.start()
    return writer, model


async def measure(
    database_url: str,
    small_workspace: Workspace,
    large_workspace: Workspace,
    args: argparse.Namespace,
    say: Callable[[str], None],
) -> dict[str, Any]:
    connection = await asyncpg.connect(database_url)
    for type_name in ("json", "jsonb"):  # as crmkit.db's pools encode JSON parameters
        await connection.set_type_codec(
            type_name,
            encoder=lambda value: orjson.dumps(value).decode(),
            decoder=orjson.loads,
            schema="pg_catalog",
        )
    try:
        small, _ = await _writer(connection, small_workspace)
        person = small.obj
        await _grow(small, START_ROWS, say)
        await small.forget()
        shape = await _shape(connection, person)
        table = Table(connection, person, shape)
        variants = _variants(shape, person)
        say(f"indexes on person: {sorted(shape.indexes)} search: {shape.search_column}")
        samples: Samples = {}
        for round_ in range(args.rounds):
            say(f"round {round_ + 1}/{args.rounds} at {START_ROWS:,} people")
            for variant in variants if round_ % 2 == 0 else list(reversed(variants)):
                await table.apply(variant)
                try:
                    await _block(small, variant, args.batches, samples)
                finally:
                    await table.restore(variant)
                await small.forget()
        result: dict[str, Any] = {
            "start_rows": await connection.fetchval(f"SELECT count(*) FROM {person.table}"),
            "variants": {name: _per_row(blocks) for name, blocks in samples.items()},
        }
        if args.rows > 0:
            # A second workspace grows to the large size; then batches alternate between the two
            # tables (the small one kept at START_ROWS), so both sizes see the same machine load.
            large, model = await _writer(connection, large_workspace)
            say(f"growing a second workspace to {args.rows:,} people")
            await _grow(large, args.rows, say)
            await connection.execute("TRUNCATE records.outbox")
            await connection.execute(f"VACUUM ANALYZE {large.obj.table}")
            large.block = []  # the growth stays
            both: Samples = {}
            planned = Variant("as planned")
            for _ in range(args.rounds):
                await _block(small, planned, args.batches, both)
                await small.forget()
                await _block(large, Variant("large"), args.batches, both)
            result["large_rows"] = await connection.fetchval(
                f"SELECT count(*) FROM {large.obj.table}"
            )
            result["small"] = _per_row(both["as planned"])
            result["large"] = _per_row(both["large"])
            result["large_over_small"] = round(
                result["large"]["cpu_us_per_row"] / result["small"]["cpu_us_per_row"], 2
            )
            result["fragments"] = await _fragments(large, model, 21)
        return result
    finally:
        await connection.close()


# Fragment filters on the large table as a user types them (records' own list path, first page of
# 50 by id): selective ones, and common ones (a ninth or an eighth of the rows match).
FRAGMENTS = (
    ("email", "contains", "hamilton42424"),
    ("email", "endsWith", "0ff1ce.example.com"),
    ("lastName", "startsWith", "Turing 4242"),
    ("lastName", "contains", "per 31415"),
    ("firstName", "startsWith", "Marg"),
    ("lastName", "contains", "urin"),
    ("email", "contains", "ZZZ-none"),
)
Op = common_pb2.FilterOperator
_OPERATORS = {"contains": Op.FILTER_OPERATOR_CONTAINS, "startsWith": Op.FILTER_OPERATOR_STARTS_WITH,
              "endsWith": Op.FILTER_OPERATOR_ENDS_WITH}  # fmt: skip


class _Recorder:
    """The connection, remembering the last statement it ran (for EXPLAIN)."""

    def __init__(self, connection: asyncpg.Connection) -> None:
        self.connection = connection
        self.last: tuple[str, tuple[Any, ...]] = ("", ())

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        self.last = (sql, args)
        return list(await self.connection.fetch(sql, *args))


async def _fragments(writer: Writer, model: WorkspaceModel, repeat: int) -> dict[str, Any]:
    """p50 wall time and backend CPU per list call of each fragment filter (`repeat` calls), and
    the plan of its statement (EXPLAIN ANALYZE: which index, how many rows)."""
    ctx = RequestContext(writer.principal, model)
    recorder = _Recorder(writer.connection)
    found: dict[str, Any] = {}
    for name, operator, value in FRAGMENTS:
        request = records_pb2.ListRecordsRequest(
            first=50,
            filter=common_pb2.Filter(
                condition=common_pb2.Condition(
                    field=name, operator=_OPERATORS[operator], value_json=orjson.dumps(value)
                )
            ),
        )
        walls: list[float] = []
        cpu = writer.cpu()
        rows = 0
        for _ in range(repeat):
            started = time.perf_counter()
            page = await reads.list_records(recorder, ctx, writer.obj, writer.access, request)
            walls.append(time.perf_counter() - started)
            rows = len(orjson.loads(page.records_json))
        used_cpu = writer.cpu() - cpu
        sql, args = recorder.last
        plan = await writer.connection.fetch(f"EXPLAIN (ANALYZE, COSTS OFF) {sql}", *args)
        found[f"{name} {operator} {value!r}"] = {
            "p50_ms": round(statistics.median(walls) * 1000, 1),
            "cpu_ms": round(used_cpu * 1000 / repeat, 1),
            "rows": rows,
            "plan": [row[0] for row in plan],
        }
    return found


def _table(result: dict[str, Any]) -> str:
    base = result["variants"]["as planned"]["cpu_us_per_row"]
    lines = [f"{'variant':<22} {'CPU us/row':>10} {'vs planned':>10} {'wall ms/batch':>13}"]
    rows = list(result["variants"].items())
    if "large" in result:
        rows += [
            (f"{START_ROWS:,} rows, alternated", result["small"]),
            (f"{result['large_rows']:,} rows, alternated", result["large"]),
        ]
    for name, row in rows:
        lines.append(
            f"{name:<22} {row['cpu_us_per_row']:>10.1f} "
            f"{row['cpu_us_per_row'] - base:>+10.1f} {row['wall_ms_per_batch_p50']:>13.1f}"
        )
    if "large" in result:
        lines.append(f"large / small: x{result['large_over_small']}")
    for name, row in result.get("fragments", {}).items():
        lines.append(f"{name[:44]:<44} p50 {row['p50_ms']:>7.1f} ms  CPU {row['cpu_ms']:>6.1f} ms")
        lines += [f"    {line}" for line in row["plan"] if "Scan" in line or "Execution" in line]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batches", type=int, default=4, help="batches per variant per round")
    parser.add_argument("--rows", type=int, default=1_000_000, help="0: skip the large table")
    args = parser.parse_args()

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    data_dir = Path(tempfile.mkdtemp(prefix="crm-index-cost-"))
    stack = Stack(
        StackConfig(
            data_dir=data_dir,
            app_secret=secrets.token_urlsafe(48),
            extra_env=ENV,
            fast_postgres=True,
        )
    )
    stack.start()
    try:
        with httpx.Client(base_url=stack.base_url, timeout=60) as http:
            workspaces = []
            for _ in range(2):
                session = signup(http)
                response = http.post(
                    "/rest/batch/companies",
                    json=[{"name": f"Company {i}"} for i in range(200)],
                    headers=session.headers,
                )
                assert response.status_code == 201, response.text
                companies = [row["id"] for row in response.json()["data"]]
                workspaces.append(Workspace(session.workspace_id, session.user_id, companies))
        for service, instances in stack.instances.items():  # PostgreSQL alone from here
            for replica in range(len(instances)):
                stack.terminate(service, replica)
        small, large = workspaces
        measured = asyncio.run(measure(stack.env["DATABASE_URL"], small, large, args, say))
        measured["load"] = psutil.getloadavg()
        print(_table(measured), flush=True)
        print(orjson.dumps(measured).decode(), flush=True)
    finally:
        stack.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
