"""Idempotent writes (docs/api.md, "Idempotent writes"): a write retried with its
`Idempotency-Key` and the same body answers the first response and writes nothing; the key with
another body is a 422 naming the header; concurrent requests with one key write once; a failed
write keeps no key; keys are per credential, expire, and survive a crash of the records service
(no duplicate from a retry)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import pytest

from crmstack.client import graphql_data
from crmstack.stack import Stack
from records.sql import workspace_schema_name
from tests.integration.api_helpers import Api
from tests.integration.events_client import listen

HEADER = "Idempotency-Key"


@pytest.fixture
def api(client: httpx.Client) -> Api:
    return Api.signup(client)


def _key() -> str:
    return f"key-{uuid.uuid4()}"


def _post(api: Api, path: str, key: str, body: Any, headers: dict[str, str] | None = None) -> Any:
    return api.http.post(path, json=body, headers={**(headers or api.headers), HEADER: key})


def _named(api: Api, tag: str) -> list[dict[str, Any]]:
    found = api.ok("GET", f"/rest/people?filter[firstName][eq]={tag}&limit=200")
    records: list[dict[str, Any]] = found["data"]
    return records


def _created_events(stack: Stack, record_ids: list[str]) -> int:
    async def count() -> int:
        connection = await asyncpg.connect(stack.env["DATABASE_URL"])
        try:
            found: int = await connection.fetchval(
                "SELECT count(*) FROM records.outbox WHERE record_id = ANY($1::uuid[]) "
                "AND action = 'created'",
                record_ids,
            )
        finally:
            await connection.close()
        return found

    return asyncio.run(count())


def test_a_replay_answers_the_first_response_and_writes_nothing(
    api: Api, local_stack: Stack
) -> None:
    listen(local_stack, api.session.workspace_id)  # its events are written (docs/events.md)
    key, tag = _key(), f"r{uuid.uuid4().hex[:12]}"
    first = _post(api, "/rest/people", key, {"firstName": tag, "jobTitle": "A"})
    assert first.status_code == 201, first.text
    # The same body with its keys in another order is the same request.
    again = _post(api, "/rest/people", key, {"jobTitle": "A", "firstName": tag})
    assert (again.status_code, again.content) == (201, first.content)
    assert [r["id"] for r in _named(api, tag)] == [first.json()["data"]["id"]]
    assert _created_events(local_stack, [first.json()["data"]["id"]]) == 1

    # Batch create, update, delete and restore replay too (status and body).
    batch_key = _key()
    batch = [{"firstName": tag}, {"firstName": tag}]
    made = _post(api, "/rest/batch/people", batch_key, batch)
    assert made.status_code == 201, made.text
    replayed = _post(api, "/rest/batch/people", batch_key, batch)
    assert (replayed.status_code, replayed.content) == (201, made.content)
    assert len(_named(api, tag)) == 3

    record_id = first.json()["data"]["id"]
    headers = {**api.headers, HEADER: _key()}
    patched = api.http.patch(f"/rest/people/{record_id}", json={"jobTitle": "B"}, headers=headers)
    assert patched.status_code == 200, patched.text
    api.ok("PATCH", f"/rest/people/{record_id}", json={"jobTitle": "C"})
    repatched = api.http.patch(f"/rest/people/{record_id}", json={"jobTitle": "B"}, headers=headers)
    assert (repatched.status_code, repatched.content) == (200, patched.content)
    assert api.ok("GET", f"/rest/people/{record_id}")["data"]["jobTitle"] == "C"

    headers = {**api.headers, HEADER: _key()}
    deleted = api.http.delete(f"/rest/people/{record_id}", headers=headers)
    assert deleted.status_code == 200, deleted.text
    api.ok("PATCH", f"/rest/restore/people/{record_id}")
    redeleted = api.http.delete(f"/rest/people/{record_id}", headers=headers)
    assert (redeleted.status_code, redeleted.content) == (200, deleted.content)
    assert api.ok("GET", f"/rest/people/{record_id}")["data"]["deletedAt"] is None


def test_a_merge_replays(api: Api) -> None:
    source = api.create("companies", {"name": "Source"})
    target = api.create("companies", {"name": "Target"})
    headers = {**api.headers, HEADER: _key()}
    body = {"sourceId": source["id"], "targetId": target["id"]}
    merged = api.http.patch("/rest/companies/merge", json=body, headers=headers)
    assert merged.status_code == 200, merged.text
    api.ok("PATCH", f"/rest/restore/companies/{source['id']}")
    again = api.http.patch("/rest/companies/merge", json=body, headers=headers)
    assert (again.status_code, again.content) == (200, merged.content)
    # Not merged a second time: the restored source stays active.
    assert api.ok("GET", f"/rest/companies/{source['id']}")["data"]["deletedAt"] is None


def test_the_key_with_another_body_is_422_naming_the_header(api: Api) -> None:
    key, tag = _key(), f"d{uuid.uuid4().hex[:12]}"
    assert _post(api, "/rest/people", key, {"firstName": tag}).status_code == 201
    others = (("/rest/people", {"firstName": tag + "x"}), ("/rest/companies", {"name": tag}))
    for path, body in others:
        response = _post(api, path, key, body)
        assert response.status_code == 422, response.text
        assert response.json()["error"] == "Unprocessable Entity"
        assert response.json()["details"]["field"] == HEADER
    assert len(_named(api, tag)) == 1
    assert _named(api, tag + "x") == []


@pytest.mark.parametrize("value", ["", "x" * 256, "caf\u00e9"])
def test_a_malformed_key_is_400_naming_the_header(api: Api, value: str) -> None:
    tag = f"m{uuid.uuid4().hex[:12]}"
    headers = {k.encode(): v.encode() for k, v in {**api.headers, HEADER: value}.items()}
    response = api.http.post("/rest/people", json={"firstName": tag}, headers=headers)
    assert response.status_code == 400, response.text
    assert response.json()["details"]["field"] == HEADER
    assert _named(api, tag) == []


def test_keys_are_scoped_to_the_credential(api: Api) -> None:
    created = graphql_data(
        api.http,
        api.session.access_token,
        "mutation($i: CreateApiKeyInput!) { createApiKey(input: $i) { token } }",
        {"i": {"name": "idem"}},
    )
    other = {"Authorization": f"Bearer {created['createApiKey']['token']}"}
    key, tag = _key(), f"c{uuid.uuid4().hex[:12]}"
    first = _post(api, "/rest/people", key, {"firstName": tag})
    second = _post(api, "/rest/people", key, {"firstName": tag}, headers=other)
    assert (first.status_code, second.status_code) == (201, 201), second.text
    assert first.json()["data"]["id"] != second.json()["data"]["id"]
    # Each credential's retry replays its own first answer.
    assert _post(api, "/rest/people", key, {"firstName": tag}).content == first.content
    again = _post(api, "/rest/people", key, {"firstName": tag}, headers=other)
    assert again.content == second.content
    # Another workspace with the same key: independent too.
    stranger = Api.signup(api.http)
    third = _post(stranger, "/rest/people", key, {"firstName": tag})
    assert third.status_code == 201, third.text
    assert len(_named(api, tag)) == 2


def test_concurrent_requests_with_one_key_write_once(api: Api) -> None:
    key, tag = _key(), f"k{uuid.uuid4().hex[:12]}"

    def send(_: int) -> tuple[int, bytes]:
        with httpx.Client(base_url=str(api.http.base_url), timeout=60) as http:
            response = http.post(
                "/rest/people", json={"firstName": tag}, headers={**api.headers, HEADER: key}
            )
            return response.status_code, response.content

    with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(send, range(20)))
    assert {status for status, _ in answers} == {201}, answers
    assert len({body for _, body in answers}) == 1
    assert len(_named(api, tag)) == 1


def test_a_failed_write_keeps_no_key(api: Api) -> None:
    key, tag = _key(), f"f{uuid.uuid4().hex[:12]}"
    bad = _post(api, "/rest/people", key, {"firstName": tag, "email": "not-an-email"})
    assert bad.status_code == 400, bad.text
    fixed = _post(api, "/rest/people", key, {"firstName": tag, "email": "a@b.test"})
    assert fixed.status_code == 201, fixed.text
    again = _post(api, "/rest/people", key, {"firstName": tag, "email": "a@b.test"})
    assert (again.status_code, again.content) == (201, fixed.content)
    assert len(_named(api, tag)) == 1


MUTATION = "mutation($d: PersonCreateInput!) { createPerson(data: $d) { id firstName } }"


def _graphql(api: Api, query: str, variables: dict[str, Any], key: str) -> httpx.Response:
    return api.http.post(
        "/graphql",
        json={"query": query, "variables": variables},
        headers={**api.headers, HEADER: key},
    )


def test_graphql_single_mutation_replays(api: Api) -> None:
    key, tag = _key(), f"g{uuid.uuid4().hex[:12]}"
    first = _graphql(api, MUTATION, {"d": {"firstName": tag}}, key)
    assert first.status_code == 200, first.text
    assert "errors" not in first.json(), first.text
    again = _graphql(api, MUTATION, {"d": {"firstName": tag}}, key)
    assert again.content == first.content
    assert len(_named(api, tag)) == 1
    other = _graphql(api, MUTATION, {"d": {"firstName": tag + "x"}}, key).json()
    assert other["errors"][0]["extensions"]["field"] == HEADER
    assert other["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"

    create = f'createPerson(data: {{firstName: "{tag}"}}) {{ id }}'
    two = f"mutation {{ a: {create} b: {create} }}"
    refused = _graphql(api, two, {}, _key()).json()
    assert {e["extensions"]["field"] for e in refused["errors"]} == {HEADER}
    assert len(_named(api, tag)) == 1


def test_graphql_updates_and_deletes_replay_and_write_once(api: Api) -> None:
    tag = f"u{uuid.uuid4().hex[:12]}"
    created = _graphql(api, MUTATION, {"d": {"firstName": tag}}, _key()).json()
    person = created["data"]["createPerson"]["id"]
    update = (
        "mutation($id: UUID!, $d: PersonUpdateInput!) { updatePerson(id: $id, data: $d) "
        "{ id jobTitle updatedAt } }"
    )
    key = _key()
    first = _graphql(api, update, {"id": person, "d": {"jobTitle": "A"}}, key)
    assert "errors" not in first.json(), first.text
    api.ok("PATCH", f"/rest/people/{person}", json={"jobTitle": "B"})
    again = _graphql(api, update, {"id": person, "d": {"jobTitle": "A"}}, key)
    assert again.content == first.content  # the first answer, and not written again
    assert api.ok("GET", f"/rest/people/{person}")["data"]["jobTitle"] == "B"

    delete = "mutation($id: UUID!) { deletePerson(id: $id) { id deletedAt } }"
    key = _key()
    gone = _graphql(api, delete, {"id": person}, key)
    assert gone.json()["data"]["deletePerson"]["deletedAt"], gone.text
    api.ok("PATCH", f"/rest/restore/people/{person}")
    replayed = _graphql(api, delete, {"id": person}, key)
    assert replayed.content == gone.content
    assert api.ok("GET", f"/rest/people/{person}")["data"]["deletedAt"] is None


def _with_records_env(stack: Stack, **env: str) -> None:
    instance = stack.instances["records"][0]
    instance.process.env = {**instance.process.env, **env}
    stack.restart("records")


@contextlib.contextmanager
def _short_ttl(stack: Stack, seconds: int) -> Iterator[None]:
    before = dict(stack.instances["records"][0].process.env)
    _with_records_env(stack, IDEMPOTENCY_KEY_TTL=str(seconds))
    try:
        yield
    finally:
        stack.instances["records"][0].process.env = before
        stack.restart("records")


def _stored_keys(stack: Stack, key: str) -> int:
    async def count() -> int:
        connection = await asyncpg.connect(stack.env["DATABASE_URL"])
        try:
            found: int = await connection.fetchval(
                "SELECT count(*) FROM records.idempotency_keys WHERE key = $1", key
            )
        finally:
            await connection.close()
        return found

    return asyncio.run(count())


def test_keys_expire_and_are_pruned(api: Api, local_stack: Stack) -> None:
    key, tag = _key(), f"e{uuid.uuid4().hex[:12]}"
    with _short_ttl(local_stack, 2):
        assert _post(api, "/rest/people", key, {"firstName": tag}).status_code == 201
        time.sleep(3)
        # Expired: the key is free again and the same request writes anew.
        assert _post(api, "/rest/people", key, {"firstName": tag}).status_code == 201
        assert len(_named(api, tag)) == 2
        assert _stored_keys(local_stack, key) == 1
        time.sleep(3)
    # Records pruned the expired key on its restart.
    deadline = time.monotonic() + 30
    while _stored_keys(local_stack, key) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _stored_keys(local_stack, key) == 0


def test_writes_retried_with_their_key_after_a_records_crash_have_no_duplicate(
    api: Api, local_stack: Stack
) -> None:
    """#26: records is SIGKILLed under a steady writer; every write not answered 2xx is retried
    with its key once records is back; each request's record then exists exactly once."""
    tags = [f"x{uuid.uuid4().hex[:12]}" for _ in range(40)]
    keys = {tag: _key() for tag in tags}

    def write(tag: str) -> int:
        with httpx.Client(base_url=str(api.http.base_url), timeout=60) as http:
            body = {"firstName": tag}
            return http.post(
                "/rest/people", json=body, headers={**api.headers, HEADER: keys[tag]}
            ).status_code

    instance = local_stack.instances["records"][0]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futures = []
        for number, tag in enumerate(tags):
            if number == 15:
                pid = instance.process.pid
                assert pid is not None
                os.kill(pid, signal.SIGKILL)
            futures.append(pool.submit(write, tag))
            time.sleep(0.03)
        statuses = dict(zip(tags, (future.result() for future in futures), strict=True))
    local_stack.restart("records")
    failed = [tag for tag, status in statuses.items() if status != 201]
    assert failed, "no write failed: records was not down"
    assert {statuses[tag] for tag in failed} <= {503, 504}, statuses
    for tag in failed:
        retried = api.http.post(
            "/rest/people", json={"firstName": tag}, headers={**api.headers, HEADER: keys[tag]}
        )
        assert retried.status_code == 201, retried.text
    for tag in tags:
        assert len(_named(api, tag)) == 1, (tag, statuses[tag])


def test_writes_the_client_gave_up_on_are_retried_without_duplicates(
    api: Api, local_stack: Stack
) -> None:
    """#26: the people table is locked so writes wait; the client gives up on each (as on a 504
    or a dropped connection) while the write goes on and commits once the lock is released; the
    retry with its key then answers that write instead of writing a second record."""
    tags = [f"w{uuid.uuid4().hex[:12]}" for _ in range(4)]
    keys = {tag: _key() for tag in tags}
    schema = workspace_schema_name(api.session.workspace_id)
    locked, release = threading.Event(), threading.Event()

    async def hold_lock() -> None:
        connection = await asyncpg.connect(local_stack.env["DATABASE_URL"])
        try:
            async with connection.transaction():
                await connection.execute(f'LOCK TABLE "{schema}"."person" IN SHARE MODE')
                locked.set()
                await asyncio.get_running_loop().run_in_executor(None, release.wait, 30)
        finally:
            await connection.close()

    holder = threading.Thread(target=asyncio.run, args=(hold_lock(),))
    holder.start()
    try:
        assert locked.wait(30)
        for tag in tags:
            with pytest.raises(httpx.TimeoutException):
                api.http.post(
                    "/rest/people",
                    json={"firstName": tag},
                    headers={**api.headers, HEADER: keys[tag]},
                    timeout=0.5,
                )
    finally:
        release.set()
        holder.join(30)
    deadline = time.monotonic() + 30
    while any(len(_named(api, tag)) != 1 for tag in tags):
        assert time.monotonic() < deadline, "the writes the client gave up on did not commit"
        time.sleep(0.5)
    first = {tag: _named(api, tag)[0]["id"] for tag in tags}
    for tag in tags:
        retried = _post(api, "/rest/people", keys[tag], {"firstName": tag})
        assert retried.status_code == 201, retried.text
        assert retried.json()["data"]["id"] == first[tag]
        assert [r["id"] for r in _named(api, tag)] == [first[tag]]
