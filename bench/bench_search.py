"""Search across objects (issue 22.3): GET /rest/search at c=1 over 100,000 records spread over
four objects, and what the search index costs a batch insert.

Its own workspace: 40% people, 20% companies, 20% opportunities and 20% records of a custom
object `ticket` (searchable TEXT `subject` and EMAIL `requester`), names built from syllables
so that words are as varied as real ones. Queries are drawn from the seeded values: a word's
prefix, a whole name, two words, an email fragment, a word with one letter changed (typo), a
word with its accents; each must find at least one record (checked before timing).

Write cost: the same batches of 1,000 into two custom objects of the same shape, one searchable
and one with every field's `isSearchable` off (no search index), alternated so machine load
hits both alike; the row gives the rate of each.

    BENCH_SEARCH_RECORDS=20000 .venv/bin/python bench/run.py --only search   # reduced
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import aiohttp
import asyncpg
import orjson

from bench.benchlib import (
    BenchContext,
    Result,
    Samples,
    compare,
    drive,
    graphql_data,
    percentile,
)
from bench.seed import _Writer, analyze, signup
from crm.common.v1 import common_pb2
from crm.metadata.v1 import metadata_pb2
from crm.records.v1 import records_pb2
from records import search, search_ddl
from records.context import RequestContext
from records.model import WorkspaceModel
from records.sql import workspace_schema_name

FULL_RECORDS = 100_000
SMOKE_RECORDS = 2_000
BATCH = 1000
P50_BUDGET_MS = 20.0
P99_BUDGET_MS = 60.0
SYLLABLES = ("ka", "lo", "mi", "ren", "tor", "va", "san", "el", "bri", "dus", "an", "gor",
             "ne", "pel", "qui", "ros", "tal", "umb", "vik", "zé", "ja", "mor", "lin", "ost",
             "fa", "hé", "ber", "cil", "dor", "ix")  # fmt: skip
FIRST = ("Ada", "Alan", "Grace", "Linus", "Barbara", "Ken", "Margaret", "Dennis", "Frances",
         "John", "Radia", "Tim", "Edsger", "Donald", "Leslie", "Niklaus", "Hedy", "Claude",
         "Sophie", "Guido", "Zoé", "Renée", "Søren", "Anaïs", "José", "Björn")  # fmt: skip


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))).capitalize()


def _rows(rng: random.Random, plural: str, count: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i in range(count):
        if plural == "people":
            first, last = rng.choice(FIRST), _word(rng)
            rows.append(
                {
                    "firstName": first,
                    "lastName": last,
                    "email": f"{first.lower()}.{last.lower()}{i}@{_word(rng).lower()}.example",
                    "phone": f"+44 20 {rng.randint(1000, 9999)} {rng.randint(1000, 9999)}",
                }
            )
        elif plural == "companies":
            name = f"{_word(rng)} {rng.choice(('Labs', 'Systems', 'Partners', 'Group'))}"
            rows.append({"name": name, "website": f"https://{name.split()[0].lower()}{i}.example"})
        elif plural == "opportunities":
            rows.append({"name": f"{_word(rng)} renewal {i}"})
        else:
            rows.append(
                {
                    "name": f"Ticket {i}",
                    "subject": f"{_word(rng)} {_word(rng)} not working",
                    "requester": f"{_word(rng).lower()}@{_word(rng).lower()}.example",
                }
            )
    return rows


def _typo(word: str, rng: random.Random) -> str:
    at = rng.randrange(1, len(word) - 1)
    letter = "x" if word[at] != "x" else "y"
    return word[:at] + letter + word[at + 1 :]


def _queries(rng: random.Random, seeded: dict[str, list[dict[str, Any]]], n: int) -> list[str]:
    people, companies, tickets = seeded["people"], seeded["companies"], seeded["tickets"]
    queries: list[str] = []
    while len(queries) < n:
        person = rng.choice(people)
        last = person["lastName"]
        kind = len(queries) % 6
        if kind == 0:
            queries.append(last[: max(3, len(last) // 2 + 1)].lower())  # a prefix
        elif kind == 1:
            queries.append(f"{person['firstName']} {last}")
        elif kind == 2:
            queries.append(rng.choice(companies)["name"].split()[0])
        elif kind == 3:
            queries.append(person["email"].split("@")[0][:8])
        elif kind == 4 and len(last) >= 6:
            queries.append(_typo(last.lower(), rng))
        elif kind == 5:
            queries.append(rng.choice(tickets)["subject"].split()[0].upper())
    return queries


async def _custom_object(
    http: aiohttp.ClientSession,
    base_url: str,
    headers: dict[str, str],
    singular: str,
    plural: str,
) -> list[str]:
    """A custom object with TEXT subject and EMAIL requester; answers its field ids."""

    async def metadata(query: str, variables: dict[str, Any]) -> dict[str, Any]:
        return await graphql_data(http, base_url + "/metadata", headers, query, variables)

    created = await metadata(
        "mutation($i: CreateObjectInput!) { createObject(input: $i) { id fields { edges { node "
        "{ id name } } } } }",
        {"i": {"nameSingular": singular, "namePlural": plural}},
    )
    object_id = created["createObject"]["id"]
    ids = [
        edge["node"]["id"]
        for edge in created["createObject"]["fields"]["edges"]
        if edge["node"]["name"] == "name"
    ]
    for name, kind in (("subject", "TEXT"), ("requester", "EMAIL")):
        field = await metadata(
            "mutation($i: CreateFieldInput!) { createField(input: $i) { id } }",
            {"i": {"objectMetadataId": object_id, "name": name, "type": kind}},
        )
        ids.append(field["createField"]["id"])
    return ids


async def _unsearchable(
    http: aiohttp.ClientSession, base_url: str, headers: dict[str, str], field_ids: list[str]
) -> None:
    for field_id in field_ids:
        async with http.post(
            base_url + "/metadata",
            json={
                "query": "mutation($id: UUID!) { updateField(input: "
                "{id: $id, isSearchable: false}) { isSearchable } }",
                "variables": {"id": field_id},
            },
            headers=headers,
        ) as response:
            body = orjson.loads(await response.read())
            if body.get("errors") or body["data"]["updateField"]["isSearchable"]:
                raise RuntimeError(f"could not turn search off: {body}")


async def _write_cost(writer: _Writer, rng: random.Random, batches: int) -> tuple[Result, Result]:
    """Alternating batches into the searchable and the unsearchable object."""
    timings: dict[str, list[float]] = {"tickets": [], "plaintickets": []}
    for index in range(batches * 2):
        plural = "tickets" if index % 2 == 0 else "plaintickets"
        batch = _rows(rng, "tickets", BATCH)
        started = time.perf_counter()
        await writer.post(plural, batch)
        timings[plural].append((time.perf_counter() - started) * 1000)
    results: list[Result] = []
    for plural, label in (("tickets", "with"), ("plaintickets", "without")):
        samples = sorted(timings[plural])
        seconds = sum(samples) / 1000
        results.append(
            Result(
                operation=f"search: REST batch {BATCH} {label} search index",
                concurrency=1,
                requests=len(samples),
                seconds=seconds,
                p50_ms=percentile(samples, 50),
                p99_ms=percentile(samples, 99),
                notes=f"{len(samples) * BATCH / seconds:,.0f} records/s (3 text fields)",
            )
        )
    with_index, without = results
    ratio = without.requests_per_second / with_index.requests_per_second
    with_index.notes += f"; {ratio:.2f}x the time of the same batch without the index"
    return with_index, without


async def _floor(
    ctx: BenchContext, workspace_id: str, queries: list[str], requests: int
) -> Samples:
    """The same statements run by asyncpg directly (what records sends, without any hop), on a
    session like those of records' search pool (its settings, statements cached up to 64 KB)."""
    assert ctx.database_url
    connection = await asyncpg.connect(
        ctx.database_url,
        server_settings=search.SESSION_SETTINGS,
        max_cacheable_statement_size=64 * 1024,
    )
    try:
        raw = await connection.fetchval(
            "SELECT schema_proto FROM records.workspace_schemas WHERE workspace_id = $1",
            workspace_id,
        )
        model = WorkspaceModel.from_proto(metadata_pb2.WorkspaceSchema.FromString(raw))
        principal = common_pb2.Principal(
            workspace_id=workspace_id,
            permissions=[common_pb2.ObjectPermission(object="*", actions=[common_pb2.ACTION_READ])],
        )
        trigram = await search_ddl.trigram_schema(connection)
        context = RequestContext(principal, model)

        async def one(index: int) -> None:
            request = records_pb2.SearchRequest(query=queries[index % len(queries)], first=20)
            await search.find(connection, context, trigram, request)

        return await drive(one, concurrency=1, requests=requests, max_seconds=120, warmup=5)
    finally:
        await connection.close()


async def run(ctx: BenchContext) -> list[Result]:
    size = os.environ.get("BENCH_SEARCH_RECORDS", str(FULL_RECORDS))
    total = SMOKE_RECORDS if ctx.smoke else int(size)
    rng = random.Random(22)  # data shapes, not secrets
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        account = await signup(http, ctx.base_url, "Search benchmark")
        headers = {"Authorization": f"Bearer {account['accessToken']}"}
        writer = _Writer(http, ctx.base_url, headers)
        await _custom_object(http, ctx.base_url, headers, "ticket", "tickets")
        plain = await _custom_object(http, ctx.base_url, headers, "plainticket", "plaintickets")
        await _unsearchable(http, ctx.base_url, headers, plain)
        shares = {"people": 0.4, "companies": 0.2, "opportunities": 0.2, "tickets": 0.2}
        seeded: dict[str, list[dict[str, Any]]] = {}
        for plural, share in shares.items():
            rows = _rows(rng, plural, int(total * share))
            seeded[plural] = rows
            await writer.write(plural, [rows[i : i + BATCH] for i in range(0, len(rows), BATCH)])
        cost = await _write_cost(writer, rng, 3 if ctx.smoke else 10)

        queries = _queries(rng, seeded, 60 if ctx.smoke else 600)
        for query in queries[:12]:  # shape and recall check before timing
            async with http.get(
                ctx.base_url + "/rest/search", params={"q": query}, headers=headers
            ) as response:
                body = orjson.loads(await response.read())
                if response.status != 200 or not body["data"]:
                    raise RuntimeError(f"search {query!r} found nothing: {body}")

        async def one(index: int) -> None:
            query = queries[index % len(queries)]
            async with http.get(
                ctx.base_url + "/rest/search", params={"q": query, "limit": 20}, headers=headers
            ) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"search failed ({response.status})")

        async def listed(index: int) -> None:
            async with http.get(
                ctx.base_url + "/rest/people", params={"limit": 20}, headers=headers
            ) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"list failed ({response.status})")

        requests = 40 if ctx.smoke else 600
        workspace_id = account["workspace"]["id"]
        if ctx.database_url:
            await analyze(ctx.database_url, workspace_schema_name(workspace_id))
        floor = await _floor(ctx, workspace_id, queries, requests) if ctx.database_url else None
        async with ctx.profile("search"):
            samples = await drive(
                one, concurrency=1, requests=requests, max_seconds=10 if ctx.smoke else 120,
                warmup=5,
            )  # fmt: skip
        reference = await drive(listed, concurrency=1, requests=requests // 2, max_seconds=60)
    notes = (
        "prefix, full name, company word, email fragment, typo, upper case; limit 20; floor: "
        "the same statements over asyncpg; for scale, GET /rest/people?limit=20 at c=1 in the "
        f"same run: p50 {reference.p(50):.1f} ms, p99 {reference.p(99):.1f} ms"
    )
    row = compare(
        f"search: REST /rest/search over {total:,} records, 4 objects",
        1,
        samples,
        floor,
        budget=f"p50 <= {P50_BUDGET_MS:.0f} ms, p99 <= {P99_BUDGET_MS:.0f} ms",
        check=lambda r: r.p50_ms <= P50_BUDGET_MS and r.p99_ms <= P99_BUDGET_MS,
        notes=notes,
    )
    return [row, *cost]


if __name__ == "__main__":
    from bench.benchlib import main_on_own_stack

    main_on_own_stack(run, "search across objects", "search")
