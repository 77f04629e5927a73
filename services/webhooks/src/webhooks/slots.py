"""The attempt slots of one target: WEBHOOK_MAX_CONCURRENCY_PER_TARGET at a time, handed out in
turn to first attempts and to retries, so a stream of fresh deliveries never holds a due retry
back (nor a burst of retries the fresh ones). Within each kind, first come first served."""

from __future__ import annotations

import asyncio
from collections import deque
from enum import Enum


class Kind(Enum):
    FIRST = "first"  # a delivery's first attempt
    RETRY = "retry"  # any later attempt (a retry, or an attempt whose deliverer stopped)


class TargetSlots:
    def __init__(self, size: int) -> None:
        self._free = size
        self._waiting: dict[Kind, deque[asyncio.Future[None]]] = {kind: deque() for kind in Kind}
        self._last = Kind.RETRY  # the kind served last: the other one goes first

    async def acquire(self, kind: Kind) -> None:
        if self._free > 0 and not any(self._waiting.values()):
            self._free -= 1
            self._last = kind
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[kind].append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot as it was cancelled: pass it on
            elif waiter in self._waiting[kind]:
                self._waiting[kind].remove(waiter)
            raise

    def release(self) -> None:
        """Hands the slot to the next waiter, the other kind first, or frees it."""
        other = Kind.FIRST if self._last is Kind.RETRY else Kind.RETRY
        for kind in (other, self._last):
            queue = self._waiting[kind]
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    self._last = kind
                    return
        self._free += 1

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self._waiting.values())
