"""Unknown email and wrong password cost the same: one argon2 verification each."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, cast

import pytest
from argon2 import PasswordHasher

from crmkit.errors import Unauthenticated
from identity.brute_force import Attempt
from identity.deps import Deps
from identity.login import WRONG_CREDENTIALS, check_password
from identity.passwords import Passwords


class CountingHasher(PasswordHasher):
    def __init__(self) -> None:
        super().__init__(time_cost=1, memory_cost=8, parallelism=1)
        self.verifications = 0

    def verify(self, hash: str | bytes, password: str | bytes) -> Literal[True]:
        self.verifications += 1
        return super().verify(hash, password)


@dataclass
class Rows:
    """Stands in for the pool: the rows a query by email would return."""

    rows: list[dict[str, Any]]

    async def fetch(self, query: str, *args: object) -> list[dict[str, Any]]:
        return self.rows


@dataclass
class Limiter:
    begun: list[list[tuple[str, str]]] = field(default_factory=list)

    async def begin(self, counters: list[tuple[str, str]]) -> Attempt:
        self.begun.append(counters)
        return Attempt(())

    async def succeeded(self, attempt: Attempt) -> None:
        raise AssertionError("no success expected")


@dataclass
class Metrics:
    class _Counter:
        def labels(self, *values: str) -> Metrics._Counter:
            return self

        def inc(self, amount: float = 1) -> None:
            return None

    logins: _Counter = field(default_factory=_Counter)


def _deps(hasher: CountingHasher, rows: list[dict[str, Any]]) -> tuple[Deps, Limiter]:
    limiter = Limiter()
    fake = type("FakeDeps", (), {})()
    fake.passwords = Passwords(hasher)
    fake.pool = Rows(rows)
    fake.limiter = limiter
    fake.metrics = Metrics()
    return cast(Deps, fake), limiter


def _user_row(hasher: PasswordHasher) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "id": uuid.uuid4(),
        "workspace_id": uuid.uuid4(),
        "email": "a@example.com",
        "password_hash": hasher.hash("the right password"),
        "first_name": "",
        "last_name": "",
        "role_id": uuid.uuid4(),
        "created_at": now,
        **{
            f"role_{k}": v
            for k, v in {
                "id": uuid.uuid4(),
                "workspace_id": uuid.uuid4(),
                "name": "Admin",
                "description": "",
                "builtin": "admin",
                "permissions": [],
                "flags": [],
                "created_at": now,
                "updated_at": now,
            }.items()
        },
    }


@pytest.mark.parametrize("known", [True, False])
async def test_one_verification_and_the_same_error(known: bool) -> None:
    hasher = CountingHasher()
    rows = [_user_row(hasher)] if known else []
    deps, limiter = _deps(hasher, rows)
    hasher.verifications = 0
    with pytest.raises(Unauthenticated) as error:
        await check_password(deps, email=" A@Example.com ", password="wrong", client_ip="192.0.2.1")
    assert error.value.message == WRONG_CREDENTIALS
    assert hasher.verifications == 1
    assert limiter.begun == [[("ip", "192.0.2.1"), ("email-ip", "a@example.com 192.0.2.1")]]
