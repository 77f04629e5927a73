"""Which fields get which index (docs/data-model.md, "Indexes"), as an operator sees it: the
workspace's indexes in the PostgreSQL catalog, and each index's own scan counter
(`pg_stat_user_indexes.idx_scan`) moving when an API request that needs it runs.

A btree for the fields marked `isIndexed` (text on its first 256 characters), the label field and
many-to-one relations; none for the rest, whose sorts and filters still work by scanning.
`contains`, `startsWith` and `endsWith` on a searchable field are served by the object's search
column GIN and match exactly what the condition alone matches.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import httpx
import pytest

from crmstack.stack import Stack
from records.predicates import FOLD_CASE_EXCEPTIONS
from tests.integration.api_helpers import Api

ROWS = 3_000


def _email(i: int) -> str:
    """Varied addresses: a fragment's trigrams pick few rows, as in real data."""
    local = hashlib.md5(str(i).encode(), usedforsecurity=False).hexdigest()[:10]
    return f"{local}@{hashlib.md5(f'd{i}'.encode(), usedforsecurity=False).hexdigest()[:6]}.test"


def _schema(api: Api) -> str:
    return "ws_" + api.session.workspace_id.replace("-", "")


@pytest.fixture(scope="module")
def dsn(stack: Stack | None) -> str:
    if stack is None:
        pytest.skip("reads Postgres' catalog and statistics: needs the local launcher")
    return stack.env["DATABASE_URL"]


@pytest.fixture(scope="module")
def seeded(client: httpx.Client, dsn: str) -> tuple[Api, str]:
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
    schema = _schema(api)
    # As autovacuum would, sooner: statistics, and the GIN pending list merged into the index.
    asyncio.run(_execute(dsn, f'VACUUM ANALYZE "{schema}".person'))
    return api, schema


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


def _search_gin(definitions: list[str]) -> str:
    (found,) = [d.split(" USING ", 1)[1] for d in definitions if "gin_trgm_ops" in d]
    assert found.startswith("gin (_search_"), found
    return found


def _indexed_flags(api: Api, object_name: str) -> dict[str, bool]:
    data = api.data(
        "query($id: UUID!) { fields(filter: {objectMetadataId: {eq: $id}}) "
        "{ edges { node { name isIndexed } } } }",
        {"id": api.object_id(object_name)},
        path="/metadata",
    )
    return {e["node"]["name"]: e["node"]["isIndexed"] for e in data["fields"]["edges"]}


def test_each_field_gets_the_indexes_its_flag_asks_for(seeded: tuple[Api, str], dsn: str) -> None:
    api, schema = seeded
    person = _definitions(dsn, schema, "person")
    for column in ("firstName", "lastName", "email"):
        assert _on(person, column) == [_keyed(column)], column
    for column in ("jobTitle", "phone", "city", "linkedinLink"):
        assert _on(person, column) == [], column
    assert _on(person, "companyId") == ['btree ("companyId", id)']
    assert not any("USING hash" in definition for definition in person), person
    # One GIN on the person table: its search column's, no per-field trigram index, with a
    # small pending list (every search reads the whole list: data-model.md, Search).
    assert "WITH (gin_pending_list_limit='1024')" in _search_gin(person)
    assert sum(" USING gin " in definition for definition in person) == 1, person
    company = _definitions(dsn, schema, "company")
    assert _on(company, "name") == [_keyed("name")]
    assert _on(company, "website") == [_keyed("website")]
    for column in ("idealCustomerProfile", "employees", "address", "industry"):
        assert _on(company, column) == [], column
    opportunity = _definitions(dsn, schema, "opportunity")
    for column in ("amount", "stage", "closeDate"):
        assert _on(opportunity, column) == [f"btree ({_ident(column)}, id)"], column
    assert _on(opportunity, "probability") == []
    # What the metadata API says is what the catalog has (the defaults of data-model.md).
    flags = _indexed_flags(api, "person")
    assert {name for name, on in flags.items() if on} == {
        "id", "ownerId", "createdAt", "updatedAt", "firstName", "lastName", "email", "company"
    }  # fmt: skip


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
    seeded: tuple[Api, str], dsn: str
) -> None:
    api, schema = seeded
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

    search = _search_gin(_definitions(dsn, schema, "person"))
    fragment_text = _email(1234)[3:9].upper()  # contains ignores case
    wanted = sorted(_email(i) for i in range(ROWS) if fragment_text.lower() in _email(i))

    def fragment() -> None:
        found = api.ok("GET", "/rest/people", params={"filter[email][contains]": fragment_text})
        assert sorted(row["email"] for row in found["data"]) == wanted

    _served_by(dsn, schema, search, fragment)

    def prefix() -> None:
        found = api.ok("GET", "/rest/people", params={"filter[firstName][startsWith]": "first0299"})
        assert len(found["data"]) == 10

    _served_by(dsn, schema, search, prefix)

    ending = _email(77)[-9:]  # the domain's last 4 characters and ".test"
    ends = sorted(_email(i) for i in range(ROWS) if _email(i).endswith(ending))

    def suffix() -> None:
        found = api.ok("GET", "/rest/people", params={"filter[email][endsWith]": ending})
        assert sorted(row["email"] for row in found["data"]) == ends

    _served_by(dsn, schema, search, suffix)


def test_unindexed_fields_still_sort_page_and_filter(seeded: tuple[Api, str]) -> None:
    api, _ = seeded
    wanted = sorted((f"title{i % 13}", i) for i in range(ROWS))[:7]
    page = api.ok("GET", "/rest/people", params={"orderBy[jobTitle]": "ASC", "limit": "4"})
    after = page["pageInfo"]["endCursor"]
    rest = api.ok(
        "GET", "/rest/people", params={"orderBy[jobTitle]": "ASC", "limit": "3", "after": after}
    )
    titles = [row["jobTitle"] for row in page["data"] + rest["data"]]
    assert titles == [title for title, _ in wanted]
    found = api.data('{ people(filter: {jobTitle: {eq: "title12"}}) { totalCount } }')
    assert found["people"]["totalCount"] == len([i for i in range(ROWS) if i % 13 == 12])


# -- the flag --------------------------------------------------------------------------------------
UPDATE_FIELD = (
    "mutation($id: UUID!, $on: Boolean) { updateField(input: {id: $id, isIndexed: $on}) "
    "{ name isIndexed } }"
)


def _field_id(api: Api, object_name: str, name: str) -> str:
    data = api.data(
        "query($id: UUID!) { fields(filter: {objectMetadataId: {eq: $id}}) "
        "{ edges { node { id name } } } }",
        {"id": api.object_id(object_name)},
        path="/metadata",
    )
    found: str = next(e["node"]["id"] for e in data["fields"]["edges"] if e["node"]["name"] == name)
    return found


def test_the_flag_adds_and_drops_the_index(client: httpx.Client, dsn: str) -> None:
    api = Api.signup(client)
    schema = _schema(api)
    api.create("people", {"firstName": "Ada", "jobTitle": "Engineer"})
    api.create("people", {"firstName": "Grace", "jobTitle": "Admiral"})
    job_title = _field_id(api, "person", "jobTitle")
    assert _on(_definitions(dsn, schema, "person"), "jobTitle") == []

    changed = api.data(UPDATE_FIELD, {"id": job_title, "on": True}, path="/metadata")
    assert changed["updateField"] == {"name": "jobTitle", "isIndexed": True}
    assert _on(_definitions(dsn, schema, "person"), "jobTitle") == [_keyed("jobTitle")]
    ordered = api.ok("GET", "/rest/people", params={"orderBy[jobTitle]": "ASC"})["data"]
    assert [row["jobTitle"] for row in ordered] == ["Admiral", "Engineer"]

    changed = api.data(UPDATE_FIELD, {"id": job_title, "on": False}, path="/metadata")
    assert changed["updateField"] == {"name": "jobTitle", "isIndexed": False}
    assert _on(_definitions(dsn, schema, "person"), "jobTitle") == []
    ordered = api.ok("GET", "/rest/people", params={"orderBy[jobTitle]": "DESC"})["data"]
    assert [row["jobTitle"] for row in ordered] == ["Engineer", "Admiral"]

    # A new custom field: not indexed unless asked, or unique, or a many-to-one relation.
    person = api.object_id("person")
    created = {
        name: api.data(
            "mutation($input: CreateFieldInput!) { createField(input: $input) { name isIndexed } }",
            {"input": {"objectMetadataId": person, "name": name, "type": kind, **extra}},
            path="/metadata",
        )["createField"]["isIndexed"]
        for name, kind, extra in (
            ("score", "NUMBER", {}),
            ("rank", "NUMBER", {"isIndexed": True}),
            ("badge", "TEXT", {"isUnique": True}),
        )
    }
    assert created == {"score": False, "rank": True, "badge": True}
    person_indexes = _definitions(dsn, schema, "person")
    assert _on(person_indexes, "score") == []
    assert _on(person_indexes, "rank") == ["btree (rank, id)"]
    assert _keyed("badge") in _on(person_indexes, "badge")

    # What cannot be: a clear BAD_USER_INPUT naming the flag, nothing changed.
    for object_name, name, on in (
        ("person", "company", False),  # a many-to-one relation: its foreign key
        ("person", "firstName", False),  # the label field
        ("company", "idealCustomerProfile", True),  # a boolean
    ):
        error = api.error(
            UPDATE_FIELD, {"id": _field_id(api, object_name, name), "on": on}, path="/metadata"
        )
        assert error["extensions"]["code"] == "BAD_USER_INPUT", error
        assert error["extensions"]["field"] == "isIndexed", error
    assert _on(_definitions(dsn, schema, "person"), "companyId") == ['btree ("companyId", id)']

    # A new label field is indexed from then on.
    api.data(
        'mutation($id: UUID!) { updateObject(input: {id: $id, labelIdentifierField: "city"}) '
        "{ id } }",
        {"id": person},
        path="/metadata",
    )
    assert _indexed_flags(api, "person")["city"] is True
    assert _on(_definitions(dsn, schema, "person"), "city") == [_keyed("city")]


# -- fragments prefiltered by the search column: exactly the rows of the condition alone ----------
TRICKY = [
    "Élodie", "ÉLODIE", "elodie", "Elodie", "José Ñúñez", "JOSE NUNEZ", "Straße", "STRASSE",
    "50% off", "50_off", "50x off", "500 off", "back\\slash", "back\\\\slash", "backslash",
    "100\uff05 sure", "100% sure", "x\uff3cyz", "x\\yz", "a\uff3fbc", "a_bc", "aXbc",
    "ǅemal", "Ǆemal", "İstanbul", "istanbul", "ΟΔΟΣ", "οδος", "ﬁnance", "finance",
    "p" * 300 + "needle-A", "p" * 300 + "needle-B", "p" * 255 + "Q" + "needle-C",
    "x\u0280yz", "x\u01a6yz", "a\u03f2bc", "a\u03f9bc", "a\u03c3bc",
]  # fmt: skip
FRAGMENTS = [
    "élo", "ELO", "lodie", "jose", "ñúñ", "NUÑ", "strasse", "straß", "50%", "0% o", "50_", "0_o",
    "k\\s", "k\\\\s", "\\sl", "0\uff05 s", "0% s", "x\uff3cy", "x\\y", "\uff3fbc", "_bc",
    "emal", "ǆem", "İst", "ist", "ΟΔΟ", "οδο", "δος", "ﬁn", "fin", "p" * 280 + "needle-A",
    "p" * 260, "needle", "needle-B", "p" * 256 + "needle", "Qneedle", "ab", "%", "_", "\\",
    "x\u01a6y", "x\u0280y", "a\u03f9b", "a\u03f2b", "a\u03a3b",
]  # fmt: skip


def _like(text: str, prefix: bool, suffix: bool) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return ("%" if prefix else "") + escaped + ("%" if suffix else "")


def test_fragment_filters_match_exactly_what_the_condition_alone_matches(
    client: httpx.Client, dsn: str
) -> None:
    api = Api.signup(client)
    schema = _schema(api)
    ids = {}
    for i in range(0, len(TRICKY), 10):
        chunk = TRICKY[i : i + 10]
        rows = [{"firstName": value, "lastName": value[::-1]} for value in chunk]
        created = api.ok("POST", "/rest/batch/people", 201, json=rows)["data"]
        ids.update({row["id"]: row["firstName"] for row in created})
    api.create("people", {"lastName": "no first name"})
    operators = {
        "contains": ("ILIKE", True, True),
        "startsWith": ("LIKE", False, True),
        "endsWith": ("LIKE", True, False),
    }
    for fragment in FRAGMENTS:
        for operator, (sql_operator, prefix, suffix) in operators.items():
            reference = asyncio.run(
                _execute(
                    dsn,
                    f'SELECT id::text FROM "{schema}".person WHERE "deletedAt" IS NULL '
                    f'AND "firstName" {sql_operator} $1',
                    _like(fragment, prefix, suffix),
                )
            )
            found = api.data(
                "query($f: PersonFilter) { people(filter: $f, first: 100) "
                "{ edges { node { id } } } }",
                {"f": {"firstName": {operator: fragment}}},
            )["people"]["edges"]
            assert sorted(e["node"]["id"] for e in found) == sorted(r[0] for r in reference), (
                operator,
                fragment,
                [ids[e["node"]["id"]] for e in found],
            )
            if operator == "contains" and fragment.isascii() and fragment.isalpha():
                assert {ids[e["node"]["id"]] for e in found if ids[e["node"]["id"]].isascii()} == {
                    value
                    for value in TRICKY
                    if value.isascii() and fragment.lower() in value.lower()
                }, fragment


def test_folding_after_lower_is_folding_but_for_the_known_exceptions(dsn: str) -> None:
    """What makes the prefilter of `contains` (ILIKE: lower(field) holds lower(value)) a necessary
    condition: for every character, folding its lower case gives what folding it gives, and lower
    keeps it one character; the characters for which the database's unaccent rules disagree are
    the service's known exceptions (no prefilter for values holding them)."""
    rows = asyncio.run(
        _execute(
            dsn,
            "SELECT chr(n), lower(chr(n)) FROM generate_series(1, 196607) n "
            "WHERE n NOT BETWEEN 55296 AND 57343 "
            "AND (records.search_fold(lower(chr(n))) IS DISTINCT FROM records.search_fold(chr(n)) "
            "OR length(lower(chr(n))) <> 1)",
        )
    )
    apart = {character for row in rows for character in row}
    assert apart <= FOLD_CASE_EXCEPTIONS, sorted(hex(ord(c)) for c in apart - FOLD_CASE_EXCEPTIONS)


# -- the search column: a plain column kept by a trigger ------------------------------------------
async def _search_shape(dsn: str, schema: str) -> tuple[str, bool, list[str]]:
    """The person table's search column, whether it is generated, and its search triggers."""
    table = f'"{schema}".person'
    connection = await asyncpg.connect(dsn)
    try:
        column = await connection.fetchrow(
            "SELECT attname, attgenerated <> '' FROM pg_attribute WHERE attrelid = $1::regclass "
            "AND attname LIKE '\\_search\\_%' AND NOT attisdropped",
            table,
        )
        triggers = await connection.fetch(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal",
            table,
        )
    finally:
        await connection.close()
    assert column is not None
    return column[0], column[1], sorted(row[0] for row in triggers)


async def _as_earlier_versions_planned(dsn: str, schema: str) -> None:
    """The search column as versions before the trigger planned it: GENERATED ... STORED (the
    expression read off the trigger's function), no trigger, and the GIN dropped with it."""
    column, _, triggers = await _search_shape(dsn, schema)
    function = triggers[0].removesuffix("_ins").removesuffix("_upd")
    table = f'"{schema}".person'
    connection = await asyncpg.connect(dsn)
    try:
        body = await connection.fetchval(
            "SELECT prosrc FROM pg_proc WHERE proname = $1 AND pronamespace = $2::regnamespace",
            function,
            schema,
        )
        expression = body.split(":=", 1)[1].split("; RETURN", 1)[0].replace("NEW.", "")
        for trigger in triggers:
            await connection.execute(f'DROP TRIGGER "{trigger}" ON {table}')
        await connection.execute(f'DROP FUNCTION "{schema}"."{function}"()')
        await connection.execute(f'ALTER TABLE {table} DROP COLUMN "{column}"')
        await connection.execute(
            f'ALTER TABLE {table} ADD COLUMN "{column}" text '
            f"GENERATED ALWAYS AS ({expression}) STORED"
        )
    finally:
        await connection.close()


def test_a_generated_search_column_becomes_one_the_writes_fill(
    client: httpx.Client, local_stack: Stack
) -> None:
    api = Api.signup(client)
    dsn, schema = local_stack.env["DATABASE_URL"], _schema(api)
    column, generated, triggers = asyncio.run(_search_shape(dsn, schema))
    assert not generated
    assert len(triggers) == 2, triggers
    assert [name[:4] + name[-4:] for name in triggers] == ["sxt__ins", "sxt__upd"], triggers
    before = api.create("people", {"firstName": "Émilie", "lastName": "Zola"})

    asyncio.run(_as_earlier_versions_planned(dsn, schema))
    assert asyncio.run(_search_shape(dsn, schema)) == (column, True, [])
    subprocess.run(
        [sys.executable, "-m", "records", "migrate"], env=local_stack.env, check=True, timeout=120
    )
    # Converted in place (its values kept), kept by the trigger, its GIN built again.
    assert asyncio.run(_search_shape(dsn, schema)) == (column, False, triggers)
    assert "gin_trgm_ops" in _search_gin(_definitions(dsn, schema, "person"))
    found = api.ok("GET", "/rest/search", params={"q": "emilie zola"})["data"]
    assert [hit["record"]["id"] for hit in found] == [before["id"]]
    api.ok("PATCH", f"/rest/people/{before['id']}", json={"lastName": "Zoé"})
    found = api.ok("GET", "/rest/search", params={"q": "emilie zoe"})["data"]
    assert [hit["record"]["id"] for hit in found] == [before["id"]]
    # Planned again, nothing changes.
    subprocess.run(
        [sys.executable, "-m", "records", "migrate"], env=local_stack.env, check=True, timeout=120
    )
    assert asyncio.run(_search_shape(dsn, schema)) == (column, False, triggers)


def test_an_insert_that_does_not_set_the_search_column_gets_it_from_the_trigger(
    client: httpx.Client, dsn: str
) -> None:
    """The API's inserts compute the column in their own statement; any other insert (here one
    in SQL, as an operator's repair script might) gets it from the insert trigger."""
    api = Api.signup(client)
    schema = _schema(api)
    rows = asyncio.run(
        _execute(
            dsn,
            f'INSERT INTO "{schema}".person (id, "firstName", "lastName") '
            "VALUES (gen_random_uuid(), 'Zébulon', 'Ærøskøbing') RETURNING id::text",
        )
    )
    found = api.ok("GET", "/rest/search", params={"q": "zebulon"})["data"]
    assert [hit["record"]["id"] for hit in found] == [rows[0][0]]
    made = api.create("people", {"firstName": "Zébulon", "lastName": "Other"})
    found = api.ok("GET", "/rest/search", params={"q": "zebulon other"})["data"]
    assert [hit["record"]["id"] for hit in found] == [made["id"]]
