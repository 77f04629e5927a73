"""Single-record creates of one caller and object that arrive while its earlier creates are in
PostgreSQL go together in one statement (records.create_groups, CREATE_GROUP_IN_FLIGHT=2 by
default), and each caller still gets exactly the answer it would have had alone: its own record,
its own error, its own trace context on its event, nothing written once it gave up.

The grouping is made certain, not left to timing: the test holds the workspace's lock of event
writes exclusively (the lock `records.events_wanted` takes shared, as a declaration of interest
does), so the first two creates wait inside PostgreSQL and every later one waits in its group.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from threading import Event
from typing import Any

import asyncpg
import grpc
import orjson
import pytest

from crm.records.v1 import records_pb2 as rp
from crmstack.stack import Stack
from tests.integration.events_client import listen, metric, wait_until
from tests.integration.records_client import Workspace, error_of, provision

IN_FLIGHT = 2  # CREATE_GROUP_IN_FLIGHT's default
LOCK = "SELECT pg_advisory_xact_lock(hashtext('records.event_writes'), hashtext($1))"
WAITING = (
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE application_name = 'records' AND wait_event = 'advisory'"
)


@pytest.fixture
def ws(local_stack: Stack) -> Workspace:
    """A workspace somebody listens to, so its creates write events (with their trace)."""
    workspace = provision(local_stack)
    listen(local_stack, workspace.id)
    return workspace


def statements(stack: Stack) -> tuple[float, float]:
    """records_create_statement_rows so far: (statements, records they wrote)."""
    port = stack.instances["records"][0].metrics_port
    count = metric(port, "records_create_statement_rows_count")
    rows = metric(port, "records_create_statement_rows_sum")
    return count or 0.0, rows or 0.0


def _hold(database_url: str, workspace_id: str, held: Event, go: Event) -> None:
    async def hold() -> None:
        connection = await asyncpg.connect(database_url)
        try:
            async with connection.transaction():
                await connection.execute(LOCK, workspace_id)
                held.set()
                await asyncio.get_running_loop().run_in_executor(None, go.wait, 120)
        finally:
            await connection.close()

    asyncio.run(hold())


def _waiting(database_url: str) -> int:
    async def count() -> int:
        connection = await asyncpg.connect(database_url)
        try:
            return int(await connection.fetchval(WAITING))
        finally:
            await connection.close()

    return asyncio.run(count())


@contextmanager
def writes_held(stack: Stack, workspace_id: str) -> Iterator[Callable[[int], None]]:
    """Holds the workspace's lock of event writes until the block ends. Yields a function that
    waits until `n` records connections wait for the lock."""
    database_url = stack.env["DATABASE_URL"]
    held, go = Event(), Event()
    with ThreadPoolExecutor(1) as pool:
        holder = pool.submit(_hold, database_url, workspace_id, held, go)
        try:
            assert held.wait(30), f"the lock was not taken: {holder}"

            def blocked(n: int) -> None:
                wait_until(
                    lambda: _waiting(database_url) >= n, 30, f"{n} creates did not reach the lock"
                )

            yield blocked
        finally:
            go.set()
        holder.result(timeout=30)


def create(
    ws: Workspace, data: dict[str, Any], trace_id: str = "", timeout: float = 60
) -> dict[str, Any]:
    metadata = list(ws.call)
    if trace_id:
        metadata.append(("traceparent", f"00-{trace_id}-{secrets.token_hex(8)}-01"))
    response = ws.records.CreateRecord(
        rp.CreateRecordRequest(ref=rp.ObjectRef(object="person"), data_json=orjson.dumps(data)),
        metadata=metadata,
        timeout=timeout,
    )
    result: dict[str, Any] = orjson.loads(response.record_json)
    return result


def sent_while_held(
    stack: Stack, ws: Workspace, calls: Sequence[Callable[[], dict[str, Any]]]
) -> list[Future[dict[str, Any]]]:
    """`calls` made at once while the workspace's writes are held: the first IN_FLIGHT reach
    PostgreSQL and wait there, the rest wait in their group; then the writes go on."""
    pool = ThreadPoolExecutor(len(calls))
    with writes_held(stack, ws.id) as blocked:
        futures = [pool.submit(call) for call in calls[:IN_FLIGHT]]
        blocked(IN_FLIGHT)
        futures += [pool.submit(call) for call in calls[IN_FLIGHT:]]
        time.sleep(1.0)  # the later calls reach the records service and wait in their group
    pool.shutdown(wait=True)
    return futures


async def _outbox(database_url: str, workspace_id: str) -> dict[str, dict[str, str]]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            "SELECT record_id::text, trace_context::text FROM records.outbox "
            "WHERE workspace_id = $1 AND action = 'created'",
            uuid.UUID(workspace_id),
        )
    finally:
        await connection.close()
    return {row[0]: orjson.loads(row[1]) for row in rows}


def test_creates_that_arrive_together_share_a_statement_and_keep_their_own_answers(
    local_stack: Stack, ws: Workspace
) -> None:
    before = statements(local_stack)
    traces = [secrets.token_hex(16) for _ in range(12)]
    calls = [
        partial(create, ws, {"firstName": f"P{i}", "city": f"C{i}"}, trace)
        for i, trace in enumerate(traces)
    ]
    records = [future.result() for future in sent_while_held(local_stack, ws, calls)]

    assert [(r["firstName"], r["city"]) for r in records] == [
        (f"P{i}", f"C{i}") for i in range(len(traces))
    ]
    assert len({r["id"] for r in records}) == len(records)
    stored = {row["id"]: row for row in ws.list_all("person", page=50)}
    assert {r["id"]: r["firstName"] for r in records} == {
        i: row["firstName"] for i, row in stored.items()
    }
    # Each record's event carries the trace of the request that created it.
    events = asyncio.run(_outbox(local_stack.env["DATABASE_URL"], ws.id))
    assert {r["id"]: events[r["id"]]["traceparent"].split("-")[1] for r in records} == {
        r["id"]: traces[i] for i, r in enumerate(records)
    }
    # The two that reached PostgreSQL first went alone; the ten that waited, together.
    after = statements(local_stack)
    assert after[1] - before[1] == len(records)
    assert after[0] - before[0] == IN_FLIGHT + 1


def test_a_failing_create_in_a_group_fails_alone(local_stack: Stack, ws: Workspace) -> None:
    existing = create(ws, {"firstName": "Taken"})
    twice = str(uuid.uuid4())
    datas: list[dict[str, Any]] = [{"firstName": f"Q{i}"} for i in range(6)]
    datas[IN_FLIGHT + 1] = {"id": existing["id"], "firstName": "Same id as a record"}
    datas[IN_FLIGHT + 2] = {"id": twice, "firstName": "First of two"}
    datas[IN_FLIGHT + 3] = {"id": twice, "firstName": "Second of two"}
    before = statements(local_stack)
    futures = sent_while_held(local_stack, ws, [partial(create, ws, d) for d in datas])

    outcomes: list[Any] = []
    for future in futures:
        try:
            outcomes.append(future.result()["firstName"])
        except grpc.RpcError as exc:
            outcomes.append(exc.code())
    taken, first, second = IN_FLIGHT + 1, IN_FLIGHT + 2, IN_FLIGHT + 3
    assert outcomes[taken] == grpc.StatusCode.ALREADY_EXISTS
    # Of the two with one id, exactly one was written; every other create was.
    pair = [outcomes[first], outcomes[second]]
    written = [o for o in pair if isinstance(o, str)]
    assert len(written) == 1
    assert pair.count(grpc.StatusCode.ALREADY_EXISTS) == 1
    assert ws.get("person", twice)["firstName"] == written[0]
    assert [o for i, o in enumerate(outcomes) if i not in (taken, first, second)] == [
        d["firstName"] for i, d in enumerate(datas) if i not in (taken, first, second)
    ]
    assert ws.get("person", existing["id"])["firstName"] == "Taken"
    # The error is the one a create alone gets.
    with pytest.raises(grpc.RpcError) as alone:
        create(ws, {"id": existing["id"], "firstName": "Alone"})
    grouped = futures[taken].exception()
    assert isinstance(grouped, grpc.RpcError)
    assert repr(error_of(grouped)) == repr(error_of(alone.value))
    assert error_of(grouped).reason == error_of(alone.value).reason
    # The group's statement failed whole, then each of its creates ran alone.
    after = statements(local_stack)
    waited = len(datas) - IN_FLIGHT
    assert after[0] - before[0] == IN_FLIGHT + 1 + waited + 1  # + the create alone above
    assert after[1] - before[1] == IN_FLIGHT + 2 * waited + 1


def test_a_create_given_up_while_waiting_in_its_group_is_not_written(
    local_stack: Stack, ws: Workspace
) -> None:
    gone = str(uuid.uuid4())
    calls = [partial(create, ws, {"firstName": f"R{i}"}) for i in range(IN_FLIGHT)]
    calls.append(partial(create, ws, {"id": gone, "firstName": "Gave up"}, timeout=0.5))
    calls.append(partial(create, ws, {"firstName": "Waited"}))
    futures = sent_while_held(local_stack, ws, calls)

    late = futures[IN_FLIGHT].exception()
    assert isinstance(late, grpc.RpcError)
    assert late.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert [f.result()["firstName"] for i, f in enumerate(futures) if i != IN_FLIGHT] == [
        "R0",
        "R1",
        "Waited",
    ]
    with pytest.raises(grpc.RpcError) as missing:
        ws.get("person", gone)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
