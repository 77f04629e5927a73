"""Cron schedules of SCHEDULED workflows: validation and the next tick, in the workflow's zone.

Expressions have five fields (minute hour day-of-month month day-of-week), or six with a leading
seconds field (`*/10 * * * * *`). Ticks are computed in the IANA time zone given (so "daily at
09:00 Europe/Paris" stays at 09:00 across daylight-saving changes) and stored in UTC. The
smallest allowed interval between two ticks is WORKFLOW_MIN_SCHEDULE_INTERVAL.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from crmkit.errors import InvalidArgument

DEFAULT_TIMEZONE = "UTC"
_SAMPLE_TICKS = 6  # ticks inspected to find the smallest interval of an expression


def zone(name: str) -> tzinfo:
    """The time zone named `name` ("" means UTC); InvalidArgument on trigger.timezone."""
    try:
        return ZoneInfo(name or DEFAULT_TIMEZONE)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument(
            f"unknown time zone {name!r}: use an IANA name such as Europe/Paris",
            field="trigger.timezone",
        ) from None


def _iterator(cron: str, start: datetime) -> croniter:
    fields = cron.split()
    if len(fields) not in (5, 6):
        raise InvalidArgument(
            "cron must have 5 fields (minute hour day month weekday) or 6 with leading seconds",
            field="trigger.cron",
        )
    try:
        return croniter(" ".join(fields), start, second_at_beginning=len(fields) == 6)
    except (CroniterError, ValueError, KeyError) as exc:
        raise InvalidArgument(
            f"invalid cron expression {cron!r}: {exc}", field="trigger.cron"
        ) from None


def next_tick(cron: str, timezone: str, after: datetime) -> datetime:
    """The first tick strictly after `after`, in UTC."""
    local = after.astimezone(zone(timezone))
    tick: datetime = _iterator(cron, local).get_next(datetime)
    return tick.astimezone(UTC)


def validate(cron: str, timezone: str, min_interval: float, now: datetime) -> datetime:
    """Check a schedule (InvalidArgument naming trigger.cron or trigger.timezone) and return its
    first tick after `now`."""
    if not cron.strip():
        raise InvalidArgument("cron is required for a SCHEDULED trigger", field="trigger.cron")
    zone(timezone)
    ticks = [next_tick(cron, timezone, now)]
    for _ in range(_SAMPLE_TICKS - 1):
        ticks.append(next_tick(cron, timezone, ticks[-1]))
    smallest = min((b - a).total_seconds() for a, b in itertools.pairwise(ticks))
    if smallest < min_interval:
        raise InvalidArgument(
            f"the schedule fires every {smallest:g} s; the smallest interval allowed is "
            f"{min_interval:g} s",
            field="trigger.cron",
        )
    return ticks[0]
