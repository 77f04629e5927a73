"""uvicorn's httptools protocol with each event-loop step's writes to a connection sent at once.

uvicorn writes a response's status line and headers, then its body, as two writes: two send
calls and two TCP segments, each of which the kernel also has to take in on the client's side
(on loopback, in the sender's time). Joined, a response of a plain handler costs the machine
5-15 us less CPU (docs/benchmarks.md, throughput). What is written in one step of the loop is
sent at the end of that step, in order; closing or aborting the connection sends or drops what
is pending first. After an upgrade to WebSocket (a new protocol on the transport), writes go
straight through.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


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


class GatewayHttpProtocol(HttpToolsProtocol):
    """`uvicorn.run(..., http=GatewayHttpProtocol)`: httptools with coalesced writes."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        coalesced: Any = CoalescedWrites(transport, self.loop)
        super().connection_made(coalesced)
