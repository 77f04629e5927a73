"""Exports (issue 21.4): GET /rest/{object}/export as CSV and NDJSON holds exactly what the list
holds for the same filter, streams from one snapshot in constant memory, follows the list's access
rules, refuses bad input before streaming; GraphQL export jobs download with a file token."""

from __future__ import annotations

import csv
import io
import time
from contextlib import ExitStack
from typing import Any

import httpx
import orjson
import pytest

from crmkit.tokens import TokenType, encode_jwt
from crmstack.client import Session, graphql_data, login, unique_email
from crmstack.stack import Stack
from tests.integration.api_helpers import Api, Record

ADD = "mutation($input: AddWorkspaceMemberInput!) { addWorkspaceMember(input: $input) { id } }"
CREATE_ROLE = "mutation($input: CreateRoleInput!) { createRole(input: $input) { id } }"
PASSWORD = "member password"
CREATE_EXPORT = """
mutation($object: String!, $format: ExportFormat!, $filter: JSON, $fields: [String!],
         $relationField: String) {
  createExport(object: $object, format: $format, filter: $filter, fields: $fields,
               relationField: $relationField) {
    id object format state downloadUrl fileToken fileTokenExpiresIn
  }
}"""
BIG_ROWS = 20_000
FILLER = "x" * 4000  # ~4 KB a row: the export (~80 MB) dwarfs any process's allowed growth


def _member(client: httpx.Client, admin: Session, role_id: str | None = None) -> Api:
    email = unique_email("member")
    member: dict[str, Any] = {
        "email": email,
        "password": PASSWORD,
        "firstName": "Mem",
        "lastName": "Ber",
    }
    if role_id:
        member["roleId"] = role_id
    graphql_data(client, admin.access_token, ADD, {"input": member})
    return Api(client, login(client, email, PASSWORD, admin.workspace_id))


def _export(api: Api, plural: str, params: dict[str, str] | str, **headers: str) -> httpx.Response:
    return api.http.get(f"/rest/{plural}/export", params=params, headers={**api.headers, **headers})


def _ndjson(body: bytes) -> list[Record]:
    assert body.endswith(b"\n") or not body
    return [orjson.loads(line) for line in body.splitlines()]


def _csv(body: bytes) -> list[dict[str, str]]:
    text = body.decode("utf-8")
    assert "\r\n" in text  # RFC 4180 line breaks
    return list(csv.DictReader(io.StringIO(text, newline="")))


def _listed(api: Api, plural: str, params: dict[str, str]) -> list[Record]:
    """Every record of the list for `params`, page by page."""
    found: list[Record] = []
    after = None
    while True:
        page = api.ok(
            "GET",
            f"/rest/{plural}",
            params={**params, "limit": "200", **({"after": after} if after else {})},
        )
        found += page["data"]
        if not page["pageInfo"]["hasNextPage"]:
            return found
        after = page["pageInfo"]["endCursor"]


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def _as_csv_row(record: Record) -> dict[str, str]:
    row: dict[str, str] = {}
    for key, value in record.items():
        if isinstance(value, dict):  # composite (currency): one column per part
            for part, inner in value.items():
                row[f"{key}.{part}"] = _cell(inner)
        else:
            row[key] = _cell(value)
    return row


@pytest.fixture
def admin(client: httpx.Client) -> Api:
    return Api.signup(client)


def _seed_small(api: Api) -> tuple[list[Record], list[Record]]:
    companies = [
        api.create(
            "companies",
            {
                "name": f'Co {i}, "quoted"\nline' if i == 0 else f"Co {i}",
                "employees": i * 10 + 0.5,
                "idealCustomerProfile": i % 2 == 0,
                "annualRecurringRevenue": {"amountMicros": i * 1_000_000, "currencyCode": "EUR"},
            },
        )
        for i in range(3)
    ]
    people = [
        api.create(
            "people",
            {
                "firstName": f"Pé{i}",
                "lastName": "Smith" if i % 3 else "Jones",
                "city": None if i % 4 == 0 else "Zürich",
                "company": {"connect": companies[i % 3]["id"]},
            },
        )
        for i in range(12)
    ]
    return companies, people


def test_csv_and_ndjson_exports_hold_what_the_list_holds(admin: Api) -> None:
    _seed_small(admin)
    for params in (
        {"filter[lastName][eq]": "Smith"},
        {"filter": '{"or": [{"city": {"is": "NULL"}}, {"firstName": {"eq": "Pé1"}}]}'},
        {"fields": "firstName,company", "orderBy[firstName]": "DESC"},
        {},
    ):
        expected = _listed(admin, "people", params)
        assert expected
        ndjson = _export(admin, "people", {**params, "format": "ndjson"})
        assert ndjson.status_code == 200, ndjson.text
        assert ndjson.headers["content-type"] == "application/x-ndjson"
        assert 'filename="people.ndjson"' in ndjson.headers["content-disposition"]
        assert _ndjson(ndjson.content) == expected, params
        exported = _export(admin, "people", {**params, "format": "csv"})
        assert exported.status_code == 200, exported.text
        assert exported.headers["content-type"] == "text/csv; charset=utf-8"
        rows = _csv(exported.content)
        assert rows == [_as_csv_row(record) for record in expected], params
        assert list(rows[0]) == list(_as_csv_row(expected[0]))  # header: the record's keys
    # Composite parts, numbers, booleans, quotes and line breaks survive the round trip.
    companies = _listed(admin, "companies", {})
    rows = _csv(_export(admin, "companies", {"format": "csv"}).content)
    assert rows == [_as_csv_row(record) for record in companies]
    assert rows[0]["name"] == 'Co 0, "quoted"\nline'
    assert rows[1]["annualRecurringRevenue.currencyCode"] == "EUR"
    assert rows[1]["employees"] == "10.5"
    assert rows[1]["idealCustomerProfile"] == "false"


def test_an_empty_export_is_a_header_or_nothing(admin: Api) -> None:
    params = {"filter[firstName][eq]": "nobody"}
    assert _export(admin, "people", {**params, "format": "ndjson"}).content == b""
    rows = _export(admin, "people", {**params, "format": "csv", "fields": "firstName,city"})
    assert rows.content == b"id,firstName,city\r\n"


def test_relation_field_exports_the_related_record_s_field(admin: Api) -> None:
    companies, people = _seed_small(admin)
    names = {company["id"]: company["name"] for company in companies}
    lines = _ndjson(_export(admin, "people", {"format": "ndjson", "relationField": "name"}).content)
    assert len(lines) == len(people)
    for line in lines:
        assert line["company"] == {"id": line["companyId"], "name": names[line["companyId"]]}
    rows = _csv(
        _export(
            admin, "people", {"format": "csv", "relationField": "name", "fields": "company"}
        ).content
    )
    assert list(rows[0]) == ["id", "companyId", "company.name"]
    assert all(row["company.name"] == names[row["companyId"]] for row in rows)
    body = admin.bad(
        "GET", "/rest/people/export", params={"format": "csv", "relationField": "nope"}
    )
    assert body["details"]["field"] == "relationField"


def test_export_follows_the_list_s_access_rules(client: httpx.Client, admin: Api) -> None:
    admin.create("people", {"firstName": "Admin's"})
    member = _member(client, admin.session)
    own = member.create("people", {"firstName": "Member's"})
    lines = _ndjson(_export(member, "people", {"format": "ndjson"}).content)
    assert [line["id"] for line in lines] == [own["id"]]
    assert lines == _listed(member, "people", {})
    role = graphql_data(
        client,
        admin.session.access_token,
        CREATE_ROLE,
        {
            "input": {
                "name": f"people only {unique_email()}",
                "permissions": [{"object": "person", "actions": ["READ"]}],
            }
        },
    )["createRole"]["id"]
    people_only = _member(client, admin.session, role)
    body = people_only.bad("GET", "/rest/companies/export", 403, params={"format": "csv"})
    assert "READ on company" in body["message"]
    # A related object the caller may not read is not nested (as in a list with depth=1).
    company = admin.create("companies", {"name": "Hidden"})
    admin.create("people", {"firstName": "Linked", "company": {"connect": company["id"]}})
    lines = _ndjson(
        _export(people_only, "people", {"format": "ndjson", "relationField": "name"}).content
    )
    linked = [line for line in lines if line["firstName"] == "Linked"]
    assert linked
    assert "company" not in linked[0]
    assert linked[0]["companyId"] == company["id"]
    anonymous = client.get("/rest/people/export", params={"format": "csv"})
    assert anonymous.status_code == 401


@pytest.mark.parametrize(
    ("path", "params", "status", "field"),
    [
        ("/rest/unicorns/export", {"format": "csv"}, 404, "object"),
        ("/rest/people/export", {}, 400, "format"),
        ("/rest/people/export", {"format": "xlsx"}, 400, "format"),
        ("/rest/people/export", {"format": "csv", "filter[nope][eq]": "1"}, 400, "nope"),
        ("/rest/people/export", {"format": "csv", "filter": "{not json"}, 400, "filter"),
        ("/rest/people/export", {"format": "csv", "fields": "firstName,nope"}, 400, "nope"),
        ("/rest/people/export", {"format": "csv", "limit": "5"}, 400, "limit"),
        ("/rest/people/export", {"format": "csv", "orderBy[firstName]": "UP"}, 400, "firstName"),
    ],
)
def test_bad_exports_are_refused_before_streaming(
    admin: Api, path: str, params: dict[str, str], status: int, field: str
) -> None:
    body = admin.bad("GET", path, status, params=params)
    assert body["details"]["field"] == field, body


def test_a_record_id_path_is_not_taken_for_an_export(admin: Api) -> None:
    person = admin.create("people", {"firstName": "Still"})
    assert admin.ok("GET", f"/rest/people/{person['id']}")["data"]["firstName"] == "Still"


# -- a large export: constant memory, one snapshot ----------------------------------------------


def _rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status").read().splitlines():  # noqa: SIM115
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def _pids(stack: Stack) -> dict[str, int]:
    found: dict[str, int] = {}
    for service in ("gateway", "records"):
        for instance in stack.instances.get(service, []):
            pid = instance.process.pid
            assert pid is not None
            found[f"{service}{instance.replica}"] = pid
    return found


@pytest.fixture(scope="module")
def big(client: httpx.Client) -> Api:
    api = Api.signup(client)
    for start in range(0, BIG_ROWS, 1000):
        batch = [{"firstName": f"Row {start + i:05d}", "jobTitle": FILLER} for i in range(1000)]
        api.ok("POST", "/rest/batch/people", 201, json=batch, timeout=120)
    return api


def test_a_large_export_streams_in_constant_memory_from_one_snapshot(
    big: Api, local_stack: Stack
) -> None:
    pids = _pids(local_stack)
    # A small first export (a tenth) warms every process up (allocator arenas, buffers, code
    # paths: ~10 MB once, measured); the full one must then not grow with what it sends.
    warm = {"format": "csv", "filter[firstName][lt]": "Row 02000"}
    with big.http.stream(
        "GET", "/rest/people/export", params=warm, headers=big.headers, timeout=300
    ) as response:
        assert sum(len(chunk) for chunk in response.iter_bytes()) > 2000 * len(FILLER)
    before = {name: _rss_kib(pid) for name, pid in pids.items()}
    peak = dict(before)
    last = big.ok("GET", "/rest/people", params={"orderBy[firstName]": "DESC", "limit": "1"})
    last_id = last["data"][0]["id"]
    received = bytearray()
    lines = 0
    wrote = False
    with big.http.stream(
        "GET",
        "/rest/people/export",
        params={"format": "ndjson", "orderBy[firstName]": "ASC"},
        headers=big.headers,
        timeout=300,
    ) as response:
        assert response.status_code == 200
        assert response.headers.get("transfer-encoding") == "chunked"
        for chunk in response.iter_bytes():
            received += chunk
            if not wrote:
                # Written once the export runs: neither may show in it.
                big.create("people", {"firstName": "Row 99999 written during", "jobTitle": "n"})
                big.ok("PATCH", f"/rest/people/{last_id}", json={"jobTitle": "changed"})
                wrote = True
            if len(received) > 2_000_000:
                lines += received.count(b"\n")
                received.clear()
                for name, pid in pids.items():
                    peak[name] = max(peak[name], _rss_kib(pid))
    lines += received.count(b"\n")
    tail = bytes(received).splitlines()[-1]
    assert lines == BIG_ROWS
    assert orjson.loads(tail)["id"] == last_id
    assert orjson.loads(tail)["jobTitle"] == FILLER  # the value when the export began
    exported_kib = BIG_ROWS * len(FILLER) // 1024
    for name in pids:
        grown = peak[name] - before[name]
        # Bounded by flow-control windows and buffers (up to ~14 MB measured on a loaded
        # machine), where holding the export would grow by its whole size.
        assert grown < exported_kib // 2, (name, grown, exported_kib)
    # The writes did happen: the next export sees them.
    changed = big.ok("GET", f"/rest/people/{last_id}")["data"]["jobTitle"]
    assert changed == "changed"


def test_exports_beyond_half_the_records_pool_wait_their_turn(big: Api, local_stack: Stack) -> None:
    """Each export holds a pooled connection while its client reads: a records instance runs at
    most half its pool (DB_POOL_MAX_SIZE 10: 5), the next gets 429 until one ends."""
    slots = int(local_stack.env.get("DB_POOL_MAX_SIZE", "10")) // 2
    params = {"format": "ndjson"}
    with ExitStack() as held:
        for _ in range(slots):  # started, then not read: the records service waits on the client
            response = held.enter_context(
                big.http.stream(
                    "GET", "/rest/people/export", params=params, headers=big.headers, timeout=60
                )
            )
            assert response.status_code == 200
        body = big.bad("GET", "/rest/people/export", 429, params=params)
        assert "too many exports" in body["message"]
    deadline = time.monotonic() + 20
    while True:  # the abandoned exports end (and free their slots) as their clients went away
        response = _export(big, "people", {"format": "csv", "fields": "firstName"})
        if response.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert response.status_code == 200, response.text
    assert response.content.count(b"\r\n") > BIG_ROWS


# -- GraphQL export jobs -------------------------------------------------------------------------


def test_an_export_job_downloads_with_its_file_token(client: httpx.Client, admin: Api) -> None:
    _seed_small(admin)
    job = admin.data(
        CREATE_EXPORT,
        {
            "object": "people",
            "format": "CSV",
            "filter": {"lastName": {"eq": "Smith"}},
            "fields": ["firstName", "lastName"],
        },
    )["createExport"]
    assert job["object"] == "person"
    assert job["format"] == "CSV"
    assert job["state"] == "READY"
    assert job["fileTokenExpiresIn"] == 86400
    assert job["fileToken"] in job["downloadUrl"]
    expected = _export(
        admin,
        "people",
        {"format": "csv", "filter[lastName][eq]": "Smith", "fields": "firstName,lastName"},
    ).content
    assert len(_csv(expected)) == 8
    # The URL alone (no Authorization header) ...
    path = job["downloadUrl"].removeprefix(str(client.base_url).rstrip("/"))
    downloaded = client.get(path)
    assert downloaded.status_code == 200, downloaded.text
    assert downloaded.content == expected
    assert downloaded.headers["content-type"] == "text/csv; charset=utf-8"
    # ... or the workspace's credentials.
    plain = f"/rest/exports/{job['id']}/download"
    assert client.get(plain, headers=admin.headers).content == expected
    assert client.get(plain).status_code == 401
    # The job is durable: shown again, with a fresh token, and downloadable again.
    again = admin.data(
        "query($id: UUID!) { exportJob(id: $id) { id state downloadUrl } }", {"id": job["id"]}
    )["exportJob"]
    assert again["id"] == job["id"]
    assert client.get(again["downloadUrl"].removeprefix(str(client.base_url))).content == expected


def test_invalid_and_expired_file_tokens_are_refused(
    client: httpx.Client, admin: Api, local_stack: Stack
) -> None:
    job = admin.data(CREATE_EXPORT, {"object": "people", "format": "NDJSON"})["createExport"]
    other = admin.data(CREATE_EXPORT, {"object": "companies", "format": "NDJSON"})["createExport"]
    secret = local_stack.env["APP_SECRET"]
    session = admin.session
    expired, _ = encode_jwt(
        secret,
        subject=session.user_id,
        workspace_id=session.workspace_id,
        email="",
        token_type=TokenType.FILE,
        token_id=job["id"],
        lifetime_seconds=60,
        now=int(time.time()) - 3600,
    )
    path = f"/rest/exports/{job['id']}/download"
    cases = {
        expired: "expired",
        "not-a-token": "invalid",
        other["fileToken"]: "another file",  # valid, for another job
        session.access_token: "invalid",  # an access token is not a file token
    }
    for token, reason in cases.items():
        response = client.get(path, params={"token": token})
        assert response.status_code == 401, (reason, response.text)
        body = response.json()
        assert set(body) == {"statusCode", "message", "error", "details"}
        assert reason in body["message"], (reason, body)
    # A job of another workspace is not found, whatever the credentials.
    stranger = Api.signup(client)
    stranger.bad("GET", path, 404)


def test_create_export_refuses_bad_input(admin: Api) -> None:
    for variables, field in (
        ({"object": "unicorns", "format": "CSV"}, "object"),
        ({"object": "people", "format": "CSV", "filter": {"nope": {"eq": 1}}}, "nope"),
        ({"object": "people", "format": "CSV", "fields": ["nope"]}, "nope"),
        ({"object": "people", "format": "CSV", "relationField": "nope"}, "relationField"),
    ):
        error = admin.error(CREATE_EXPORT, variables)
        assert error["extensions"]["code"] in ("BAD_USER_INPUT", "NOT_FOUND"), error
        assert field in str(error), (field, error)


def test_an_api_key_s_job_downloads_with_the_key(client: httpx.Client, admin: Api) -> None:
    admin.create("people", {"firstName": "Keyed"})
    key = admin.data('mutation { createApiKey(input: {name: "exports"}) { token } }')
    headers = {"Authorization": f"Bearer {key['createApiKey']['token']}"}
    response = client.post(
        "/graphql",
        json={"query": CREATE_EXPORT, "variables": {"object": "people", "format": "NDJSON"}},
        headers=headers,
    )
    job = response.json()["data"]["createExport"]
    assert job["fileToken"] is None  # file tokens are issued to users
    assert "token=" not in job["downloadUrl"]
    path = f"/rest/exports/{job['id']}/download"
    assert client.get(path).status_code == 401
    downloaded = client.get(path, headers=headers)
    assert downloaded.status_code == 200
    assert downloaded.headers["content-type"] == "application/x-ndjson"
    assert [line["firstName"] for line in _ndjson(downloaded.content)] == ["Keyed"]
