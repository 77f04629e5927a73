"""The server-rendered login-and-consent page of GET /auth/authorize, and its CSRF token.

The form carries every authorization parameter plus `csrf`: `<nonce>.<expiry>.<mac>`, an HMAC
(key derived from APP_SECRET) over the nonce, the expiry and the parameters. The same nonce is
set in a SameSite=Strict cookie, so a form posted from another site (without the cookie) or with
altered parameters is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping, Sequence
from html import escape
from urllib.parse import urlsplit

from starlette.responses import HTMLResponse

FORM_FIELDS = (
    "client_id",
    "redirect_uri",
    "response_type",
    "scope",
    "state",
    "code_challenge",
    "code_challenge_method",
)
CSRF_COOKIE = "crm_oauth_csrf"
COOKIE_PATH = "/auth/authorize"


def _key(app_secret: str) -> bytes:
    return hashlib.sha256(b"crm-oauth-consent:" + app_secret.encode()).digest()


def _mac(app_secret: str, nonce: str, expiry: int, params: Mapping[str, str]) -> str:
    message = "\n".join([nonce, str(expiry), *(params.get(name, "") for name in FORM_FIELDS)])
    return hmac.new(_key(app_secret), message.encode(), hashlib.sha256).hexdigest()


def new_csrf(app_secret: str, params: Mapping[str, str], lifetime: int) -> tuple[str, str]:
    """(form value, cookie value) for a page showing `params`."""
    nonce = secrets.token_urlsafe(24)
    expiry = int(time.time()) + lifetime
    return f"{nonce}.{expiry}.{_mac(app_secret, nonce, expiry, params)}", nonce


def csrf_valid(app_secret: str, value: str, cookie: str | None, params: Mapping[str, str]) -> bool:
    nonce, _, rest = value.partition(".")
    expiry_text, _, mac = rest.partition(".")
    if not nonce or not cookie or not expiry_text.isdecimal():
        return False
    if int(expiry_text) < time.time():
        return False
    expected = _mac(app_secret, nonce, int(expiry_text), params)
    return hmac.compare_digest(mac, expected) and hmac.compare_digest(nonce, cookie)


_STYLE = """
body{font-family:system-ui,sans-serif;background:#f4f5f7;margin:0;padding:2rem}
main{max-width:26rem;margin:auto;background:#fff;border-radius:8px;padding:1.5rem 2rem;
box-shadow:0 1px 4px rgba(0,0,0,.1)}
h1{font-size:1.25rem}label{display:block;margin:.75rem 0 .25rem}
input[type=email],input[type=password]{width:100%;padding:.5rem;box-sizing:border-box}
.error{color:#b00020}.actions{margin-top:1.25rem;display:flex;gap:.75rem}
button{padding:.5rem 1rem}ul{padding-left:1.25rem}
"""


def security_headers(redirect_uri: str | None = None) -> dict[str, str]:
    form_action = "'self'"
    if redirect_uri:
        parts = urlsplit(redirect_uri)
        form_action += f" {parts.scheme}://{parts.netloc}"
    return {
        "Cache-Control": "no-store",
        "Pragma": "no-cache",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": (
            f"default-src 'none'; style-src 'unsafe-inline'; form-action {form_action}; "
            "frame-ancestors 'none'; base-uri 'none'"
        ),
    }


def _describe(scope: str) -> str:
    if scope == "*":
        return "Everything your role allows, including workspace settings"
    verb, _, target = scope.partition(":")
    what = "all records" if target == "*" else f"{target} records"
    return f"Read {what}" if verb == "read" else f"Create, change and delete {what}"


def consent_page(
    *,
    client_name: str,
    scopes: Sequence[str],
    params: Mapping[str, str],
    csrf: str,
    email: str = "",
    error: str = "",
    status: int = 200,
) -> HTMLResponse:
    hidden = "".join(
        f'<input type="hidden" name="{name}" value="{escape(params.get(name, ""))}">'
        for name in FORM_FIELDS
    )
    items = "".join(f"<li>{escape(_describe(scope))}</li>" for scope in scopes)
    message = f'<p class="error" role="alert">{escape(error)}</p>' if error else ""
    body = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Authorize {escape(client_name)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_STYLE}</style></head>
<body><main>
<h1><strong>{escape(client_name)}</strong> wants to access your CRM workspace</h1>
<p>Sign in to allow it to:</p><ul>{items}</ul>{message}
<form method="post" action="/auth/authorize">{hidden}
<input type="hidden" name="csrf" value="{escape(csrf)}">
<label for="email">Email</label>
<input id="email" name="email" type="email" autocomplete="username" required
 value="{escape(email)}">
<label for="password">Password</label>
<input id="password" name="password" type="password" autocomplete="current-password">
<div class="actions">
<button type="submit" name="decision" value="allow" id="allow">Allow</button>
<button type="submit" name="decision" value="deny" id="deny" formnovalidate>Deny</button>
</div></form></main></body></html>"""
    return HTMLResponse(
        body, status_code=status, headers=security_headers(params.get("redirect_uri"))
    )


def error_page(message: str, status: int = 400) -> HTMLResponse:
    body = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Authorization error</title>
<style>{_STYLE}</style></head><body><main><h1>This authorization request cannot be used</h1>
<p class="error" role="alert">{escape(message)}</p></main></body></html>"""
    return HTMLResponse(body, status_code=status, headers=security_headers())
