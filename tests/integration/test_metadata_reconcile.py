"""Drift between committed definitions and records' tables is repaired by the reconciler.

The drift is produced as a crash would leave it: records ran the DDL of a change (a new field,
under a version taken from metadata's sequence) whose metadata transaction never committed.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from crm.metadata.v1 import metadata_pb2 as md
from crm.records.v1 import records_pb2 as rp
from crmstack.stack import Stack
from tests.integration.conftest import TEST_ENV
from tests.integration.records_client import Workspace, error_of, provision


@pytest.fixture
def ws(stack: Stack | None) -> Workspace:
    if stack is None:
        pytest.skip("calls services over gRPC: needs the local launcher")
    return provision(stack)


def burn_version(stack: Stack) -> int:
    """A version number handed out to a change that then never committed."""

    async def take() -> int:
        connection = await asyncpg.connect(stack.env["DATABASE_URL"])
        try:
            return int(await connection.fetchval("SELECT nextval('metadata.version_seq')"))
        finally:
            await connection.close()

    return asyncio.run(take())


def committed(ws: Workspace) -> md.WorkspaceSchema:
    schema: md.WorkspaceSchema = ws.metadata.GetWorkspaceSchema(
        md.GetWorkspaceSchemaRequest(), metadata=ws.call
    )
    return schema


def applied_version(ws: Workspace) -> int:
    response = ws.records.GetSchemaVersion(rp.GetSchemaVersionRequest(), metadata=ws.call)
    return int(response.applied_version)


def make_drift(ws: Workspace, stack: Stack) -> int:
    """Apply, in records only, the committed schema plus a `ghost` field on person."""
    schema = committed(ws)
    schema.version = burn_version(stack)
    person = next(o for o in schema.objects if o.name_singular == "person")
    person.fields.append(
        md.FieldMetadata(
            id=str(uuid.uuid4()), object_metadata_id=person.id, name="ghost", label="Ghost",
            type=md.FIELD_TYPE_TEXT, is_nullable=True, is_custom=True, is_active=True,
        )
    )  # fmt: skip
    ws.records.MigrateSchema(
        rp.MigrateSchemaRequest(change_id=str(uuid.uuid4()), schema=schema), metadata=ws.call
    )
    ws.create("person", {"firstName": "during drift", "ghost": "boo"})  # records is ahead
    return int(schema.version)


def assert_converged(ws: Workspace) -> None:
    assert applied_version(ws) == committed(ws).version
    with pytest.raises(grpc.RpcError) as caught:
        ws.create("person", {"ghost": "boo"})
    assert error_of(caught.value).field == "ghost"


def test_reconcile_rpc_repairs_drift(ws: Workspace, stack: Stack) -> None:
    before = committed(ws).version
    ghost_version = make_drift(ws, stack)
    assert applied_version(ws) == ghost_version != before
    result = ws.metadata.Reconcile(md.ReconcileRequest(workspace_id=ws.id), metadata=ws.call)
    assert (result.workspaces_checked, result.workspaces_repaired) == (1, 1)
    assert committed(ws).version > ghost_version
    assert_converged(ws)
    again = ws.metadata.Reconcile(md.ReconcileRequest(workspace_id=ws.id), metadata=ws.call)
    assert again.workspaces_repaired == 0
    # The data model still works after the repair, including a field named like the leftover.
    ws.metadata.CreateField(
        md.CreateFieldRequest(
            object_metadata_id=ws.object_id("person"), name="ghost", type=md.FIELD_TYPE_NUMBER
        ),
        metadata=ws.call,
    )
    assert ws.create("person", {"ghost": 3})["ghost"] == 3


def test_background_reconciler_converges(ws: Workspace, stack: Stack) -> None:
    make_drift(ws, stack)
    deadline = time.monotonic() + 60
    while applied_version(ws) != committed(ws).version:
        assert time.monotonic() < deadline, "the reconciler did not repair the drift in 60 s"
        time.sleep(0.5)
    assert_converged(ws)


def test_migrate_is_idempotent_by_change_id_and_refuses_older_versions(ws: Workspace) -> None:
    schema = committed(ws)
    change_id = str(uuid.uuid4())
    first = ws.records.MigrateSchema(
        rp.MigrateSchemaRequest(change_id=change_id, schema=schema), metadata=ws.call
    )
    assert first.statements == []  # same content as applied: no DDL
    again = ws.records.MigrateSchema(
        rp.MigrateSchemaRequest(change_id=change_id, schema=schema), metadata=ws.call
    )
    assert again.already_applied
    schema.version -= 1
    with pytest.raises(grpc.RpcError) as caught:
        ws.records.MigrateSchema(
            rp.MigrateSchemaRequest(change_id=str(uuid.uuid4()), schema=schema), metadata=ws.call
        )
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def schema_version_calls(stack: Stack) -> float:
    """GetSchemaVersion calls records has answered (the reconciler's per-workspace check)."""
    port = stack.instances["records"][0].metrics_port
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "grpc_server_handled"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels.get("grpc_method") == "GetSchemaVersion"
    )


def test_idle_reconciler_checks_a_bounded_number_of_workspaces(stack: Stack | None) -> None:
    if stack is None:
        pytest.skip("reads the records process's metrics: needs the local launcher")
    batch = int(TEST_ENV["METADATA_RECONCILE_BATCH"])
    interval = float(TEST_ENV["METADATA_RECONCILE_INTERVAL"])
    for _ in range(4 * batch):  # many more workspaces than one tick checks
        provision(stack)
    time.sleep(3 * interval)  # the announcements of the provisioning are handled
    window = 5 * interval
    start = schema_version_calls(stack)
    time.sleep(window)
    checked = schema_version_calls(stack) - start
    ticks = window / interval + 1
    # A full pass per tick would check every workspace (more than 4 * batch) each time.
    assert 0 < checked <= batch * ticks, checked
