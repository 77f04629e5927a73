"""Durations written as `30m`, `90d`, `1h`, `15s` or plain seconds."""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")


def parse_duration_seconds(text: str | int | float) -> int:
    """Seconds in a duration; a bare number is seconds. Raises ValueError on anything else."""
    if isinstance(text, bool):
        raise ValueError(f"invalid duration {text!r}")
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        match = _PATTERN.match(text)
        if match is None:
            raise ValueError(f"invalid duration {text!r}: use e.g. 30m, 90d, 1h or seconds")
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {text!r}")
    return max(1, int(seconds))
