"""uvicorn's httptools protocol with each event-loop step's writes to a connection sent at once.

uvicorn writes a response's status line and headers, then its body, as two writes: two send
calls and two TCP segments, each of which the kernel also has to take in on the client's side
(on loopback, in the sender's time). Joined (gateway.coalesced_writes), a response of a plain
handler costs the machine 5-15 us less CPU (docs/benchmarks.md, throughput). After an upgrade to
WebSocket (a new protocol on the transport), writes go straight through.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.coalesced_writes import CoalescedWrites


class GatewayHttpProtocol(HttpToolsProtocol):
    """`uvicorn.run(..., http=GatewayHttpProtocol)`: httptools with coalesced writes."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        coalesced: Any = CoalescedWrites(transport, self.loop)
        super().connection_made(coalesced)
