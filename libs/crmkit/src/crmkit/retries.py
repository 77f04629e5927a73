"""Retry schedules of outbound work (webhook deliveries, workflow runs): parsed once, applied
after each failed attempt."""

from __future__ import annotations

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


def next_step(
    attempt: int, succeeded: bool, delays: tuple[float, ...], *, success: str = "succeeded"
) -> tuple[str, float]:
    """After attempt number `attempt` (1-based): `success`, ("retry", seconds) or "failed"."""
    if succeeded:
        return success, 0.0
    if attempt <= len(delays):
        return "retry", delays[attempt - 1]
    return "failed", 0.0
