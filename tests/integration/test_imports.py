"""Import jobs (docs/api.md, "Import"): CSV and NDJSON uploads stored whole, then applied in
batches; rejected rows with line, field and reason; cancel; upsert re-import changing nothing;
refused uploads change nothing; a records service killed mid-import resumes with every row
written exactly once."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest

from crmkit.messaging import EVENT_BATCH_HEADER
from crmstack.stack import Stack
from tests.integration import webhooks_client
from tests.integration.api_helpers import Api, Record
from tests.integration.events_client import listen, query, read_stream
from tests.integration.webhooks_client import Hooks

TERMINAL = ("succeeded", "failed", "cancelled")

receiver = webhooks_client.receiver
hooks = webhooks_client.hooks


@pytest.fixture
def api(client: httpx.Client) -> Api:
    api = Api.signup(client)
    company = api.object_id("company")
    api.create_field(company, "code", "TEXT", isUnique=True)
    person = api.object_id("person")
    api.create_field(person, "externalId", "TEXT", isUnique=True)
    api.create_field(person, "score", "NUMBER")
    return api


def _upload(api: Api, path: str, body: bytes, content_type: str = "text/csv") -> httpx.Response:
    return api.http.post(
        path, content=body, headers={**api.headers, "Content-Type": content_type}, timeout=120
    )


def _start(api: Api, path: str, body: bytes, content_type: str = "text/csv") -> Record:
    response = _upload(api, path, body, content_type)
    assert response.status_code == 202, response.text
    job: Record = response.json()["data"]
    assert job["state"] in ("queued", "running")
    return job


def _wait(api: Api, job_id: str, states: tuple[str, ...] = TERMINAL, timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        job = api.ok("GET", f"/rest/imports/{job_id}")["data"]
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.3)


def _people(api: Api) -> dict[str, Record]:
    found: dict[str, Record] = {}
    after = ""
    while True:
        page = api.ok("GET", f"/rest/people?limit=200{after}")
        found.update({row["externalId"]: row for row in page["data"]})
        if not page["pageInfo"]["hasNextPage"]:
            return found
        after = f"&after={page['pageInfo']['endCursor']}"


def _csv(count: int, start: int = 0) -> bytes:
    lines = ["externalId,firstName,score"]
    lines += [f"p-{n},Name {n},{n}" for n in range(start, start + count)]
    return ("\r\n".join(lines) + "\r\n").encode()


def test_a_csv_import_with_labels_bom_quotes_and_relations_by_unique_field(api: Api) -> None:
    acme = api.create("companies", {"name": "Acme", "code": "ACME"})
    body = (
        "\ufeffexternalId,First Name,city,company.code,score\r\n"
        'c-1,Ada,"London, UK",ACME,1.5\r\n'
        'c-2,"Grace ""Amazing""","multi\nline",,2\r\n'
    ).encode()
    job = _wait(api, _start(api, "/rest/imports/people", body)["id"])
    assert job["state"] == "succeeded", job
    assert (job["rowsRead"], job["rowsWritten"], job["rowsRejected"]) == (2, 2, 0)
    people = _people(api)
    assert people["c-1"]["firstName"] == "Ada"
    assert people["c-1"]["city"] == "London, UK"
    assert people["c-1"]["companyId"] == acme["id"]
    assert people["c-1"]["score"] == 1.5
    assert people["c-2"]["firstName"] == 'Grace "Amazing"'
    assert people["c-2"]["city"] == "multi\nline"
    assert people["c-2"]["companyId"] is None


def test_ndjson_rejections_name_line_field_and_reason_and_download_whole(api: Api) -> None:
    lines = [
        b'{"externalId": "n-1", "firstName": "Ada"}',
        b'{"externalId": "n-2", "score": "many"}',  # wrong type
        b"",
        b'{"externalId": "n-3", "shoeSize": 44}',  # unknown field
        b"not json",
        b'{"externalId": "n-1"}',  # a duplicate unique value within the file
        b'{"externalId": "n-4", "company.code": "NOPE"}',  # no such related record
        b'{"externalId": "n-5"}',
    ]
    job = _start(api, "/rest/imports/people", b"\n".join(lines), "application/x-ndjson")
    job = _wait(api, job["id"])
    assert job["state"] == "succeeded", job
    assert (job["rowsRead"], job["rowsWritten"], job["rowsRejected"]) == (7, 2, 5)
    rejected = {(r["line"], r["field"]) for r in job["firstRejections"]}
    assert rejected == {
        (2, "score"),
        (4, "shoeSize"),
        (5, "row"),
        (6, "externalId"),
        (7, "company.code"),
    }, job["firstRejections"]
    assert all(r["reason"] for r in job["firstRejections"])
    assert set(_people(api)) == {"n-1", "n-5"}
    download = api.rest("GET", f"/rest/imports/{job['id']}/rejections")
    assert download.status_code == 200, download.text
    assert download.headers["content-type"].startswith("text/csv")
    rows = download.text.strip().splitlines()
    assert rows[0] == "line,field,reason"
    assert [row.split(",")[0] for row in rows[1:]] == ["2", "4", "5", "6", "7"]


def test_csv_rows_of_plain_columns_are_checked_like_the_api_with_line_field_and_reason(
    api: Api,
) -> None:
    body = (
        b"externalId,firstName,score\r\n"
        b"k-1,Ada,1.5\r\n"
        b"k-2,Bob,many\r\n"  # not a number
        b"k-3,Cy\r\n"  # a cell missing
        b"k-4,,\r\n"  # empty cells are null
        b'k-5,"Nul\x00",3\r\n'  # text the API refuses
        b"k-6,Eve,1e400\r\n"  # not finite
    )
    job = _wait(api, _start(api, "/rest/imports/people", body)["id"])
    assert (job["state"], job["rowsRead"], job["rowsWritten"]) == ("succeeded", 6, 2), job
    assert [(r["line"], r["field"], r["reason"]) for r in job["firstRejections"]] == [
        (3, "score", "score: not a number"),
        (4, "row", "row: 2 columns where the header has 3"),
        (6, "firstName", "firstName: text cannot contain the NUL character"),
        (7, "score", "score: not a finite number"),
    ]
    people = _people(api)
    assert set(people) == {"k-1", "k-4"}
    assert (people["k-1"]["firstName"], people["k-1"]["score"]) == ("Ada", 1.5)
    assert (people["k-4"]["firstName"], people["k-4"]["score"]) == (None, None)


def test_a_file_imported_again_rejects_each_row_a_record_holds_and_writes_the_new_ones(
    api: Api,
) -> None:
    first = _wait(api, _start(api, "/rest/imports/people", _csv(3000))["id"])
    assert (first["rowsWritten"], first["rowsRejected"]) == (3000, 0)
    # The same 3000 rows (over several batches), 499 new ones, and a new value twice.
    body = _csv(3499) + b"p-3400,Again,1\r\n"
    again = _wait(api, _start(api, "/rest/imports/people", body)["id"], timeout=300)
    assert (again["state"], again["rowsRead"]) == ("succeeded", 3500), again
    assert (again["rowsWritten"], again["rowsRejected"]) == (499, 3001), again
    assert again["firstRejections"][0] == {
        "line": 2,
        "field": "externalId",
        "reason": "a person with this externalId already exists",
    }
    download = api.rest("GET", f"/rest/imports/{again['id']}/rejections")
    lines = download.text.strip().splitlines()[1:]
    assert len(lines) == 3001
    assert lines[-1] == "3501,externalId,the same value as line 3402"
    people = _people(api)
    assert len(people) == 3499
    assert people["p-3400"]["firstName"] == "Name 3400"


def test_values_repeated_across_batches_written_at_once_are_kept_by_the_earliest_line(
    api: Api,
) -> None:
    # Batches of 1,000 rows, two written at once: each batch after the first starts with the
    # values of the previous batch's last rows (which the later batch reaches first) and ends
    # with values of the previous batch's first rows.
    rows = [f"p-{n}" for n in range(1000)]
    for batch in range(1, 4):
        start = batch * 1000
        rows += rows[start - 10 : start]  # rows 0-9 of this batch
        rows += [f"p-{n}" for n in range(start + 10, start + 990)]
        rows += rows[start - 1000 : start - 990]  # rows 990-999
    assert len(rows) == 4000
    body = "externalId,firstName\r\n" + "".join(
        f"{key},Line {i + 2}\r\n" for i, key in enumerate(rows)
    )
    job = _wait(api, _start(api, "/rest/imports/people", body.encode())["id"], timeout=300)
    kept = {key: i + 2 for i, key in reversed(list(enumerate(rows)))}
    repeated = [i + 2 for i, key in enumerate(rows) if kept[key] != i + 2]
    assert (job["state"], job["rowsRead"]) == ("succeeded", 4000), job
    assert (job["rowsWritten"], job["rowsRejected"]) == (len(kept), len(repeated)), job
    download = api.rest("GET", f"/rest/imports/{job['id']}/rejections").text.strip().splitlines()
    assert download[1:] == [
        f"{line},externalId,a person with this externalId already exists" for line in repeated
    ]
    people = _people(api)
    assert {key: row["firstName"] for key, row in people.items()} == {
        key: f"Line {line}" for key, line in kept.items()
    }


def test_rows_name_records_the_batch_before_theirs_created(api: Api) -> None:
    api.create_field(
        api.object_id("person"), "manager", "RELATION",
        relation={"targetObjectName": "person", "inverseFieldName": "reports"},
    )  # fmt: skip
    # Batches of 1,000 rows: each row after the first batch names its manager by the unique
    # value of a row of the batch before.
    lines = ["externalId,manager.externalId"]
    lines += [f"m-{n}," + (f"m-{n - 1000}" if n >= 1000 else "") for n in range(3000)]
    body = ("\r\n".join(lines) + "\r\n").encode()
    job = _wait(api, _start(api, "/rest/imports/people", body)["id"], timeout=300)
    assert (job["state"], job["rowsWritten"], job["rowsRejected"]) == ("succeeded", 3000, 0), job
    people = _people(api)
    assert all(people[f"m-{n}"]["managerId"] is None for n in range(1000))
    assert [people[f"m-{n}"]["managerId"] for n in range(1000, 3000)] == [
        people[f"m-{n}"]["id"] for n in range(2000)
    ]
    # The same by id, in NDJSON.
    ids = [str(uuid.uuid4()) for _ in range(2000)]
    records = [
        {"id": ids[n], "externalId": f"i-{n}", "managerId": ids[n - 1000] if n >= 1000 else None}
        for n in range(2000)
    ]
    body = b"".join(orjson.dumps(record) + b"\n" for record in records)
    job = _wait(api, _start(api, "/rest/imports/people", body, "application/x-ndjson")["id"])
    assert (job["state"], job["rowsWritten"], job["rowsRejected"]) == ("succeeded", 2000, 0), job
    people = _people(api)
    assert [people[f"i-{n}"]["managerId"] for n in range(1000, 2000)] == ids[:1000]


def test_refused_uploads_are_400s_that_store_nothing(api: Api) -> None:
    cases = [
        ("/rest/imports/people", b"externalId,shoeSize\r\nx,1\r\n", "shoeSize"),
        ("/rest/imports/people", b"externalId,firstName\r\nx,\xff\xfe\r\n", "file"),
        ("/rest/imports/people?upsert=firstName", _csv(1), "firstName"),
        ("/rest/imports/people", b"", "file"),
        ("/rest/imports/people?format=xml", _csv(1), "format"),
        ("/rest/imports/people?columns=[1]", _csv(1), "columns"),
    ]
    for path, body, field in cases:
        response = _upload(api, path, body)
        assert response.status_code == 400, (path, response.text)
        assert response.json()["details"]["field"] == field, (path, response.text)
    assert api.ok("GET", "/rest/imports")["data"] == []
    # An explicit mapping renames or skips columns.
    mapping = '{"id_ext": "externalId", "shoeSize": null}'
    job = _start(api, f"/rest/imports/people?columns={mapping}", b"id_ext,shoeSize\r\nm-1,44\r\n")
    assert _wait(api, job["id"])["rowsWritten"] == 1
    assert set(_people(api)) == {"m-1"}


def _events(stack: Stack, ids: list[str]) -> dict[str, int]:
    rows = query(
        stack,
        "SELECT action, count(*) FROM records.outbox WHERE record_id = ANY($1::uuid[]) "
        "GROUP BY action",
        ids,
    )
    return {row[0]: row[1] for row in rows}


def test_an_upsert_reimport_changes_nothing_and_events_can_be_off(
    api: Api, local_stack: Stack
) -> None:
    listen(local_stack, api.session.workspace_id)  # its events are written (docs/events.md)
    path = "/rest/imports/people?upsert=externalId"
    first = _wait(api, _start(api, path, _csv(30))["id"])
    assert (first["rowsWritten"], first["rowsRejected"], first["emitEvents"]) == (30, 0, True)
    before = _people(api)
    ids = [row["id"] for row in before.values()]
    assert _events(local_stack, ids) == {"created": 30}

    again = _wait(api, _start(api, path, _csv(30))["id"])
    assert (again["state"], again["rowsWritten"], again["rowsRejected"]) == ("succeeded", 30, 0)
    assert _people(api) == before  # not even updatedAt moved
    assert _events(local_stack, ids) == {"created": 30}

    changed = _csv(30).replace(b",Name ", b",Renamed ")
    quiet = _wait(api, _start(api, f"{path}&events=false", changed)["id"])
    assert (quiet["rowsWritten"], quiet["emitEvents"]) == (30, False)
    assert {row["firstName"][:7] for row in _people(api).values()} == {"Renamed"}
    assert _events(local_stack, ids) == {"created": 30}


def test_the_event_of_an_imported_record_carries_the_record_a_read_shows(
    api: Api, local_stack: Stack
) -> None:
    listen(local_stack, api.session.workspace_id)
    job = _wait(api, _start(api, "/rest/imports/people", _csv(25))["id"])
    assert (job["rowsWritten"], job["emitEvents"]) == (25, True)
    shown = api.ok("GET", "/rest/people?limit=200&depth=0")["data"]
    events = query(
        local_stack,
        "SELECT record_id::text, action, record::text FROM records.outbox "
        "WHERE workspace_id = $1::uuid",
        api.session.workspace_id,
    )
    assert {row[0]: (row[1], orjson.loads(row[2])) for row in events} == {
        record["id"]: ("created", record) for record in shown
    }


def test_cancel_stops_a_running_import_and_imports_per_workspace_are_capped(api: Api) -> None:
    total = 20_000  # enough to be still running when the cancel lands, however fast the import
    first = _start(api, "/rest/imports/people", _csv(total))
    second = _start(api, "/rest/imports/people", _csv(10, start=total))
    third = _upload(api, "/rest/imports/people", _csv(10, start=total + 100))
    assert third.status_code == 429, third.text
    assert "at most 2" in third.json()["message"]

    _wait(api, first["id"], ("running",))
    cancelled = api.ok("POST", f"/rest/imports/{first['id']}/cancel")["data"]
    assert cancelled["state"] == "cancelled"
    written = cancelled["rowsWritten"]
    assert written < total
    assert _wait(api, second["id"])["state"] == "succeeded"
    time.sleep(1)
    final = api.ok("GET", f"/rest/imports/{first['id']}")["data"]
    assert (final["state"], final["rowsWritten"]) == ("cancelled", written)
    assert len([k for k in _people(api) if int(k[2:]) < total]) == written
    again = api.bad("POST", f"/rest/imports/{second['id']}/cancel")
    assert "succeeded" in again["message"]
    listed = api.ok("GET", "/rest/imports?limit=1")
    assert [job["id"] for job in listed["data"]] == [second["id"]]
    assert listed["pageInfo"]["hasNextPage"] is True
    older = api.ok("GET", f"/rest/imports?limit=5&after={second['id']}")["data"]
    assert [job["id"] for job in older] == [first["id"]]


def test_a_records_service_killed_mid_import_resumes_and_writes_each_row_once(
    api: Api, local_stack: Stack
) -> None:
    total = 20_000  # enough to be still running when the kill lands, however fast the import
    job = _start(api, "/rest/imports/people", _csv(total))
    deadline = time.monotonic() + 120
    while api.ok("GET", f"/rest/imports/{job['id']}")["data"]["rowsWritten"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    instance = local_stack.instances["records"][0]
    pid = instance.process.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    at_kill = query(
        local_stack,
        "SELECT state, rows_written FROM records.import_jobs WHERE id = $1",
        uuid.UUID(job["id"]),
    )[0]
    assert at_kill["state"] == "running"
    assert 0 < at_kill["rows_written"] < total
    local_stack.restart("records")
    done = _wait(api, job["id"], timeout=300)
    assert (done["state"], done["rowsRead"], done["rowsWritten"]) == ("succeeded", total, total)
    assert done["rowsRejected"] == 0
    people = _people(api)
    assert len(people) == total
    assert set(people) == {f"p-{n}" for n in range(total)}


def test_graphql_shows_lists_and_cancels_import_jobs(api: Api) -> None:
    body = b'{"externalId": "q-1"}\n{"externalId": "q-2", "score": "x"}\n'
    job = _wait(api, _start(api, "/rest/imports/people", body, "application/x-ndjson")["id"])
    fields = "id state rowsRead rowsWritten rowsRejected firstRejections { line field reason }"
    data = api.data(f'{{ importJob(id: "{job["id"]}") {{ {fields} }} }}')
    assert data["importJob"]["state"] == "SUCCEEDED"
    assert (data["importJob"]["rowsRead"], data["importJob"]["rowsWritten"]) == (2, 1)
    assert data["importJob"]["firstRejections"][0]["line"] == 2
    assert data["importJob"]["firstRejections"][0]["field"] == "score"
    listed = api.data("{ importJobs(first: 5) { id } }")["importJobs"]
    assert [entry["id"] for entry in listed] == [job["id"]]
    error = api.error(f'mutation {{ cancelImportJob(id: "{job["id"]}") {{ id }} }}')
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    assert "succeeded" in error["message"]


def test_a_file_over_the_size_limit_is_a_413_that_stores_nothing(
    api: Api, extra_gateway: Callable[[dict[str, str]], str]
) -> None:
    url = extra_gateway({"IMPORT_MAX_BYTES": "4096"})
    body = _csv(400)
    assert len(body) > 4096

    def chunks() -> Iterator[bytes]:  # no Content-Length: refused while it streams
        for start in range(0, len(body), 1000):
            yield body[start : start + 1000]

    headers = {**api.headers, "Content-Type": "text/csv"}
    with httpx.Client(base_url=url, timeout=60) as http:
        streamed = http.post("/rest/imports/people", content=chunks(), headers=headers)
        assert streamed.status_code == 413, streamed.text
        declared = http.post("/rest/imports/people", content=body, headers=headers)
        assert declared.status_code == 413, declared.text
        assert "4096" in declared.json()["message"]
        small = http.post("/rest/imports/people", content=_csv(3), headers=headers)
        assert small.status_code == 202, small.text
    assert [job["id"] for job in api.ok("GET", "/rest/imports")["data"]] == [
        small.json()["data"]["id"]
    ]


def test_an_imports_events_reach_a_webhook_once_each_several_to_a_message(
    hooks: Hooks, local_stack: Stack
) -> None:
    webhook = hooks.create(["person.created"])
    rows = 300
    body = "firstName,lastName\n" + "".join(f"Bulk{n},Row{n}\n" for n in range(rows))
    response = hooks.client.post(
        "/rest/imports/people",
        content=body.encode(),
        headers={"Authorization": f"Bearer {hooks.admin.access_token}", "Content-Type": "text/csv"},
        timeout=120,
    )
    assert response.status_code == 202, response.text

    stream = read_stream(local_stack, hooks.ws.id, rows)
    messages = {event.stream_sequence: event.headers for event in stream}
    assert len(messages) <= rows // 10  # an import's events travel several to a message
    assert all(headers.get(EVENT_BATCH_HEADER) for headers in messages.values())
    assert sum(int(headers[EVENT_BATCH_HEADER]) for headers in messages.values()) == rows

    hooks.wait_events(webhook["path"], rows, timeout=120)
    time.sleep(1)  # and no event twice
    deliveries = hooks.receiver.events(webhook["path"])
    assert len(deliveries) == rows
    assert sorted(d.payload["id"] for d in deliveries) == sorted(e.event.id for e in stream)
    names = {d.payload["record"]["firstName"] for d in deliveries}
    assert names == {f"Bulk{n}" for n in range(rows)}
    assert {d.payload["record"]["id"] for d in deliveries} == {e.event.record_id for e in stream}
