"""The per-process memory of verified access tokens: bounded, and never past expiry."""

from __future__ import annotations

from crmkit.tokens import LEEWAY_SECONDS, Claims
from gateway.verified_tokens import VerifiedTokens


def _claims(exp: int) -> Claims:
    return Claims(sub="u", workspace_id="w", email="e", iat=0, exp=exp, type="access", jti="g.x")


def test_a_verified_token_is_recognised_until_it_expires() -> None:
    tokens = VerifiedTokens()
    tokens.put("t", _claims(exp=1000))
    assert tokens.get("t", now=999) == _claims(exp=1000)
    assert tokens.get("t", now=1000 + LEEWAY_SECONDS - 1) is not None  # within the leeway
    assert tokens.get("t", now=1000 + LEEWAY_SECONDS) is None  # decode_jwt decides: expired
    assert len(tokens) == 0


def test_only_the_exact_token_string_is_recognised() -> None:
    tokens = VerifiedTokens()
    tokens.put("header.payload.signature", _claims(exp=1000))
    assert tokens.get("header.payload.signaturf", now=0) is None
    assert tokens.get("header.payload.signature ", now=0) is None


def test_the_least_recently_used_token_is_dropped_past_capacity() -> None:
    tokens = VerifiedTokens(capacity=2)
    tokens.put("a", _claims(exp=1000))
    tokens.put("b", _claims(exp=1000))
    assert tokens.get("a", now=0) is not None  # a is now the most recent
    tokens.put("c", _claims(exp=1000))
    assert tokens.get("b", now=0) is None
    assert tokens.get("a", now=0) is not None
    assert len(tokens) == 2
