"""Idempotent writes: a write carrying an idempotency key (gRPC metadata set by the gateway from
the `Idempotency-Key` header) runs at most once per workspace, credential and key.

The key's row is claimed (INSERT ... ON CONFLICT) in the write's own transaction and holds the
write's response, so the claim, the write and the stored answer commit or roll back together: a
failed write leaves no key (a corrected retry runs), a crash after the commit leaves the answer
(a retry replays it). A concurrent request with the same key blocks on the row's unique index
until the first commits, then replays its answer. A replay is one SQL statement.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf.message import Message

from crm.common.v1 import common_pb2
from crmkit.db import DATABASE_UNAVAILABLE
from crmkit.errors import FailedPrecondition, Unavailable

log = logging.getLogger(__name__)

# gRPC metadata the gateway sends with a guarded write.
KEY_METADATA = "x-idempotency-key"
HASH_METADATA = "x-idempotency-hash"
HEADER = "Idempotency-Key"

M = TypeVar("M", bound=Message)

_SELECT = (
    "SELECT request_hash, response FROM records.idempotency_keys "
    "WHERE workspace_id = $1 AND credential_id = $2 AND key = $3 AND expires_at > now()"
)
# An expired row not yet pruned is taken over; a live one is a conflict (no row returned).
_CLAIM = (
    "INSERT INTO records.idempotency_keys AS k "
    "(workspace_id, credential_id, key, request_hash, expires_at) "
    "VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5)) "
    "ON CONFLICT (workspace_id, credential_id, key) DO UPDATE "
    "SET request_hash = excluded.request_hash, response = NULL, expires_at = excluded.expires_at "
    "WHERE k.expires_at <= now() RETURNING true"
)
_STORE = (
    "UPDATE records.idempotency_keys SET response = $4 "
    "WHERE workspace_id = $1 AND credential_id = $2 AND key = $3"
)
_PRUNE = (
    "DELETE FROM records.idempotency_keys WHERE ctid IN (SELECT ctid FROM "
    "records.idempotency_keys WHERE expires_at <= now() LIMIT $1 FOR UPDATE SKIP LOCKED)"
)
PRUNE_CHUNK = 500
PRUNE_SECONDS = 60.0


@dataclass(frozen=True)
class Guard:
    workspace_id: str
    credential_id: str
    key: str
    request_hash: bytes


def guard_of(context: Any, principal: common_pb2.Principal, method: str) -> Guard | None:
    """The request's guard, or None when the write carries no idempotency key."""
    found: dict[str, str] = {}
    for name, value in context.invocation_metadata() or ():
        if name in (KEY_METADATA, HASH_METADATA) and isinstance(value, str):
            found[name] = value
    key = found.get(KEY_METADATA)
    if not key:
        return None
    digest = hashlib.sha256(f"{method}\n{found.get(HASH_METADATA, '')}".encode()).digest()
    return Guard(principal.workspace_id, principal.credential_id, key, digest)


def _replay(stored: Any, guard: Guard, response_type: type[M]) -> M:
    if stored["request_hash"] != guard.request_hash:
        raise _reused()
    response = response_type()
    response.ParseFromString(stored["response"])
    return response


def _reused() -> FailedPrecondition:
    return FailedPrecondition(
        f"this {HEADER} was used with a different request",
        field=HEADER,
        reason=common_pb2.ERROR_REASON_IDEMPOTENCY_KEY_REUSED,
    )


async def run(
    pool: Any,
    guard: Guard | None,
    ttl: float,
    response_type: type[M],
    write: Callable[[Any], Awaitable[M]],
) -> M:
    """`write(connection)`, at most once per guard's key; its stored answer on a replay."""
    async with pool.acquire() as connection:
        if guard is None:
            return await write(connection)
        ids = (guard.workspace_id, guard.credential_id, guard.key)
        stored = await connection.fetchrow(_SELECT, *ids)
        if stored is not None:
            return _replay(stored, guard, response_type)
        async with connection.transaction():
            if await connection.fetchval(_CLAIM, *ids, guard.request_hash, ttl):
                response = await write(connection)
                await connection.execute(_STORE, *ids, response.SerializeToString())
                return response
        # A concurrent request with the key committed first: answer what it answered.
        stored = await connection.fetchrow(_SELECT, *ids)
    if stored is None or stored["response"] is None:
        raise Unavailable(f"a request with this {HEADER} is finishing; retry", field=HEADER)
    return _replay(stored, guard, response_type)


async def prune_forever(pool: Any) -> None:
    """Delete expired keys in small batches, every minute (every replica; SKIP LOCKED)."""
    while True:
        try:
            async with pool.acquire() as connection:
                while True:
                    status = await connection.execute(_PRUNE, PRUNE_CHUNK)
                    if int(status.split()[-1]) < PRUNE_CHUNK:
                        break
        except DATABASE_UNAVAILABLE as exc:
            log.warning("idempotency key pruning skipped: %s", exc)
        await asyncio.sleep(PRUNE_SECONDS)
