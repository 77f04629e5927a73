"""The credential cache the gateway reads: one Redis key per credential, written only here.

Invariant: an entry is never older than the last committed change, even with several identity
replicas, and a revocation is visible to every gateway as soon as it answers:
- a change or revocation (`put`, `revoke`) writes its entries while its transaction holds the
  workspace's exclusive advisory lock, before committing; if Redis fails it raises Unavailable, so
  the change is rolled back (503, nothing changed);
- an issue or a cache miss (`fill`) reads Postgres under the shared lock and writes only keys that
  are absent (SET NX), in the background: no transaction waits for Redis. A change cannot commit
  before the fill's transaction ends, and it overwrites what the fill wrote, while a fill landing
  after the change finds the key taken.
While Redis is unreachable (a failure less than `RETRY_SECONDS` ago) neither makes a Redis call:
fills are skipped (the gateway asks identity, which answers from Postgres) and changes fail at
once. The outage is logged once (crmkit.outages) and counted in
`identity_credential_cache_failures_total`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from redis.asyncio import Redis
from redis.exceptions import RedisError

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2
from crmkit.errors import Unavailable
from crmkit.outages import OutageLog
from crmkit.tokens import credential_cache_key
from identity.db_types import Connection

if TYPE_CHECKING:
    import asyncpg
    from prometheus_client import Counter

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


Entries = Mapping[str, identity_pb2.CachedCredential]
RETRY_SECONDS = 1.0


class CredentialCache:
    def __init__(self, redis: Redis, ttl_seconds: int, failures: Counter | None = None) -> None:
        self._redis = redis
        self._ttl = ttl_seconds
        self._failures = failures
        self._outage = OutageLog("redis (credential cache)", log)
        self._failed_at = -RETRY_SECONDS
        self._fills: set[asyncio.Task[None]] = set()

    def _unreachable(self) -> bool:
        return time.monotonic() - self._failed_at < RETRY_SECONDS

    def _failed(self, operation: str, exc: BaseException) -> None:
        self._failed_at = time.monotonic()
        self._outage.failed(exc)
        if self._failures is not None:
            self._failures.labels(operation).inc()

    async def _write(self, entries: Entries, *, only_absent: bool) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            for credential_id, entry in entries.items():
                pipe.set(
                    credential_cache_key(credential_id),
                    entry.SerializeToString(deterministic=True),
                    ex=self._ttl,
                    nx=only_absent,
                )
            await pipe.execute()
        self._outage.recovered()

    async def put(self, entries: Entries) -> None:
        """Write entries of a change or revocation, under the workspace's exclusive lock:
        failure raises Unavailable, to roll the change back."""
        if not entries:
            return
        if self._unreachable():
            if self._failures is not None:
                self._failures.labels("put").inc()
            raise Unavailable("credential store unavailable, nothing was changed")
        try:
            await self._write(entries, only_absent=False)
        except RedisError as exc:
            self._failed("put", exc)
            raise Unavailable("credential store unavailable, nothing was changed") from None

    async def fill(self, entries: Entries) -> None:
        """Write entries after an issue or a miss, where no key is (see the module's doc), in
        the background; failure only costs later misses."""
        if not entries:
            return
        if self._unreachable():
            if self._failures is not None:
                self._failures.labels("fill").inc()
            return
        task = asyncio.create_task(self._fill(dict(entries)))
        self._fills.add(task)
        task.add_done_callback(self._fills.discard)

    async def _fill(self, entries: Entries) -> None:
        try:
            await self._write(entries, only_absent=True)
        except RedisError as exc:
            self._failed("fill", exc)

    async def revoke(self, credential_ids: list[str]) -> None:
        await self.put({credential_id: rejected(REVOKED) for credential_id in credential_ids})
