"""Several events of one bulk write in one message: the batch format every consumer reads."""

from __future__ import annotations

import zlib

import pytest

from crmkit.messaging import EVENT_BATCH_HEADER, event_count, event_payloads, pack_events


def test_a_batch_reads_back_and_an_unreadable_one_is_refused() -> None:
    headers = {EVENT_BATCH_HEADER: "2"}
    assert event_payloads(pack_events([b"a", b"bc"]), headers) == [b"a", b"bc"]
    assert event_payloads(b"plain", None) == [b"plain"]
    with pytest.raises(ValueError, match="unreadable"):
        event_payloads(b"not deflated", headers)
    with pytest.raises(ValueError, match="truncated"):
        event_payloads(zlib.compress(b"\x0a\x05ab"), headers)
    with pytest.raises(ValueError, match="unexpected field"):
        event_payloads(zlib.compress(b"\x12\x01a"), headers)
    assert event_count({EVENT_BATCH_HEADER: "2"}) == 2
    assert event_count({EVENT_BATCH_HEADER: "x"}) == event_count(None) == 1
    many = [bytes([n % 256]) * n for n in range(1, 300)]  # lengths past one varint byte
    assert event_payloads(pack_events(many), headers) == many
