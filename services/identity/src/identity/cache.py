"""The credential cache the gateway reads: one Redis key per credential, written only here.

Invariant: whoever reads Postgres to write a cache entry does so in a transaction holding the
workspace's advisory lock (shared to issue or resolve, exclusive to change or revoke) and writes
Redis before committing. So an entry is never older than the last committed change, even with
several identity replicas, and a revocation is visible to every gateway as soon as it answers.
A change whose Redis write fails is rolled back (the caller gets 503); a lost Redis only means
misses, which identity answers from Postgres.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from redis.asyncio import Redis
from redis.exceptions import RedisError

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2
from crmkit.errors import Unavailable
from crmkit.tokens import credential_cache_key
from identity.db_types import Connection

if TYPE_CHECKING:
    import asyncpg

log = logging.getLogger("identity.cache")


async def lock_workspace(connection: Connection, workspace_id: str, *, exclusive: bool) -> None:
    """Serialize credential changes of one workspace (until the transaction ends)."""
    function = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
    await connection.execute(
        f"SELECT {function}(hashtextextended($1, 0))", "identity.workspace:" + workspace_id
    )


@asynccontextmanager
async def workspace_change(
    pool: asyncpg.Pool[asyncpg.Record], workspace_id: str
) -> AsyncIterator[Connection]:
    """A transaction holding the workspace's exclusive lock: an admin's credential change."""
    async with pool.acquire() as connection, connection.transaction():
        await lock_workspace(connection, workspace_id, exclusive=True)
        yield connection


def rejected(reason: int) -> identity_pb2.CachedCredential:
    return identity_pb2.CachedCredential(reject_reason=reason)  # type: ignore[arg-type]


REVOKED = common_pb2.ERROR_REASON_TOKEN_REVOKED


class CredentialCache:
    def __init__(self, redis: Redis, ttl_seconds: int) -> None:
        self._redis = redis
        self._ttl = ttl_seconds

    async def put(self, entries: Mapping[str, identity_pb2.CachedCredential]) -> None:
        """Write entries (a change or revocation): failure raises Unavailable, to roll back."""
        if not entries:
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for credential_id, entry in entries.items():
                    pipe.set(
                        credential_cache_key(credential_id),
                        entry.SerializeToString(deterministic=True),
                        ex=self._ttl,
                    )
                await pipe.execute()
        except RedisError as exc:
            log.warning("credential cache write failed", extra={"error": str(exc)})
            raise Unavailable("credential store unavailable, nothing was changed") from None

    async def fill(self, entries: Mapping[str, identity_pb2.CachedCredential]) -> None:
        """Write entries after an issue or a miss: failure only costs later misses."""
        try:
            await self.put(entries)
        except Unavailable:
            log.warning("credential cache not filled; the gateway will ask again")

    async def revoke(self, credential_ids: list[str]) -> None:
        await self.put({credential_id: rejected(REVOKED) for credential_id in credential_ids})
