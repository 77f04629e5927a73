"""The client's IP address, for per-IP brute-force limits.

The peer address, unless the peer is a trusted proxy (TRUSTED_PROXIES): then the right-most
X-Forwarded-For address that is not itself a trusted proxy (the left part is client-supplied).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from starlette.requests import HTTPConnection

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _trusted(address: str, proxies: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in proxies)


def client_ip(connection: HTTPConnection, proxies: Sequence[Network]) -> str:
    peer = connection.client.host if connection.client else ""
    if not proxies or not _trusted(peer, proxies):
        return peer
    forwarded = [
        part.strip()
        for header in connection.headers.getlist("x-forwarded-for")
        for part in header.split(",")
        if part.strip()
    ]
    for address in reversed(forwarded):
        if not _trusted(address, proxies):
            try:
                return str(ipaddress.ip_address(address))
            except ValueError:
                return peer
    return peer
