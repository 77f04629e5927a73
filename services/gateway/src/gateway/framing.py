"""Every HTML page the gateway serves refuses to be framed (clickjacking).

The OAuth consent page sets its own, stricter headers (consent.security_headers); the pages
served in development (GraphQL playground, /docs) load their scripts from a CDN, so they only
get `X-Frame-Options: DENY` and a CSP limited to `frame-ancestors 'none'`. A header the page
already sets is kept. Added by gateway.response_headers.ResponseMiddleware.
"""

from __future__ import annotations

from starlette.types import Scope

from gateway.response_headers import Headers

_FRAMING_HEADERS = (
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"frame-ancestors 'none'"),
)


def framing_headers(scope: Scope, headers: Headers) -> Headers:
    """The framing headers an HTML response lacks; none for anything else."""
    present = {name.lower(): value for name, value in headers}
    if not present.get(b"content-type", b"").lower().startswith(b"text/html"):
        return []
    return [(name, value) for name, value in _FRAMING_HEADERS if name not in present]
