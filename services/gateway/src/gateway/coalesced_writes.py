"""A transport whose writes of one event-loop step go out as one write of the real transport.

Each write to a socket is a system call and, for TCP, a segment the kernel takes in again on
the other side (on loopback, in the sender's time). Writes made in one step of the loop (a
response's head and body; the Redis commands of requests that arrived together) are joined and
sent at the end of that step, in order. Closing or aborting the transport sends or drops what
is pending first; `set_protocol` (an upgrade to WebSocket) sends it and passes later writes
straight through.
"""

from __future__ import annotations

import asyncio
from typing import Any


class CoalescedWrites:
    """A transport whose writes of one loop step are joined into one write of the transport."""

    __slots__ = ("_direct", "_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] | None = None
        self._direct = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._direct:
            self._transport.write(data)
        elif self._pending is None:
            self._pending = [bytes(data)]
            self._loop.call_soon(self._flush)
        else:
            self._pending.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def _flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending = None
        self._transport.abort()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._flush()
        self._direct = True
        self._transport.set_protocol(protocol)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
