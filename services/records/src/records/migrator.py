"""MigrateSchema: bring a workspace's tables to the desired data model, idempotently.

One transaction under a per-workspace advisory lock: skip a change id already applied, refuse a
version older than the applied one (a delayed or superseded request), plan DDL from the live
catalog, run it, and record the applied schema and change id. Postgres DDL is transactional, so
the tables and the recorded schema always agree.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
from nats.aio.client import Client as NatsClient

from crm.events.v1 import events_pb2
from crm.metadata.v1 import metadata_pb2 as md
from crmkit.errors import FailedPrecondition, InvalidArgument
from crmkit.messaging import schema_applied_subject
from records import ddl, search_ddl
from records.model import WorkspaceModel
from records.sql import workspace_schema_name

log = logging.getLogger("records.migrator")


@dataclass(frozen=True)
class MigrationResult:
    applied_version: int
    already_applied: bool
    statements: list[str]
    model: WorkspaceModel | None


def lock_key(workspace_id: str) -> int:
    digest = hashlib.sha256(f"records-schema:{workspace_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _check_workspace_id(value: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidArgument(
            "schema.workspace_id must be a UUID", field="schema.workspaceId"
        ) from None


async def migrate(pool: Any, change_id: str, schema: md.WorkspaceSchema) -> MigrationResult:
    if not change_id:
        raise InvalidArgument("change_id is required", field="changeId")
    workspace_id = _check_workspace_id(schema.workspace_id)
    try:
        model = WorkspaceModel.from_proto(schema)
    except ValueError as exc:
        raise InvalidArgument(f"invalid schema: {exc}", field="schema") from None
    schema_name = workspace_schema_name(workspace_id)
    async with pool.acquire() as connection, connection.transaction():
        await connection.execute("SET LOCAL statement_timeout = 0")  # DDL may take long
        await connection.execute("SELECT pg_advisory_xact_lock($1)", lock_key(workspace_id))
        seen = await connection.fetchval(
            "SELECT version FROM records.schema_changes WHERE change_id = $1", change_id
        )
        if seen is not None:
            current = await connection.fetchval(
                "SELECT version FROM records.workspace_schemas WHERE workspace_id = $1",
                workspace_id,
            )
            return MigrationResult(int(current or seen), True, [], None)
        current = await connection.fetchval(
            "SELECT version FROM records.workspace_schemas WHERE workspace_id = $1", workspace_id
        )
        if current is not None and schema.version < current:
            raise FailedPrecondition(
                f"schema version {schema.version} is older than the applied {current}",
                field="schema.version",
            )
        try:
            statements = await _plan(connection, schema_name, model)
        except ValueError as exc:
            raise InvalidArgument(f"invalid schema: {exc}", field="schema") from None
        for statement in statements:
            try:
                await connection.execute(statement)
            except asyncpg.UniqueViolationError as exc:
                raise InvalidArgument(
                    "existing records have duplicate values, so the field cannot be unique",
                    field="isUnique",
                ) from exc
        await connection.execute(
            """
            INSERT INTO records.workspace_schemas (workspace_id, version, change_id, schema_proto)
            VALUES ($1, $2, $3, $4)
            ON CONFLICT (workspace_id) DO UPDATE SET version = EXCLUDED.version,
                change_id = EXCLUDED.change_id, schema_proto = EXCLUDED.schema_proto,
                applied_at = now()
            """,
            workspace_id,
            schema.version,
            change_id,
            schema.SerializeToString(deterministic=True),
        )
        await connection.execute(
            "INSERT INTO records.schema_changes (change_id, workspace_id, version, statements) "
            "VALUES ($1, $2, $3, $4)",
            change_id,
            workspace_id,
            schema.version,
            statements,
        )
    if statements:
        log.info(
            "schema migrated",
            extra={"workspace_id": workspace_id, "version": schema.version, "ddl": len(statements)},
        )
    return MigrationResult(schema.version, False, statements, model)


async def _plan(connection: Any, schema_name: str, model: WorkspaceModel) -> list[str]:
    """The tables and per-field indexes (records.ddl), then the search indexes."""
    catalog = await ddl.read_catalog(connection, schema_name)
    statements = ddl.plan(schema_name, catalog, model)
    trigram = await search_ddl.trigram_schema(connection)
    return statements + search_ddl.plan(schema_name, catalog, model, trigram)


async def applied_version(pool: Any, workspace_id: str) -> tuple[int, str]:
    row = await pool.fetchrow(
        "SELECT version, change_id FROM records.workspace_schemas WHERE workspace_id = $1",
        _check_workspace_id(workspace_id),
    )
    if row is None:
        return 0, ""
    return int(row["version"]), str(row["change_id"])


async def replan_all(connection: Any) -> int:
    """Re-plan every workspace's tables from its applied schema, so shapes a newer version plans
    (such as the hash index of unbounded text) reach workspaces no data model change touches;
    run by `python -m records migrate`. Each workspace in its own transaction under its lock; a
    failure is logged and the others go on. Returns the number of workspaces changed."""
    changed = 0
    after = "00000000-0000-0000-0000-000000000000"
    while True:
        rows = await connection.fetch(
            "SELECT workspace_id::text FROM records.workspace_schemas WHERE workspace_id > $1 "
            "ORDER BY workspace_id LIMIT 500",
            uuid.UUID(after),
        )
        for row in rows:
            try:
                changed += int(await _replan(connection, row[0]))
            except (asyncpg.PostgresError, ValueError) as exc:
                log.warning("re-planning failed", extra={"workspace_id": row[0], "error": str(exc)})
        if len(rows) < 500:
            return changed
        after = rows[-1][0]


async def _replan(connection: Any, workspace_id: str) -> bool:
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", lock_key(workspace_id))
        raw = await connection.fetchval(
            "SELECT schema_proto FROM records.workspace_schemas WHERE workspace_id = $1",
            uuid.UUID(workspace_id),
        )
        model = WorkspaceModel.from_proto(md.WorkspaceSchema.FromString(raw))
        schema_name = workspace_schema_name(workspace_id)
        statements = await _plan(connection, schema_name, model)
        for statement in statements:
            await connection.execute(statement)
    if statements:
        log.info("schema re-planned", extra={"workspace_id": workspace_id, "ddl": len(statements)})
    return bool(statements)


async def announce_applied(nats: NatsClient, workspace_id: str, version: int) -> None:
    """Tell metadata's reconciler which workspace changed, so it checks that one, not all."""
    payload = events_pb2.MetadataChanged(workspace_id=workspace_id, version=version)
    try:
        await nats.publish(schema_applied_subject(workspace_id), payload.SerializeToString())
    except Exception:  # best effort: the reconciler's bounded sweep finds what this misses
        log.warning("could not announce the applied schema version", exc_info=True)
