"""Type names for asyncpg objects the modules pass around."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy

# A connection inside a transaction, whether taken from the pool or opened directly.
Connection: TypeAlias = "asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]"
# Anything that runs a query: a connection or the pool.
Executor: TypeAlias = "Connection | asyncpg.Pool[asyncpg.Record]"
