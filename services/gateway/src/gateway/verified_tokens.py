"""Access tokens whose signature this process has already verified, with their claims.

Verifying an HS256 JWT (base64, JSON, HMAC, claim checks) is the largest part of authenticating
a request after the Redis round trip; a client sends the same access token for its whole
lifetime. Only the local, immutable part is remembered: a token string maps to the claims its
signature proved, so an identical string proves them again. Expiry is checked on every use with
the same leeway as `decode_jwt`, and revocation is not cached at all: the credential's Redis
entry is still read on every request (see docs/auth.md).
"""

from __future__ import annotations

from collections import OrderedDict

from crmkit.tokens import LEEWAY_SECONDS, Claims

MAX_TOKENS = 10_000  # about 5 MB at most (a token is ~400 bytes)


class VerifiedTokens:
    """A bounded LRU of verified access tokens; one per gateway process."""

    def __init__(self, capacity: int = MAX_TOKENS) -> None:
        self._capacity = capacity
        self._claims: OrderedDict[str, Claims] = OrderedDict()

    def get(self, token: str, now: float) -> Claims | None:
        """The claims of `token` if it was verified here and has not expired."""
        claims = self._claims.get(token)
        if claims is None:
            return None
        if claims.exp <= now - LEEWAY_SECONDS:  # expired: decode_jwt gives the error
            del self._claims[token]
            return None
        self._claims.move_to_end(token)
        return claims

    def put(self, token: str, claims: Claims) -> None:
        self._claims[token] = claims
        self._claims.move_to_end(token)
        while len(self._claims) > self._capacity:
            self._claims.popitem(last=False)

    def __len__(self) -> int:
        return len(self._claims)
