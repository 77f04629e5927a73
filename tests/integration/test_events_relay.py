"""The outbox relay: every change reaches JetStream once per event id with its trace context, in
order per record under concurrent writers; writes go on while NATS is down and their events
flow when it is back; with two records replicas one relays and the other takes over."""

from __future__ import annotations

import asyncio
import itertools
import secrets
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import asyncpg
import grpc
import nats
import orjson
import pytest

from crm.events.v1 import events_pb2
from crm.records.v1 import records_pb2 as rp
from crm.records.v1 import records_pb2_grpc
from crmkit.messaging import (
    RECORD_EVENTS_STREAM,
    RECORD_STREAM_DUPLICATE_WINDOW,
    previous_record_json,
)
from crmstack.ports import free_port, wait_for_port
from crmstack.processes import ManagedProcess
from crmstack.stack import Stack
from records.relay import SESSION_SETTINGS, fetch_sql
from tests.integration.events_client import (
    listen,
    metric,
    read_stream,
    unpublished,
    wait_until,
)
from tests.integration.records_client import Op, Workspace, cond, provision


@pytest.fixture
def ws(local_stack: Stack) -> Workspace:
    """A workspace somebody listens to, so its events are published."""
    workspace = provision(local_stack)
    listen(local_stack, workspace.id)
    return workspace


def update(ws: Workspace, record_id: str, data: dict[str, Any]) -> None:
    ws.records.UpdateRecord(
        rp.UpdateRecordRequest(
            ref=rp.ObjectRef(object="person"), id=record_id, data_json=orjson.dumps(data)
        ),
        metadata=ws.call,
    )


def test_every_change_is_published_with_its_id_subject_and_trace(
    ws: Workspace, local_stack: Stack
) -> None:
    trace_id = secrets.token_hex(16)
    traced = [*ws.call, ("traceparent", f"00-{trace_id}-{secrets.token_hex(8)}-01")]
    person = orjson.loads(
        ws.records.CreateRecord(
            rp.CreateRecordRequest(ref=rp.ObjectRef(object="person"), data_json=b'{"city": "A"}'),
            metadata=traced,
        ).record_json
    )
    update(ws, person["id"], {"city": "B"})
    ref = rp.ObjectRef(object="person")
    ws.records.DeleteRecord(rp.DeleteRecordRequest(ref=ref, id=person["id"]), metadata=ws.call)
    ws.records.RestoreRecord(rp.RestoreRecordRequest(ref=ref, id=person["id"]), metadata=ws.call)

    events = read_stream(local_stack, ws.id, 4)
    assert [e.subject for e in events] == [
        f"crm.records.{ws.id}.person.{action}"
        for action in ("created", "updated", "deleted", "updated")
    ]
    for item in events:
        assert item.headers["Nats-Msg-Id"] == item.event.id
        assert item.event.workspace_id == ws.id
        assert item.event.record_id == person["id"]
        assert item.event.object == "person"
        assert item.event.object_metadata_id == ws.object_id("person")
        assert item.event.actor.kind == 5  # PRINCIPAL_KIND_SYSTEM
        assert item.event.occurred_at.seconds > 0
    created, updated, deleted, restored = (e.event for e in events)
    assert events[0].headers["traceparent"].split("-")[1] == trace_id
    assert created.trace_context["traceparent"].split("-")[1] == trace_id
    assert previous_record_json(created) == b""
    assert orjson.loads(created.record_json)["city"] == "A"
    assert updated.previous_record_json == b""  # the record travels once
    replaced = orjson.loads(updated.previous_values_json)
    assert replaced["city"] == "A"
    assert "id" not in replaced
    assert orjson.loads(previous_record_json(updated))["city"] == "A"
    assert orjson.loads(updated.record_json)["city"] == "B"
    assert list(updated.changed_fields) == ["city"]
    assert orjson.loads(deleted.record_json)["deletedAt"] is not None
    assert restored.cause == events_pb2.CHANGE_CAUSE_RESTORE
    assert orjson.loads(restored.record_json)["deletedAt"] is None
    assert [e.event.sequence for e in events] == sorted(e.event.sequence for e in events)
    assert len({e.event.id for e in events}) == 4
    wait_until(lambda: unpublished(local_stack, ws.id) == 0, 30, "outbox rows not marked")


def test_concurrent_writers_keep_each_records_order(ws: Workspace, local_stack: Stack) -> None:
    people = ws.create_many("person", [{"firstName": f"p{i}", "city": "start"} for i in range(4)])
    rounds = 25
    # Updates of one record race each other (8 threads), so commit order is not test order.
    jobs = [(person["id"], f"{person['firstName']}-{step}") for step in range(rounds)
            for person in people]  # fmt: skip
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda job: update(ws, job[0], {"city": job[1]}), jobs))

    total = len(people) * (rounds + 1)
    events = read_stream(local_stack, ws.id, total)
    assert len({e.event.id for e in events}) == total
    for person in people:
        mine = [e.event for e in events if e.event.record_id == person["id"]]
        assert len(mine) == rounds + 1
        assert mine[0].action == events_pb2.RECORD_ACTION_CREATED
        # Stream order is commit order for each record: each event's before is the after of the
        # event before it, and the last one is the record as stored.
        assert [e.sequence for e in mine] == sorted(e.sequence for e in mine)
        for before, after in itertools.pairwise(mine):
            assert orjson.loads(previous_record_json(after)) == orjson.loads(before.record_json)
        assert orjson.loads(mine[-1].record_json) == ws.get("person", person["id"])


def test_writes_succeed_while_nats_is_down_and_events_flow_after(
    ws: Workspace, local_stack: Stack
) -> None:
    port = local_stack.instances["records"][0].metrics_port
    first = ws.create("person", {"firstName": "before"})
    read_stream(local_stack, ws.id, 1)
    local_stack.stop_infra("nats")
    try:
        created = ws.create_many("person", [{"firstName": f"down{i}"} for i in range(50)])
        for person in created[:10]:
            update(ws, person["id"], {"city": "while down"})
        assert unpublished(local_stack, ws.id) == 60
        wait_until(
            lambda: (metric(port, "records_outbox_pending") or 0) >= 60,
            30,
            "pending gauge did not report the waiting rows",
        )
        wait_until(
            lambda: (metric(port, "records_outbox_relay_lag_seconds") or 0) > 0,
            30,
            "lag gauge stayed at 0 while rows waited",
        )
    finally:
        local_stack.start_infra("nats")
    events = read_stream(local_stack, ws.id, 61, timeout=120)
    ids = {e.event.record_id for e in events}
    assert first["id"] in ids
    assert {p["id"] for p in created} <= ids
    assert len({e.event.id for e in events}) == 61
    for person in created[:10]:
        actions = [e.event.action for e in events if e.event.record_id == person["id"]]
        assert actions == [events_pb2.RECORD_ACTION_CREATED, events_pb2.RECORD_ACTION_UPDATED]
    wait_until(lambda: unpublished(local_stack, ws.id) == 0, 60, "outbox rows not marked")
    wait_until(
        lambda: metric(port, "records_outbox_pending") == 0, 30, "pending gauge did not drop"
    )


def test_a_backlog_beyond_the_relays_pipeline_flows_in_order_per_record(
    ws: Workspace, local_stack: Stack
) -> None:
    # 600 records with 4 events each, written while NATS is down: the relay then drains 2,400
    # rows with its default batch (500 read at a time, up to 1,000 in flight), so reads ahead,
    # the in-flight limit and records waiting for their previous event are all exercised.
    people = 600
    local_stack.stop_infra("nats")
    try:
        created = ws.create_many("person", [{"firstName": f"b{i}"} for i in range(people)])
        for step in (1, 2, 3):
            ws.records.UpdateRecords(
                rp.UpdateRecordsRequest(
                    ref=rp.ObjectRef(object="person"),
                    filter=cond(
                        "firstName", Op.FILTER_OPERATOR_IN, [p["firstName"] for p in created]
                    ),
                    data_json=orjson.dumps({"jobTitle": f"round {step}"}),
                ),
                metadata=ws.call,
            )
    finally:
        local_stack.start_infra("nats")
    events = read_stream(local_stack, ws.id, 4 * people, timeout=180)
    assert len({e.event.id for e in events}) == 4 * people
    for person in created:
        mine = [e.event for e in events if e.event.record_id == person["id"]]
        titles = [orjson.loads(e.record_json).get("jobTitle") for e in mine]
        assert titles == [None, "round 1", "round 2", "round 3"], person["id"]
        for before, after in itertools.pairwise(mine):
            assert orjson.loads(previous_record_json(after)) == orjson.loads(before.record_json)
    wait_until(lambda: unpublished(local_stack, ws.id) == 0, 60, "outbox rows not marked")


def test_the_pending_gauge_reports_a_backlog_beyond_the_rows_it_counts(
    ws: Workspace, local_stack: Stack
) -> None:
    """The relay counts waiting rows up to 10,000 and reports a longer backlog by the span of its
    sequences (docs/events.md), so the gauge never reads fewer rows than wait."""
    port = local_stack.instances["records"][0].metrics_port
    waiting = 10_050
    local_stack.stop_infra("nats")
    try:
        for start in range(0, waiting, 1000):
            count = min(1000, waiting - start)
            ws.create_many("person", [{"firstName": f"g{start + i}"} for i in range(count)])
        assert unpublished(local_stack, ws.id) == waiting
        wait_until(
            lambda: (metric(port, "records_outbox_pending") or 0) >= waiting,
            30,
            f"pending gauge did not report the {waiting} waiting rows",
        )
        assert (metric(port, "records_outbox_relay_lag_seconds") or 0) > 0
    finally:
        local_stack.start_infra("nats")
    wait_until(lambda: unpublished(local_stack, ws.id) == 0, 120, "outbox rows not marked")
    wait_until(
        lambda: metric(port, "records_outbox_pending") == 0, 30, "pending gauge did not drop"
    )


def test_the_relay_reads_a_batch_from_the_index_whatever_the_backlog_and_statistics(
    local_stack: Stack,
) -> None:
    """A batch costs its own rows, not the backlog's: read ahead on the relay's connection from
    20,000 waiting rows while the statistics still say the outbox is nearly empty (as just
    after a bulk load), the statement reads the outbox in sequence order and stops after the
    batch and the rows in flight it leaves out. A bitmap scan read and sorted all 20,000."""
    batch, in_flight, waiting = 500, 1000, 20_000

    def outbox_rows_read(node: dict[str, Any]) -> int:
        own = 0
        if node.get("Relation Name") == "outbox" and node.get("Node Type") != "ModifyTable":
            own = int(node["Actual Rows"]) + int(node.get("Rows Removed by Filter", 0))
        return own + sum(outbox_rows_read(child) for child in node.get("Plans", []))

    async def rows_read() -> int:
        connection = await asyncpg.connect(
            local_stack.env["DATABASE_URL"], server_settings=SESSION_SETTINGS
        )
        transaction = connection.transaction()  # rolled back: the stack's relay sees nothing
        await transaction.start()
        try:
            await connection.execute("ANALYZE records.outbox")
            await connection.execute(
                "INSERT INTO records.outbox (event_id, workspace_id, object, object_metadata_id, "
                "record_id, action, cause, record, actor_kind) "
                "SELECT gen_random_uuid(), gen_random_uuid(), 'person', gen_random_uuid(), "
                "gen_random_uuid(), 'created', 'write', '{}', 'user' FROM generate_series(1, $1)",
                waiting,
            )
            read = await connection.fetch(fetch_sql(gated=False, ahead=False), in_flight)
            assert len(read) == in_flight
            plan = await connection.fetchval(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + fetch_sql(gated=True, ahead=True),
                batch,
                [row["sequence"] for row in read],
            )
            return outbox_rows_read(orjson.loads(plan)[0]["Plan"])
        finally:
            await transaction.rollback()
            await connection.close()

    assert asyncio.run(rows_read()) <= batch + in_flight + 100


def test_the_stream_forgets_event_ids_after_the_configured_duplicate_window(
    ws: Workspace, local_stack: Stack
) -> None:
    """The relay brings the stream to RECORD_STREAM_DUPLICATE_WINDOW (30 s by default): a copy
    published again after a takeover is dropped by JetStream inside it, by consumers beyond."""
    ws.records.CreateRecord(
        rp.CreateRecordRequest(ref=rp.ObjectRef(object="person"), data_json=b"{}"),
        metadata=ws.call,
    )
    read_stream(local_stack, ws.id, 1)  # published: the relay has applied its stream settings

    async def window() -> float:
        connection = await nats.connect(local_stack.env["NATS_URL"])
        try:
            info = await connection.jetstream().stream_info(RECORD_EVENTS_STREAM)
            return float(info.config.duplicate_window or 0)
        finally:
            await connection.close()

    assert asyncio.run(window()) == RECORD_STREAM_DUPLICATE_WINDOW == 30


def test_one_replica_relays_and_another_takes_over(ws: Workspace, local_stack: Stack) -> None:
    grpc_port, metrics_port = free_port(), free_port()
    extra = ManagedProcess(
        name="records-extra",
        command=[sys.executable, "-m", "records"],
        env={
            **local_stack.env,
            "GRPC_PORT": str(grpc_port),
            "GRPC_HOST": "127.0.0.1",
            "METRICS_PORT": str(metrics_port),
            "METRICS_HOST": "127.0.0.1",
        },
        log_path=local_stack.logs / "records-extra.log",
    )
    extra.start()
    main_port = local_stack.instances["records"][0].metrics_port
    try:
        assert wait_for_port(grpc_port, 60), extra.tail()

        def active() -> list[float]:
            return [metric(main_port, "records_outbox_relay_active") or 0.0,
                    metric(metrics_port, "records_outbox_relay_active") or 0.0]  # fmt: skip

        time.sleep(2)  # the standby retries the lock every second
        assert sorted(active()) == [0.0, 1.0], active()
        ws.create("person", {"firstName": "one"})
        read_stream(local_stack, ws.id, 1)

        main_was_active = active()[0] == 1.0
        if main_was_active:
            local_stack.kill("records")
        else:
            extra.kill()
        try:
            survivor = metrics_port if main_was_active else main_port
            wait_until(
                lambda: metric(survivor, "records_outbox_relay_active") == 1.0,
                30,
                "the standby relay did not take over",
            )
            if main_was_active:
                # Writes go to the surviving replica while the main one is down.
                stub = records_pb2_grpc.RecordsServiceStub(
                    grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
                )
                ws = Workspace(ws.id, ws.schema, ws.metadata, stub, ws.codec, ws.principal)
            ws.create("person", {"firstName": "two"})
            events = read_stream(local_stack, ws.id, 2)
            assert len({e.event.id for e in events}) == 2
        finally:
            if main_was_active:
                local_stack.restart("records")
    finally:
        extra.stop()
