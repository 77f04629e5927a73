"""Retry schedules of outbound work (webhook deliveries, workflow runs): parsed once, applied
after each failed attempt."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator

MAX_RETRIES = 20
MAX_DELAY_SECONDS = 7 * 24 * 3600


def parse_retry_delays(text: str) -> tuple[float, ...]:
    """`60,300,900` -> (60.0, 300.0, 900.0); an empty string means no retries."""
    delays: list[float] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"{part!r} is not a number of seconds") from None
        if not 0 < value <= MAX_DELAY_SECONDS:
            raise ValueError(f"{part!r}: each delay must be more than 0 and at most 7 days")
        delays.append(value)
    if len(delays) > MAX_RETRIES:
        raise ValueError(f"at most {MAX_RETRIES} retries")
    return tuple(delays)


def _checked_delays(text: str) -> str:
    parse_retry_delays(text)
    return text


# A settings field holding a retry schedule (`60,300,900`), checked when settings load.
RetryDelays = Annotated[str, AfterValidator(_checked_delays)]


def next_step(
    attempt: int, succeeded: bool, delays: tuple[float, ...], *, success: str = "succeeded"
) -> tuple[str, float]:
    """After attempt number `attempt` (1-based): `success`, ("retry", seconds) or "failed"."""
    if succeeded:
        return success, 0.0
    if attempt <= len(delays):
        return "retry", delays[attempt - 1]
    return "failed", 0.0


async def wait_until_due(wake: asyncio.Event, due: datetime | None, longest: float) -> None:
    """Until `wake` is set or the next pending attempt falls `due`, at most `longest` seconds
    (an attempt already due waits for a wake-up: it is held by a lease or a busy target)."""
    timeout = longest
    if due is not None:
        seconds = (due - datetime.now(UTC)).total_seconds()
        if seconds > 0:
            timeout = min(max(seconds, 0.005), timeout)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(wake.wait(), timeout)
