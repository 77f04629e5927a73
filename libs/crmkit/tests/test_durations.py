from __future__ import annotations

import pytest

from crmkit.durations import parse_duration_seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30m", 1800),
        ("90d", 7_776_000),
        ("1h", 3600),
        ("15s", 15),
        ("3600", 3600),
        (300, 300),
        ("1w", 604_800),
        (" 5m ", 300),
        ("1.5h", 5400),
    ],
)
def test_usual_forms(text: str | int, seconds: int) -> None:
    assert parse_duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "10y", "-5m", "0", "m30", True])
def test_rejects_anything_else(text: str | bool) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration_seconds(text)
