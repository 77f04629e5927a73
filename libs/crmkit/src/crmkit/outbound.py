"""Outbound HTTP to user-supplied URLs (webhooks, workflow actions) that cannot reach inside.

A target host is resolved and every address it resolves to is checked: loopback, private,
link-local, shared (CGNAT), multicast, unspecified, reserved and cloud-metadata addresses are
refused (IPv4 and IPv6, including IPv4 embedded in IPv6) unless the operator allows private
targets. The connection is then opened to the address that was checked, inside the HTTP client's
socket factory, so a DNS answer cannot change between the check and the connect (no
rebinding); the URL keeps its host name, so the Host header, TLS SNI and certificate checks use
the name.

Use `check_url` to validate a URL when it is configured, and `guarded_session` (aiohttp) to
send: it checks again at every new connection, in its resolver (names) and its socket factory
(every address it connects to, IP literals included). Services sending for many workspaces use
`WorkspaceSessions`: a kept-alive connection never carries another workspace's request.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from crmkit.errors import InvalidArgument
from crmkit.telemetry import http_client_tracing

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# (host, port) -> the addresses it resolves to, as strings.
Resolver = Callable[[str, int], Awaitable[list[str]]]

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# Instance-metadata endpoints of the usual clouds; most are also link-local or CGNAT, named here
# so the refusal says what they are.
_METADATA = frozenset(
    ipaddress.ip_address(address)
    for address in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, ...
        "169.254.170.2",  # AWS ECS task metadata
        "fd00:ec2::254",  # AWS over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "192.0.0.192",  # Oracle Cloud
    )
)
DEFAULT_PORTS = {"http": 80, "https": 443}


class OutboundRefused(OSError):
    """The target may not be reached; the message says why and is safe to show.

    An OSError, so HTTP clients treat it like any other failure to connect."""


@dataclass(frozen=True)
class OutboundPolicy:
    allow_private: bool = False  # the operator allows loopback/private targets (tests, local runs)
    resolver: Resolver | None = field(default=None, compare=False)


def refusal(address: IPAddress) -> str | None:
    """Why `address` may not be reached from the service, or None when it is a public address."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            reason = refusal(embedded)
            if reason is not None:
                return reason
    if address in _METADATA:
        return "cloud metadata"
    if address.is_loopback:
        return "loopback"
    if address.is_unspecified:
        return "unspecified"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if isinstance(address, ipaddress.IPv4Address) and address in _CGNAT:
        return "shared (CGNAT)"
    if address.is_reserved:
        return "reserved"
    if address.is_private or not address.is_global:
        return "private"
    return None


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    addresses: list[str] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = str(sockaddr[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


async def checked_addresses(host: str, port: int, policy: OutboundPolicy) -> list[str]:
    """The addresses of `host` to connect to, each one checked; OutboundRefused otherwise.

    Every address must pass: a name that resolves to one public and one private address is
    refused, since the client could be steered to either.
    """
    resolver = policy.resolver or system_resolver
    literal = _literal(host)
    if literal is not None:
        addresses = [str(literal)]
    else:
        try:
            addresses = await resolver(host, port)
        except (OSError, UnicodeError) as exc:
            raise OutboundRefused(f"{host} cannot be resolved ({exc})") from None
    if not addresses:
        raise OutboundRefused(f"{host} cannot be resolved")
    if policy.allow_private:
        return addresses
    for address in addresses:
        try:
            parsed = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            raise OutboundRefused(f"{host} resolves to an invalid address") from None
        reason = refusal(parsed)
        if reason is not None:
            shown = host if literal is not None else f"{host} resolves to {parsed}, which"
            raise OutboundRefused(f"{shown} is a {reason} address; refused")
    return addresses


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def validate_http_url(value: str, field: str, *, max_length: int = 2048) -> str:
    """A configured http(s) URL, stripped; InvalidArgument naming `field` when it is not one."""
    url = value.strip()
    if not url:
        raise InvalidArgument(f"{field} is required", field=field)
    if len(url) > max_length:
        raise InvalidArgument(f"{field} must be at most {max_length} characters", field=field)
    if any(ord(char) < 33 or ord(char) == 127 for char in url):
        raise InvalidArgument(f"{field} must not contain spaces or control characters", field=field)
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed IPv6 bracket, characters NFKC turns into delimiters
        raise InvalidArgument(f"{field} is not a valid URL", field=field) from None
    if parts.scheme.lower() not in ("http", "https"):
        raise InvalidArgument(f"{field} must be an http or https URL", field=field)
    if not parts.hostname:
        raise InvalidArgument(f"{field} must name a host", field=field)
    if _literal(parts.hostname) is None:
        try:
            parts.hostname.encode("idna")
        except UnicodeError:  # an empty or over-long label, characters IDNA refuses
            raise InvalidArgument(f"{field} does not name a valid host", field=field) from None
    if parts.username is not None or parts.password is not None:
        raise InvalidArgument(f"{field} must not contain a user name or password", field=field)
    try:
        _ = parts.port
    except ValueError:
        raise InvalidArgument(f"{field} has an invalid port", field=field) from None
    return url


def target_origin(url: str) -> str:
    """`scheme://host:port` of an http(s) URL (the unit of per-target limits)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or DEFAULT_PORTS.get(scheme, 0)
    return f"{scheme}://{(parts.hostname or '').lower()}:{port}"


async def check_url(url: str, policy: OutboundPolicy) -> None:
    """Refuse (OutboundRefused) an http(s) URL whose host may not be reached under `policy`."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        raise OutboundRefused("only http and https URLs with a host can be reached")
    try:
        port = parts.port or DEFAULT_PORTS[scheme]
    except ValueError:
        raise OutboundRefused("the port is not a number from 0 to 65535") from None
    await checked_addresses(parts.hostname, port, policy)


class _CheckingResolver(AbstractResolver):
    """Resolves a host name and refuses it if any address is not allowed (names the host)."""

    def __init__(self, policy: OutboundPolicy) -> None:
        self._policy = policy

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addresses = await checked_addresses(host, port, self._policy)
        results: list[ResolveResult] = []
        for address in addresses:
            parsed = ipaddress.ip_address(address.split("%", 1)[0])
            results.append(
                {
                    "hostname": host,
                    "host": address,
                    "port": port,
                    "family": socket.AF_INET6 if parsed.version == 6 else socket.AF_INET,
                    "proto": socket.IPPROTO_TCP,
                    "flags": socket.AI_NUMERICHOST,
                }
            )
        return results

    async def close(self) -> None:
        return None


def _checking_socket_factory(
    policy: OutboundPolicy,
) -> Callable[[tuple[Any, ...]], socket.socket]:
    """Sockets for the exact address being connected to, refused unless allowed.

    aiohttp calls this with each address right before connecting, IP literals included, so the
    address checked is the address connected to.
    """

    def create(addr_info: tuple[Any, ...]) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        if not policy.allow_private:
            address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            reason = refusal(address)
            if reason is not None:
                raise OutboundRefused(f"{address} is a {reason} address; refused")
        return socket.socket(family=family, type=type_, proto=proto)

    return create


def guarded_session(
    policy: OutboundPolicy,
    *,
    limit: int = 100,
    limit_per_host: int = 0,
    keepalive_timeout: float = 30.0,
    user_agent: str = "crm",
) -> aiohttp.ClientSession:
    """An aiohttp session whose every connection is checked (resolution and socket).

    No proxies from the environment, no cookies kept between requests; a request made inside a
    trace is a client span and carries `traceparent`. Pass
    `allow_redirects=False` when a redirect must not lead elsewhere (webhooks do).
    """
    connector = aiohttp.TCPConnector(
        limit=limit,
        limit_per_host=limit_per_host,
        keepalive_timeout=keepalive_timeout,
        resolver=_CheckingResolver(policy),
        use_dns_cache=False,  # each new connection resolves and checks again
        socket_factory=_checking_socket_factory(policy),
    )
    return aiohttp.ClientSession(
        connector=connector,
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        headers={"User-Agent": user_agent},
        timeout=aiohttp.ClientTimeout(total=None),
        trace_configs=[http_client_tracing()],
    )


class WorkspaceSessions:
    """One `guarded_session` (so one connection pool) per workspace.

    A connection kept alive after one workspace's request is never reused for another's, so
    nothing one workspace sends can be read as part of another's request. Beyond `max_sessions`
    the least recently used idle sessions are closed.
    """

    def __init__(
        self,
        policy: OutboundPolicy,
        *,
        max_sessions: int = 256,
        limit: int = 100,
        keepalive_timeout: float = 30.0,
        user_agent: str = "crm",
    ) -> None:
        self._policy = policy
        self._max_sessions = max_sessions
        self._limit = limit
        self._keepalive_timeout = keepalive_timeout
        self._user_agent = user_agent
        self._sessions: OrderedDict[str, aiohttp.ClientSession] = OrderedDict()
        self._in_use: Counter[str] = Counter()

    @asynccontextmanager
    async def session(self, workspace_id: str) -> AsyncIterator[aiohttp.ClientSession]:
        session = self._sessions.get(workspace_id)
        if session is None:
            session = guarded_session(
                self._policy,
                limit=self._limit,
                keepalive_timeout=self._keepalive_timeout,
                user_agent=self._user_agent,
            )
            self._sessions[workspace_id] = session
        else:
            self._sessions.move_to_end(workspace_id)
        self._in_use[workspace_id] += 1
        try:
            yield session
        finally:
            self._in_use[workspace_id] -= 1
            if self._in_use[workspace_id] <= 0:
                del self._in_use[workspace_id]
            await self._evict()

    async def _evict(self) -> None:
        while len(self._sessions) > self._max_sessions:
            idle = next((key for key in self._sessions if key not in self._in_use), None)
            if idle is None:
                return
            await self._sessions.pop(idle).close()

    async def close(self) -> None:
        while self._sessions:
            _, session = self._sessions.popitem(last=False)
            await session.close()


def refused_error(exc: BaseException) -> OutboundRefused | None:
    """The OutboundRefused behind an HTTP client error, if that is what it was."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OutboundRefused):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None
