"""Password hashing (argon2id), off the event loop, with a dummy hash for unknown accounts."""

from __future__ import annotations

import asyncio
import secrets

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from crmkit.errors import InvalidArgument

MIN_LENGTH = 8
MAX_LENGTH = 256  # argon2 takes any length; the cap keeps one request from costing much more


def check_policy(password: str, field: str = "password") -> None:
    if len(password) < MIN_LENGTH:
        raise InvalidArgument(f"password must have at least {MIN_LENGTH} characters", field=field)
    if len(password) > MAX_LENGTH:
        raise InvalidArgument(f"password must have at most {MAX_LENGTH} characters", field=field)


class Passwords:
    """Hashes and verifies in worker threads (argon2 releases the GIL), a few at a time: each
    argon2id computation holds 64 MiB, so the bound keeps the process's memory bounded."""

    def __init__(self, hasher: PasswordHasher | None = None, concurrency: int = 2) -> None:
        self._hasher = hasher or PasswordHasher()
        self._slots = asyncio.Semaphore(concurrency)
        # Verified when the email is unknown, so that case costs what a wrong password costs.
        self._dummy = self._hasher.hash(secrets.token_urlsafe(16))

    async def hash(self, password: str) -> str:
        async with self._slots:
            return await asyncio.to_thread(self._hasher.hash, password)

    async def verify(self, password_hash: str, password: str) -> bool:
        async with self._slots:
            return await asyncio.to_thread(self._verify, password_hash, password)

    async def burn(self, password: str) -> None:
        """Spend the time of one verification, for an account that does not exist."""
        await self.verify(self._dummy, password)

    def needs_rehash(self, password_hash: str) -> bool:
        return self._hasher.check_needs_rehash(password_hash)

    def _verify(self, password_hash: str, password: str) -> bool:
        try:
            return self._hasher.verify(password_hash, password)
        except (VerificationError, InvalidHashError):
            return False
