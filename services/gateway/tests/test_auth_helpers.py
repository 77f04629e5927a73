from __future__ import annotations

import ipaddress

import pytest
from pydantic import ValidationError
from starlette.requests import Request

from crm.common.v1 import common_pb2
from crmkit.errors import Unauthenticated
from gateway.auth.client_ip import client_ip
from gateway.auth.consent import csrf_valid, new_csrf
from gateway.auth.verify import bearer_token
from gateway.settings import GatewaySettings

SECRET = "x" * 40
PARAMS = {"client_id": "c", "redirect_uri": "https://app/cb", "scope": "*", "state": "s"}


def _request(peer: str, forwarded: list[str]) -> Request:
    headers = [(b"x-forwarded-for", value.encode()) for value in forwarded]
    return Request({"type": "http", "client": (peer, 1234), "headers": headers})


def test_bearer_token_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer   abc  ") == "abc"
    with pytest.raises(Unauthenticated) as missing:
        bearer_token(None)
    assert missing.value.reason == common_pb2.ERROR_REASON_TOKEN_MISSING
    for bad in ("Basic abc", "Bearer", "Bearer a b", "Bearer " + "a" * 5000):
        with pytest.raises(Unauthenticated) as invalid:
            bearer_token(bad)
        assert invalid.value.reason == common_pb2.ERROR_REASON_TOKEN_INVALID


def test_client_ip_trusts_only_configured_proxies() -> None:
    proxies = [ipaddress.ip_network("10.0.0.0/8")]
    assert client_ip(_request("203.0.113.9", ["198.51.100.1"]), proxies) == "203.0.113.9"
    assert client_ip(_request("10.1.2.3", ["198.51.100.1"]), proxies) == "198.51.100.1"
    # The right-most address that is not a proxy: the left part is whatever the client sent.
    spoofed = _request("10.1.2.3", ["1.2.3.4, 198.51.100.1, 10.9.9.9"])
    assert client_ip(spoofed, proxies) == "198.51.100.1"
    assert client_ip(_request("10.1.2.3", []), proxies) == "10.1.2.3"
    assert client_ip(_request("10.1.2.3", ["198.51.100.1"]), []) == "10.1.2.3"


def test_consent_csrf_binds_cookie_and_parameters() -> None:
    value, cookie = new_csrf(SECRET, PARAMS, 60)
    assert csrf_valid(SECRET, value, cookie, PARAMS)
    assert not csrf_valid(SECRET, value, None, PARAMS)
    assert not csrf_valid(SECRET, value, "other-cookie", PARAMS)
    assert not csrf_valid(SECRET, value, cookie, {**PARAMS, "redirect_uri": "https://evil/cb"})
    assert not csrf_valid("y" * 40, value, cookie, PARAMS)
    expired, old_cookie = new_csrf(SECRET, PARAMS, -1)
    assert not csrf_valid(SECRET, expired, old_cookie, PARAMS)


def _settings(**env: str) -> GatewaySettings:
    base = {
        "APP_SECRET": SECRET,
        "REDIS_URL": "redis://localhost",
        "NATS_URL": "nats://localhost",
        "IDENTITY_ADDR": "a",
        "METADATA_ADDR": "a",
        "RECORDS_ADDR": "a",
        "WEBHOOKS_ADDR": "a",
        "WORKFLOWS_ADDR": "a",
    }
    return GatewaySettings(**{**base, **env})  # type: ignore[arg-type]


def test_cors_and_proxy_settings_are_validated() -> None:
    settings = _settings(CORS_ORIGINS="https://app.example.com, http://localhost:5173")
    assert settings.cors_origins == ["https://app.example.com", "http://localhost:5173"]
    assert _settings().cors_origins == []
    for bad in ("app.example.com", "https://app.example.com/path", "ftp://x"):
        with pytest.raises(ValidationError, match="CORS_ORIGINS"):
            _settings(CORS_ORIGINS=bad)
    with pytest.raises(ValidationError, match="TRUSTED_PROXIES"):
        _settings(TRUSTED_PROXIES="not-an-ip")
