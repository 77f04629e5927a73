"""asyncpg pools and versioned SQL migrations for each service's own schema.

Each service keeps `NNNN_name.sql` files in its package's `migrations/` folder. `migrate()` applies
the ones not yet recorded in `<schema>.schema_migrations`, each in its own transaction, under a
Postgres advisory lock so several replicas or a Job can run it at once safely.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar

import asyncpg
import orjson
from asyncpg.pool import PoolConnectionProxy
from opentelemetry import trace

from crmkit.errors import InvalidArgument
from crmkit.outages import REMINDER_SECONDS, OutageLog, first_line

log = logging.getLogger("crmkit.db")
_tracer = trace.get_tracer("crmkit.db")
_MAX_QUERY_TEXT = 2048
T = TypeVar("T")

_MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


async def _init_connection(connection: asyncpg.Connection) -> None:
    for type_name in ("json", "jsonb"):
        await connection.set_type_codec(
            type_name,
            encoder=lambda value: orjson.dumps(value).decode(),
            decoder=orjson.loads,
            schema="pg_catalog",
        )


def _query_span(query: str) -> trace.Span | None:
    """A client span for one statement, only inside a traced operation: background loops (relay,
    dispatcher polls) would otherwise start a new trace for every poll. Not made current: a
    statement has no children, and skipping the context switch halves the cost."""
    if not trace.get_current_span().is_recording():
        return None
    words = query.split(None, 1)
    operation = words[0].upper() if words else "SQL"
    return _tracer.start_span(
        operation,
        kind=trace.SpanKind.CLIENT,
        attributes={
            "db.system.name": "postgresql",
            "db.operation.name": operation,
            "db.query.text": query[:_MAX_QUERY_TEXT],  # parameterized: values travel apart
        },
    )


async def _traced(query: str, statement: Coroutine[Any, Any, T]) -> T:
    span = _query_span(query)
    if span is None:
        return await statement
    try:
        return await statement
    except BaseException as exc:
        span.record_exception(exc)
        span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
        raise
    finally:
        span.end()


class TracedConnection(asyncpg.Connection):
    """An asyncpg connection whose statements are spans of the current trace."""

    async def execute(self, query: str, *args: Any, **kwargs: Any) -> Any:
        return await _traced(query, super().execute(query, *args, **kwargs))

    async def executemany(self, command: str, args: Any, **kwargs: Any) -> Any:
        return await _traced(command, super().executemany(command, args, **kwargs))

    async def fetch(self, query: str, *args: Any, **kwargs: Any) -> Any:
        return await _traced(query, super().fetch(query, *args, **kwargs))

    async def fetchrow(self, query: str, *args: Any, **kwargs: Any) -> Any:
        return await _traced(query, super().fetchrow(query, *args, **kwargs))

    async def fetchval(self, query: str, *args: Any, **kwargs: Any) -> Any:
        return await _traced(query, super().fetchval(query, *args, **kwargs))

    async def fetchmany(self, query: str, args: Any, **kwargs: Any) -> Any:
        return await _traced(query, super().fetchmany(query, args, **kwargs))


class PoolFloorRetries(logging.Filter):
    """asyncpg's "Failed to restore the pool connection floor" warning as one line a minute.

    asyncpg logs it with a traceback on every retry of every pool (after 1, 2, 4... s), so an
    outage of a few seconds filled the log; the outage itself is logged by OutageLog.
    """

    FLOOR_MESSAGE = "Failed to restore the pool connection floor"

    def __init__(self, every_seconds: float = REMINDER_SECONDS) -> None:
        super().__init__()
        self._every = every_seconds
        self._last: float | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith(self.FLOOR_MESSAGE):
            return True
        now = time.monotonic()
        if self._last is not None and now - self._last < self._every:
            return False
        self._last = now
        if record.exc_info and record.exc_info[1] is not None:
            record.msg = f"{record.msg} (at most once a minute): {first_line(record.exc_info[1])}"
            record.args = None
        record.exc_info = None
        record.exc_text = None
        return True


_POOL_FLOOR_RETRIES = PoolFloorRetries()


async def _keep_session(connection: asyncpg.Connection) -> None:
    """A pool reset that leaves the session as it is (see create_pool)."""


async def create_pool(
    dsn: str,
    *,
    min_size: int = 2,
    max_size: int = 10,
    application_name: str = "crm",
    statement_cache_size: int = 100,
    max_cacheable_statement_size: int = 15 * 1024,
    session_settings: Mapping[str, str] | None = None,
    reset_session: bool = True,
) -> asyncpg.Pool:
    """A pool whose connections decode json/jsonb with orjson and trace their statements.

    Sessions use UTC and ISO dates, so SQL that renders dates and times as text is stable.
    `statement_cache_size` is asyncpg's per-connection cache of prepared statements, which
    keeps statements of up to `max_cacheable_statement_size` characters (asyncpg's default);
    `session_settings` adds server settings (e.g. synchronous_commit) to every connection.
    `reset_session=False` skips asyncpg's reset query (RESET ALL, UNLISTEN, CLOSE ALL, advisory
    unlock) when a connection goes back to the pool, a round trip per pool call, for callers that
    never change session state; an open transaction is still rolled back.
    """
    logging.getLogger("asyncpg.pool").addFilter(_POOL_FLOOR_RETRIES)  # addFilter skips a known one
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=_init_connection,
        connection_class=TracedConnection,
        statement_cache_size=statement_cache_size,
        max_cacheable_statement_size=max_cacheable_statement_size,
        reset=None if reset_session else _keep_session,
        server_settings={
            "application_name": application_name,
            "timezone": "UTC",
            "datestyle": "ISO, YMD",
            **(session_settings or {}),
        },
    )
    assert pool is not None
    return pool


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations(package: str) -> list[Migration]:
    """The migrations in `<package>/migrations`, ordered by version."""
    found: list[Migration] = []
    folder = resources.files(package).joinpath("migrations")
    if not folder.is_dir():
        return found
    for entry in folder.iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if match is None:
            continue
        found.append(Migration(int(match.group(1)), entry.name, entry.read_text()))
    found.sort(key=lambda migration: migration.version)
    versions = [migration.version for migration in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"duplicate migration versions in {package}: {versions}")
    return found


async def migrate(dsn: str, schema: str, package: str) -> list[str]:
    """Apply pending migrations of `package` to `schema`; return the names applied."""
    if not _IDENTIFIER.match(schema):
        raise ValueError(f"invalid schema name {schema!r}")
    migrations = load_migrations(package)
    connection: Any = await asyncpg.connect(dsn)
    applied: list[str] = []
    try:
        lock_key = int.from_bytes(hashlib.sha256(schema.encode()).digest()[:8], "big", signed=True)
        await connection.execute("SELECT pg_advisory_lock($1)", lock_key)
        try:
            await connection.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            await connection.execute(
                f'CREATE TABLE IF NOT EXISTS "{schema}".schema_migrations ('
                "version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT now())"
            )
            rows = await connection.fetch(
                f'SELECT version, name, checksum FROM "{schema}".schema_migrations'
            )
            done = {row["version"]: row for row in rows}
            for migration in migrations:
                previous = done.get(migration.version)
                if previous is not None:
                    if previous["checksum"] != migration.checksum:
                        raise RuntimeError(
                            f"migration {migration.name} changed after it was applied to {schema}"
                        )
                    continue
                async with connection.transaction():
                    await connection.execute(f'SET LOCAL search_path TO "{schema}", public')
                    await connection.execute(migration.sql)
                    await connection.execute(
                        f'INSERT INTO "{schema}".schema_migrations (version, name, checksum) '
                        "VALUES ($1, $2, $3)",
                        migration.version,
                        migration.name,
                        migration.checksum,
                    )
                applied.append(migration.name)
                log.info("migration applied", extra={"schema": schema, "migration": migration.name})
        finally:
            await connection.execute("SELECT pg_advisory_unlock($1)", lock_key)
    finally:
        await connection.close()
    return applied


# A connection of its own or one acquired from a pool: what a store's functions accept.
Connection = asyncpg.Connection | PoolConnectionProxy

# What a statement raises while PostgreSQL is down, restarting or refusing it. InternalClientError:
# a connection closed under a statement can leave asyncpg's protocol mid-operation ("cannot switch
# to state ..."); a loop that reconnects recovers from it as from the loss itself.
DATABASE_UNAVAILABLE = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
)


def from_database_value_error(exc: asyncpg.exceptions.DataError) -> InvalidArgument:
    """A PostgreSQL data exception (SQLSTATE class 22: a value that cannot be stored or computed,
    such as a NUL character in text or a sum beyond double precision) as the client's error."""
    if (exc.sqlstate == "22021" and "0x00" in str(exc)) or exc.sqlstate == "22P05":
        return InvalidArgument("text values must not contain the NUL character (\\u0000)")
    # Never the driver's text: it quotes SQL, parameters and values (docs/api.md, "Errors").
    return InvalidArgument(_DATA_ERRORS.get(exc.sqlstate or "", "a value cannot be stored"))


_DATA_ERRORS = {
    "22003": "a number is out of range",
    "22008": "a date or time is out of range",
    "22P02": "a value is not in the form its field takes",
}


async def retry_while_unavailable(
    attempt: Callable[[], Awaitable[T]], failure: str, logger: logging.Logger
) -> T:
    """`attempt()`, again every second while the database fails it: work that must not be
    dropped (an unacknowledged event, an outcome under a lease) waits out a PostgreSQL restart.
    `failure` names it in the warning, logged once per outage (crmkit.outages)."""
    outage = OutageLog(f"database ({failure}, retrying)", logger)
    while True:
        try:
            result = await attempt()
        except DATABASE_UNAVAILABLE as exc:
            outage.failed(exc)
            await asyncio.sleep(1)
        else:
            outage.recovered()
            return result


async def update_workspace_row(
    connection: Connection,
    table: str,
    returning: str,
    row_id: str,
    workspace_id: str,
    changes: Mapping[str, Any],
) -> asyncpg.Record | None:
    """Apply `changes` (column -> value; columns chosen by the caller, never by input) to the
    row `row_id` of `table` in `workspace_id`, stamp `updated_at`, and answer `returning`."""
    assignments = [f"{column} = ${index}" for index, column in enumerate(changes, start=3)]
    assignments.append("updated_at = clock_timestamp()")
    row: asyncpg.Record | None = await connection.fetchrow(
        f"UPDATE {table} SET {', '.join(assignments)} "
        f"WHERE id = $1 AND workspace_id = $2 RETURNING {returning}",
        row_id,
        workspace_id,
        *changes.values(),
    )
    return row


async def delete_workspace_row(
    pool: asyncpg.Pool, table: str, row_id: str, workspace_id: str
) -> bool:
    """Delete the row `row_id` of `table` in `workspace_id`; False when there was none."""
    status = await pool.execute(
        f"DELETE FROM {table} WHERE id = $1 AND workspace_id = $2", row_id, workspace_id
    )
    return bool(status == "DELETE 1")


async def ping(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as connection:
        await connection.fetchval("SELECT 1")
