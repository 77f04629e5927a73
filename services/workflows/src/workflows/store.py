"""SQL of the workflow API: configurations, status changes and the run log."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import asyncpg

from crm.common.v1 import common_pb2
from crmkit.db import Connection, delete_workspace_row, update_workspace_row
from crmkit.paging import Page, page_info
from crmkit.sealing import SecretBox
from workflows import secrets
from workflows.definitions import ActionSpec, TriggerSpec

WORKFLOW_COLUMNS = (
    "id::text, workspace_id::text, name, status, trigger_type, object, filter, fields, cron, "
    "timezone, method, url, headers, body, next_run_at, last_run_at, created_at, updated_at, "
    "secret_params, secrets"
)
RUN_COLUMNS = (
    "id::text, workflow_id::text, status, is_test, trigger_event, request_method, request_url, "
    "request_headers, request_body, response_status, response_excerpt, duration_ms, attempts, "
    "error, created_at, started_at, finished_at"
)
DEACTIVATED = "workflow deactivated before this run was sent"


def definition_columns(
    trigger: TriggerSpec, action: ActionSpec, workflow_id: str, box: SecretBox
) -> dict[str, Any]:
    """The columns of a definition: the action as it is read (secrets masked), and sealed."""
    return {
        "trigger_type": trigger.type,
        "object": trigger.object,
        "filter": trigger.filter,
        "fields": trigger.fields,
        "cron": trigger.cron,
        "timezone": trigger.timezone,
        "method": action.method,
        "url": secrets.mask_url(action.url, action.secret_params),
        "headers": secrets.mask_headers(action.headers),
        "body": action.body,
        "secret_params": action.secret_params,
        "secrets": secrets.seal(box, workflow_id, action.url, action.headers),
    }


# Interest in record events (crmkit.event_interest): whether an active record-triggered workflow
# listens to a workspace ($1), and the next workspaces ($1: after this id, $2: how many) where one
# does.
_RECORD_TRIGGERED = "status = 'active' AND trigger_type <> 'scheduled'"
LISTENS = (
    "SELECT EXISTS (SELECT 1 FROM workflows.workflows WHERE workspace_id = $1::uuid "
    f"AND {_RECORD_TRIGGERED})"
)
LISTENING = (
    f"SELECT DISTINCT workspace_id::text FROM workflows.workflows WHERE {_RECORD_TRIGGERED} "
    "AND workspace_id > $1::uuid ORDER BY 1 LIMIT $2"
)


def listens(row: asyncpg.Record) -> bool:
    """Whether the workflow of `row` needs record events: active, triggered by records."""
    return bool(row["status"] == "active" and row["trigger_type"] != "scheduled")


async def insert_workflow(
    pool: asyncpg.Pool, workflow_id: str, workspace_id: str, name: str, columns: dict[str, Any]
) -> asyncpg.Record:
    names = ["id", "workspace_id", "name", *columns]
    values = [workflow_id, workspace_id, name, *columns.values()]
    placeholders = ", ".join(f"${index}" for index in range(1, len(values) + 1))
    row = await pool.fetchrow(
        f"INSERT INTO workflows.workflows ({', '.join(names)}) VALUES ({placeholders}) "
        f"RETURNING {WORKFLOW_COLUMNS}",
        *values,
    )
    assert row is not None
    return row


async def get_workflow(
    connection: asyncpg.Pool | Connection,
    workspace_id: str,
    workflow_id: str,
    *,
    lock: bool = False,
) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await connection.fetchrow(
        f"SELECT {WORKFLOW_COLUMNS} FROM workflows.workflows WHERE id = $1 AND workspace_id = $2"
        + (" FOR UPDATE" if lock else ""),
        workflow_id,
        workspace_id,
    )
    return row


async def list_workflows(
    pool: asyncpg.Pool, workspace_id: str, status: str | None, page: Page
) -> tuple[list[asyncpg.Record], common_pb2.PageInfo]:
    rows = await pool.fetch(
        f"SELECT {WORKFLOW_COLUMNS} FROM workflows.workflows WHERE workspace_id = $1 "
        "AND ($2::text IS NULL OR status = $2) "
        "AND ($3::uuid IS NULL OR (created_at, id) > (SELECT created_at, id FROM "
        "workflows.workflows WHERE id = $3 AND workspace_id = $1)) "
        "ORDER BY created_at, id LIMIT $4",
        workspace_id,
        status,
        page.after,
        page.size + 1,
    )
    return page_info(rows, page)


async def update_workflow(
    connection: Connection, workspace_id: str, workflow_id: str, changes: dict[str, Any]
) -> asyncpg.Record | None:
    """Apply `changes` (column -> value; columns chosen by the caller, never by input)."""
    return await update_workspace_row(
        connection, "workflows.workflows", WORKFLOW_COLUMNS, workflow_id, workspace_id, changes
    )


async def seal_saved_before_secrets(pool: asyncpg.Pool, box: SecretBox) -> int:
    """Seal the secrets of workflows saved before they were stored sealed (0002_action_secrets);
    run at start, by every replica (a row is sealed once). Returns how many were sealed."""
    rows = await pool.fetch(
        "SELECT id::text, url, headers, secret_params FROM workflows.workflows "
        "WHERE secrets IS NULL"
    )
    for row in rows:
        headers = row["headers"] or {}
        await pool.execute(
            "UPDATE workflows.workflows SET url = $2, headers = $3, secrets = $4 "
            "WHERE id = $1 AND secrets IS NULL",
            row["id"],
            secrets.mask_url(row["url"], row["secret_params"]),
            secrets.mask_headers(headers),
            secrets.seal(box, row["id"], row["url"], headers),
        )
    return len(rows)


async def fail_queued_runs(connection: Connection, workflow_id: str, reason: str) -> None:
    """Runs waiting for a first or next attempt fail (one being sent now finishes)."""
    await connection.execute(
        "UPDATE workflows.runs SET status = 'failed', next_attempt_at = NULL, error = $2, "
        "finished_at = now(), updated_at = clock_timestamp() "
        "WHERE workflow_id = $1 AND status = 'queued'",
        workflow_id,
        reason,
    )


async def delete_workflow(pool: asyncpg.Pool, workspace_id: str, workflow_id: str) -> bool:
    return await delete_workspace_row(pool, "workflows.workflows", workflow_id, workspace_id)


# -- runs ----------------------------------------------------------------------------------------
async def list_runs(
    pool: asyncpg.Pool, workspace_id: str, workflow_id: str, status: str | None, page: Page
) -> tuple[list[asyncpg.Record], common_pb2.PageInfo]:
    rows = await pool.fetch(
        f"SELECT {RUN_COLUMNS} FROM workflows.runs WHERE workflow_id = $1 AND workspace_id = $2 "
        "AND ($3::text IS NULL OR status = $3) "
        "AND ($4::uuid IS NULL OR (created_at, id) < (SELECT created_at, id FROM "
        "workflows.runs WHERE id = $4 AND workflow_id = $1)) "
        "ORDER BY created_at DESC, id DESC LIMIT $5",
        workflow_id,
        workspace_id,
        status,
        page.after,
        page.size + 1,
    )
    return page_info(rows, page)


async def insert_test_run(
    pool: asyncpg.Pool, workspace_id: str, workflow_id: str, trigger_event: dict[str, Any]
) -> str:
    run_id = str(uuid.uuid4())
    await pool.execute(
        "INSERT INTO workflows.runs (id, workspace_id, workflow_id, status, is_test, "
        "trigger_event, started_at) VALUES ($1, $2, $3, 'running', true, $4, now())",
        run_id,
        workspace_id,
        workflow_id,
        trigger_event,
    )
    return run_id


async def get_run(pool: asyncpg.Pool, run_id: str) -> asyncpg.Record:
    row = await pool.fetchrow(f"SELECT {RUN_COLUMNS} FROM workflows.runs WHERE id = $1", run_id)
    assert row is not None
    return row


async def activate_schedule(
    connection: Connection, workspace_id: str, workflow_id: str, next_run_at: datetime | None
) -> asyncpg.Record | None:
    return await update_workflow(
        connection, workspace_id, workflow_id, {"status": "active", "next_run_at": next_run_at}
    )
