"""CoalescedWrites: the writes of one loop step reach the transport as one write, in order."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.coalesced_writes import CoalescedWrites


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False
        self.protocol: Any = None

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def get_extra_info(self, name: str) -> str:
        return f"extra {name}"


def _coalesced() -> tuple[CoalescedWrites, RecordingTransport]:
    transport = RecordingTransport()
    return CoalescedWrites(transport, asyncio.get_running_loop()), transport  # type: ignore[arg-type]


async def test_writes_of_one_step_are_one_write_in_order() -> None:
    writes, transport = _coalesced()
    writes.write(b"HTTP/1.1 200 OK\r\n\r\n")
    writes.write(b"body")
    assert transport.writes == []  # nothing before the step ends
    await asyncio.sleep(0)
    assert transport.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    writes.write(b"next")
    await asyncio.sleep(0)
    assert transport.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody", b"next"]


async def test_close_sends_what_is_pending_first() -> None:
    writes, transport = _coalesced()
    writes.write(b"last words")
    writes.close()
    assert transport.writes == [b"last words"]
    assert transport.closed
    await asyncio.sleep(0)
    assert transport.writes == [b"last words"]  # not sent twice


async def test_abort_drops_what_is_pending() -> None:
    writes, transport = _coalesced()
    writes.write(b"never sent")
    writes.abort()
    await asyncio.sleep(0)
    assert transport.writes == []
    assert transport.aborted


async def test_after_an_upgrade_writes_go_straight_through() -> None:
    writes, transport = _coalesced()
    upgraded = asyncio.Protocol()
    writes.write(b"101 head")
    writes.set_protocol(upgraded)
    assert transport.writes == [b"101 head"]
    assert transport.protocol is upgraded
    writes.write(b"frame")
    assert transport.writes == [b"101 head", b"frame"]


async def test_other_calls_reach_the_transport() -> None:
    writes, _ = _coalesced()
    assert writes.get_extra_info("peername") == "extra peername"
