"""SQL of the webhook API: configurations, the delivery log and redelivery."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from crm.common.v1 import common_pb2
from crmkit.authors import Author
from crmkit.db import Connection, delete_workspace_row, update_workspace_row
from crmkit.paging import Page, page_info

WEBHOOK_COLUMNS = (
    "id::text, workspace_id::text, target_url, operations, description, is_active, "
    "created_at, updated_at"
)
DELIVERY_COLUMNS = (
    "id::text, webhook_id::text, event_id::text, operation, status, attempts, next_attempt_at, "
    "last_status_code, last_error, redelivery_of::text, created_at, updated_at"
)


# Interest in record events (crmkit.event_interest): whether an active webhook listens to a
# workspace ($1), and the next workspaces ($1: after this id, $2: how many) where one does.
LISTENS = (
    "SELECT EXISTS (SELECT 1 FROM webhooks.webhooks WHERE workspace_id = $1::uuid AND is_active)"
)
LISTENING = (
    "SELECT DISTINCT workspace_id::text FROM webhooks.webhooks WHERE is_active "
    "AND workspace_id > $1::uuid ORDER BY 1 LIMIT $2"
)


# -- webhooks ----------------------------------------------------------------------------------
async def insert_webhook(
    connection: asyncpg.Pool | Connection,
    *,
    webhook_id: str,
    workspace_id: str,
    target_url: str,
    target_origin: str,
    operations: list[str],
    description: str,
    sealed_secret: bytes,
    author: Author,
) -> asyncpg.Record:
    row = await connection.fetchrow(
        "INSERT INTO webhooks.webhooks (id, workspace_id, target_url, target_origin, operations, "
        "description, secret_sealed, author_user_id, author_api_key_id) "
        f"VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING {WEBHOOK_COLUMNS}",
        webhook_id,
        workspace_id,
        target_url,
        target_origin,
        operations,
        description,
        sealed_secret,
        author.user_id,
        author.api_key_id,
    )
    assert row is not None
    return row


async def list_webhooks(
    pool: asyncpg.Pool, workspace_id: str, page: Page
) -> tuple[list[asyncpg.Record], common_pb2.PageInfo]:
    rows = await pool.fetch(
        f"SELECT {WEBHOOK_COLUMNS} FROM webhooks.webhooks w WHERE workspace_id = $1 "
        "AND ($2::uuid IS NULL OR (created_at, id) > (SELECT created_at, id FROM "
        "webhooks.webhooks WHERE id = $2 AND workspace_id = $1)) "
        "ORDER BY created_at, id LIMIT $3",
        workspace_id,
        page.after,
        page.size + 1,
    )
    return page_info(rows, page)


async def get_webhook(
    connection: asyncpg.Pool | Connection, workspace_id: str, webhook_id: str
) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await connection.fetchrow(
        f"SELECT {WEBHOOK_COLUMNS} FROM webhooks.webhooks WHERE id = $1 AND workspace_id = $2",
        webhook_id,
        workspace_id,
    )
    return row


async def update_webhook(
    connection: Connection, workspace_id: str, webhook_id: str, changes: dict[str, Any]
) -> asyncpg.Record | None:
    """Apply `changes` (column -> value; columns chosen by the caller, never by input)."""
    return await update_workspace_row(
        connection, "webhooks.webhooks", WEBHOOK_COLUMNS, webhook_id, workspace_id, changes
    )


async def fail_pending_deliveries(connection: Connection, webhook_id: str, reason: str) -> int:
    status = await connection.execute(
        "UPDATE webhooks.deliveries SET status = 'failed', next_attempt_at = NULL, lease = NULL, "
        "last_error = $2, finished_at = now(), updated_at = clock_timestamp() "
        "WHERE webhook_id = $1 AND status = 'pending'",
        webhook_id,
        reason,
    )
    return int(status.split()[-1])


async def delete_webhook(pool: asyncpg.Pool, workspace_id: str, webhook_id: str) -> bool:
    return await delete_workspace_row(pool, "webhooks.webhooks", webhook_id, workspace_id)


# -- deliveries --------------------------------------------------------------------------------
async def list_deliveries(
    pool: asyncpg.Pool, workspace_id: str, webhook_id: str, status: str | None, page: Page
) -> tuple[list[asyncpg.Record], common_pb2.PageInfo, dict[str, list[asyncpg.Record]]]:
    """A page of a webhook's deliveries, newest first, and every attempt of each (one query)."""
    async with pool.acquire() as connection:
        rows = await connection.fetch(
            f"SELECT {DELIVERY_COLUMNS} FROM webhooks.deliveries WHERE webhook_id = $1 "
            "AND workspace_id = $2 AND ($3::text IS NULL OR status = $3) "
            "AND ($4::uuid IS NULL OR (created_at, id) < (SELECT created_at, id FROM "
            "webhooks.deliveries WHERE id = $4 AND webhook_id = $1)) "
            "ORDER BY created_at DESC, id DESC LIMIT $5",
            webhook_id,
            workspace_id,
            status,
            page.after,
            page.size + 1,
        )
        items, info = page_info(rows, page)
        attempts: dict[str, list[asyncpg.Record]] = {row["id"]: [] for row in items}
        if items:
            for attempt in await connection.fetch(
                "SELECT delivery_id::text, attempt, attempted_at, status_code, latency_ms, error "
                "FROM webhooks.delivery_attempts WHERE delivery_id = ANY($1::uuid[]) "
                "ORDER BY delivery_id, attempt",
                list(attempts),
            ):
                attempts[attempt["delivery_id"]].append(attempt)
    return items, info, attempts


async def redeliver(
    pool: asyncpg.Pool, workspace_id: str, delivery_id: str
) -> tuple[str, asyncpg.Record | None]:
    """A new pending delivery of the same event to the same webhook.

    Returns ("", row) on success, or the reason it cannot be made: "missing" (no such delivery in
    this workspace) or "inactive" (its webhook is inactive).
    """
    async with pool.acquire() as connection:
        original = await connection.fetchrow(
            "SELECT d.webhook_id, d.event_id, d.operation, w.is_active "
            "FROM webhooks.deliveries d JOIN webhooks.webhooks w ON w.id = d.webhook_id "
            "WHERE d.id = $1 AND d.workspace_id = $2",
            delivery_id,
            workspace_id,
        )
        if original is None:
            return "missing", None
        if not original["is_active"]:
            return "inactive", None
        row = await connection.fetchrow(
            "INSERT INTO webhooks.deliveries (id, workspace_id, webhook_id, event_id, operation, "
            "next_attempt_at, redelivery_of) VALUES ($1, $2, $3, $4, $5, now(), $6) "
            f"RETURNING {DELIVERY_COLUMNS}",
            uuid.uuid4(),
            workspace_id,
            original["webhook_id"],
            original["event_id"],
            original["operation"],
            delivery_id,
        )
    return "", row
