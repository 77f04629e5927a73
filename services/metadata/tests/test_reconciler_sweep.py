"""The reconciler's tick: announced workspaces plus a bounded round-robin sweep, never all."""

from __future__ import annotations

import uuid
from contextlib import asynccontextmanager
from typing import Any

from metadata.reconciler import Reconciler

WORKSPACES = sorted(str(uuid.UUID(int=i + 1)) for i in range(25))


class Workspaces:
    """metadata.workspaces as the sweep reads it (id order, after a watermark, limited)."""

    async def fetch(self, _sql: str, after: str, limit: int) -> list[tuple[str]]:
        return [(w,) for w in WORKSPACES if w > after][:limit]


class Pool:
    @asynccontextmanager
    async def acquire(self) -> Any:
        yield Workspaces()


class CountingReconciler(Reconciler):
    def __init__(self, batch: int) -> None:
        super().__init__(Pool(), None, None, interval=1, batch=batch)  # type: ignore[arg-type]
        self.checked: list[str] = []

    async def reconcile(self, workspace_id: str) -> bool:
        self.checked.append(workspace_id)
        return False


async def test_each_tick_checks_at_most_a_batch_and_the_sweep_goes_round() -> None:
    reconciler = CountingReconciler(batch=10)
    for _ in range(3):
        assert await reconciler.tick() <= 10
    assert reconciler.checked[:25] == WORKSPACES  # 10 + 10 + 5: every workspace once
    await reconciler.tick()
    assert reconciler.checked[25:] == WORKSPACES[:10]  # then from the start again


async def test_announced_workspaces_are_checked_at_the_next_tick_once() -> None:
    reconciler = CountingReconciler(batch=2)
    announced = WORKSPACES[20]
    reconciler.note_applied(announced)
    assert await reconciler.tick() == 3
    assert reconciler.checked == [announced, *WORKSPACES[:2]]
    await reconciler.tick()
    assert reconciler.checked[3:] == WORKSPACES[2:4]  # the announcement was consumed
