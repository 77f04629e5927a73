"""The outbound guard: which addresses are refused, resolution checked as a whole, and the
connection opened to the checked address with the host name kept (loopback traffic only)."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator

import aiohttp
import pytest

from crmkit.errors import InvalidArgument
from crmkit.outbound import (
    OutboundPolicy,
    OutboundRefused,
    WorkspaceSessions,
    check_url,
    checked_addresses,
    guarded_session,
    refusal,
    refused_error,
    target_origin,
    validate_http_url,
)

REFUSED = {
    "127.0.0.1": "loopback",
    "127.8.9.10": "loopback",
    "::1": "loopback",
    "10.1.2.3": "private",
    "172.16.0.1": "private",
    "192.168.1.1": "private",
    "fc00::1": "private",
    "fd12:3456::1": "private",
    "169.254.169.254": "cloud metadata",
    "fd00:ec2::254": "cloud metadata",
    "100.100.100.200": "cloud metadata",
    "169.254.1.1": "link-local",
    "fe80::1": "link-local",
    "100.64.0.1": "shared (CGNAT)",
    "100.127.255.254": "shared (CGNAT)",
    "224.0.0.1": "multicast",
    "ff02::1": "multicast",
    "0.0.0.0": "unspecified",
    "::": "unspecified",
    "::ffff:127.0.0.1": "loopback",
    "::ffff:10.0.0.1": "private",
    "::ffff:169.254.169.254": "cloud metadata",
    "2002:7f00:1::": "loopback",  # 6to4 of 127.0.0.1
    "64:ff9b::a00:1": "private",  # NAT64 of 10.0.0.1
    "240.0.0.1": "reserved",
    "255.255.255.255": "reserved",
    "198.18.0.1": "private",  # benchmarking range, not routable
}
PUBLIC = ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "2001:4860:4860::8888"]


@pytest.mark.parametrize(("address", "reason"), sorted(REFUSED.items()))
def test_non_public_addresses_are_refused_with_their_kind(address: str, reason: str) -> None:
    assert refusal(ipaddress.ip_address(address)) == reason


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_pass(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


def resolving(answers: dict[str, list[list[str]]]) -> OutboundPolicy:
    """A policy whose resolver answers from `answers` (one list per successive lookup)."""
    calls: dict[str, int] = {}

    async def resolve(host: str, port: int) -> list[str]:
        index = calls.get(host, 0)
        calls[host] = index + 1
        replies = answers[host]
        return replies[min(index, len(replies) - 1)]

    return OutboundPolicy(allow_private=False, resolver=resolve)


async def test_literals_and_names_are_checked() -> None:
    policy = OutboundPolicy()
    with pytest.raises(OutboundRefused, match=r"127\.0\.0\.1 is a loopback address"):
        await check_url("http://127.0.0.1:8080/hook", policy)
    with pytest.raises(OutboundRefused, match=r"\[::1\] is a loopback|::1 is a loopback"):
        await check_url("http://[::1]/hook", policy)
    with pytest.raises(OutboundRefused, match="only http and https"):
        await check_url("ftp://example.com/", policy)
    await check_url("https://8.8.8.8/hook", policy)  # checked, never connected to
    named = resolving({"hooks.test": [["93.184.216.34", "10.0.0.7"]], "ok.test": [["1.1.1.1"]]})
    with pytest.raises(OutboundRefused, match=r"hooks.test resolves to 10.0.0.7, which is a priv"):
        await check_url("https://hooks.test/x", named)
    await check_url("https://ok.test/x", named)
    assert await checked_addresses("127.0.0.1", 80, OutboundPolicy(allow_private=True)) == [
        "127.0.0.1"
    ]


async def test_unresolvable_names_are_refused() -> None:
    async def fail(host: str, port: int) -> list[str]:
        raise OSError("Name or service not known")

    with pytest.raises(OutboundRefused, match="cannot be resolved"):
        await check_url("https://nowhere.test/", OutboundPolicy(resolver=fail))


def test_target_origin_names_scheme_host_and_port() -> None:
    assert target_origin("https://Hooks.Example.com/a?b") == "https://hooks.example.com:443"
    assert target_origin("http://127.0.0.1:8080/x") == "http://127.0.0.1:8080"


@pytest.fixture
async def loopback_server() -> AsyncIterator[tuple[int, list[bytes]]]:
    """A tiny HTTP server on 127.0.0.1 that records each request's head."""
    heads: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        heads.append(head)
        writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield port, heads
    server.close()
    await server.wait_closed()


async def test_connects_to_the_checked_address_and_keeps_the_host_name(
    loopback_server: tuple[int, list[bytes]],
) -> None:
    port, heads = loopback_server

    async def resolve(host: str, port: int) -> list[str]:
        assert host == "hook.test"
        return ["127.0.0.1"]

    allowed = OutboundPolicy(allow_private=True, resolver=resolve)
    async with (
        guarded_session(allowed, user_agent="crm-test") as session,
        session.post(f"http://hook.test:{port}/in", data=b"{}") as response,
    ):
        assert response.status == 204
    assert len(heads) == 1
    assert f"Host: hook.test:{port}".encode() in heads[0]
    assert b"User-Agent: crm-test" in heads[0]


async def refused_by(session: aiohttp.ClientSession, url: str) -> OutboundRefused:
    with pytest.raises(aiohttp.ClientError) as caught:
        async with session.post(url, data=b"{}"):
            pass
    refused = refused_error(caught.value)
    assert refused is not None, repr(caught.value)
    return refused


async def test_a_name_that_rebinds_to_loopback_is_refused_at_connect(
    loopback_server: tuple[int, list[bytes]],
) -> None:
    port, heads = loopback_server
    # First lookup (configuration time) answers a public address, the next ones loopback.
    policy = resolving({"rebind.test": [["93.184.216.34"], ["127.0.0.1"]]})
    await check_url(f"http://rebind.test:{port}/", policy)
    async with guarded_session(policy) as session:
        refused = await refused_by(session, f"http://rebind.test:{port}/")
    assert str(refused) == "rebind.test resolves to 127.0.0.1, which is a loopback address; refused"
    assert heads == []


async def test_literal_addresses_are_refused_by_the_socket_check(
    loopback_server: tuple[int, list[bytes]],
) -> None:
    port, heads = loopback_server
    async with guarded_session(OutboundPolicy()) as session:
        refused = await refused_by(session, f"http://127.0.0.1:{port}/")
        assert str(refused) == "127.0.0.1 is a loopback address; refused"
        refused = await refused_by(session, f"http://[::ffff:127.0.0.1]:{port}/")
        assert "loopback address; refused" in str(refused)
    assert heads == []


async def test_sends_when_private_targets_are_allowed(
    loopback_server: tuple[int, list[bytes]],
) -> None:
    port, heads = loopback_server
    async with (
        guarded_session(OutboundPolicy(allow_private=True)) as session,
        session.post(f"http://127.0.0.1:{port}/", data=b"{}") as response,
    ):
        assert response.status == 204
    assert len(heads) == 1


async def test_each_workspace_has_its_own_sessions_and_idle_ones_are_closed_beyond_the_bound() -> (
    None
):
    sessions = WorkspaceSessions(OutboundPolicy(), max_sessions=2)
    async with sessions.session("a") as a, sessions.session("a") as a_again:
        assert a is a_again
    async with sessions.session("b") as b:
        pass
    async with sessions.session("c") as c:
        assert len({id(a), id(b), id(c)}) == 3
    assert a.closed
    assert not b.closed
    assert not c.closed
    async with sessions.session("b"):
        async with sessions.session("d") as d:
            pass
        assert c.closed
        assert not d.closed
    await sessions.close()
    assert b.closed
    assert d.closed


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1/x",  # an unclosed IPv6 bracket
        "http://exa\uff03mple.com/x",  # NFKC turns the fullwidth sign into a delimiter
        "http://a..b/x",  # an empty label
        f"http://{'a' * 64}.io/",  # a label over 63 characters
    ],
)
def test_urls_that_do_not_parse_are_invalid_arguments_naming_the_field(url: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validate_http_url(url, "targetUrl")
    assert caught.value.field == "targetUrl"


def test_valid_urls_pass_unchanged() -> None:
    for url in ("https://hooks.example.com/x?a=1", "http://[::1]:8080/", "http://exämple.com/"):
        assert validate_http_url(url, "targetUrl") == url
