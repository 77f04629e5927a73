"""A target's attempt slots: handed to first attempts and retries in turn."""

from __future__ import annotations

import asyncio

from webhooks.slots import Kind, TargetSlots


async def test_slots_alternate_between_first_attempts_and_retries() -> None:
    slots = TargetSlots(1)
    order: list[str] = []

    async def attempt(kind: Kind, name: str) -> None:
        await slots.acquire(kind)
        order.append(name)
        await asyncio.sleep(0)
        slots.release()

    await slots.acquire(Kind.FIRST)  # busy: everything below queues
    tasks = [asyncio.create_task(attempt(Kind.FIRST, f"f{i}")) for i in range(3)]
    tasks += [asyncio.create_task(attempt(Kind.RETRY, f"r{i}")) for i in range(2)]
    await asyncio.sleep(0)
    assert slots.waiting == 5
    slots.release()
    await asyncio.gather(*tasks)
    # A retry queued behind three first attempts goes next, then they take turns.
    assert order == ["r0", "f0", "r1", "f1", "f2"]
    assert slots.waiting == 0


async def test_a_cancelled_waiter_passes_its_slot_on() -> None:
    slots = TargetSlots(1)
    await slots.acquire(Kind.FIRST)
    cancelled = asyncio.create_task(slots.acquire(Kind.RETRY))
    waiting = asyncio.create_task(slots.acquire(Kind.FIRST))
    await asyncio.sleep(0)
    cancelled.cancel()
    slots.release()
    await asyncio.wait_for(waiting, 1)
    assert cancelled.cancelled()
    slots.release()
    await asyncio.wait_for(slots.acquire(Kind.RETRY), 1)  # the slot was freed, not lost
