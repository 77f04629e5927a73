"""The delivery signature: `X-Service-Signature: sha256=<hex HMAC-SHA256 of "<ts>.<body>">`."""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_HEADER = "X-Service-Signature"
TIMESTAMP_HEADER = "X-Service-Timestamp"


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The header value for `body` sent at `timestamp` (Unix seconds), keyed by the secret."""
    message = str(timestamp).encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
