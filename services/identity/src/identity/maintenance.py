"""Periodic clean-up of rows nothing can use any more (expired codes, tokens, old grants)."""

from __future__ import annotations

import asyncio
import logging

import asyncpg

log = logging.getLogger("identity.maintenance")

INTERVAL_SECONDS = 3600.0
# Expired rows are kept a day, so a late replay still meets "expired" rather than "unknown".
_STATEMENTS = (
    "DELETE FROM identity.authorization_codes WHERE expires_at < now() - interval '1 day'",
    "DELETE FROM identity.password_reset_tokens WHERE expires_at < now() - interval '1 day'",
    "DELETE FROM identity.refresh_tokens WHERE expires_at < now() - interval '1 day'",
    "DELETE FROM identity.grants WHERE expires_at < now() - interval '1 day'",
)


class Maintenance:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def run(self) -> None:
        while True:
            await asyncio.sleep(INTERVAL_SECONDS)
            try:
                await self.once()
            except (OSError, asyncpg.PostgresError) as exc:
                log.warning("clean-up failed", extra={"error": str(exc)})

    async def once(self) -> None:
        for statement in _STATEMENTS:
            await self._pool.execute(statement)
