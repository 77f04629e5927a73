"""Write-only secrets of a workflow's action: its header values and its secret query parameters.

- Stored: the `url` and `headers` columns hold the action as everyone reads it, secrets as
  `***`; the `secrets` column holds the real URL and headers, sealed (`crmkit.sealing`: AES-GCM,
  key derived from APP_SECRET, the workflow id as associated data).
- Read (every read path, every role): header values as `***` except Content-Type and Accept,
  and the values of secret query parameters (named in `secretParams`, or named like a
  credential) as `***`. An update that leaves `***` in place keeps the stored value.
- Run records: a header value is shown when it is Content-Type or Accept, or when its template
  is variables alone (`{{stage}}`) and neither its name nor its value shape (`Bearer ...`,
  `Basic ...`, long random tokens) says secret; otherwise `***`. Query values are masked by
  parameter name, marking or value shape.
- A masked value kept by an update goes only to the target it was entered for: changing the
  URL's scheme, host or port needs the secrets entered again.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import unquote_plus

import orjson

from crmkit.errors import InvalidArgument
from crmkit.outbound import target_origin
from crmkit.sealing import SecretBox
from workflows.templates import VARIABLE

MASK = "***"
PUBLIC_HEADERS = frozenset({"content-type", "accept"})
_SECRET_NAME_WORDS = ("auth", "token", "secret", "key", "password", "signature", "cookie")
_CREDENTIAL_SCHEME = re.compile(r"^\s*(bearer|basic|token|digest)\s+\S", re.IGNORECASE)
_TOKEN_LIKE = re.compile(r"^[A-Za-z0-9_\-.~+/=]{20,}$")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)


def action_box(app_secret: str) -> SecretBox:
    return SecretBox(
        app_secret,
        "crm-workflow-action",
        unavailable="the workflow's secrets cannot be decrypted (APP_SECRET changed?): "
        "enter its header values and secret parameters again",
    )


def secret_name(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_NAME_WORDS)


def looks_secret(value: str) -> bool:
    """A credential by its shape: an authorization scheme, or a long random-looking token."""
    if _CREDENTIAL_SCHEME.match(value):
        return True
    if _UUID.match(value) or not _TOKEN_LIKE.match(value):
        return False
    return any(char.isdigit() for char in value) and any(char.isalpha() for char in value)


def _query_items(url: str) -> tuple[str, list[tuple[str, str, str]], str]:
    """(before the query, [(raw item, decoded name, raw value)], from the fragment on)."""
    base, hash_, fragment = url.partition("#")
    path, question, query = base.partition("?")
    items: list[tuple[str, str, str]] = []
    if question:
        for item in query.split("&"):
            name, _, value = item.partition("=")
            items.append((item, unquote_plus(name), value))
    return path + question, items, hash_ + fragment


def _is_secret_param(name: str, marked: Iterable[str]) -> bool:
    return name in marked or secret_name(name)


def mask_url(url: str, marked: Iterable[str], *, by_shape: bool = False) -> str:
    marked = list(marked)
    head, items, tail = _query_items(url)
    parts = []
    for item, name, value in items:
        secret = _is_secret_param(name, marked) or (by_shape and looks_secret(unquote_plus(value)))
        parts.append(f"{item.partition('=')[0]}={MASK}" if value and secret else item)
    return head + "&".join(parts) + tail


def mask_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Header values as every reader sees them: all secret but Content-Type and Accept."""
    return {
        name: value if name.lower() in PUBLIC_HEADERS else MASK for name, value in headers.items()
    }


def mask_run_headers(headers: Mapping[str, str], configured: Mapping[str, str]) -> dict[str, str]:
    """Header values as a run records them (`configured`: the action's header templates)."""
    shown: dict[str, str] = {}
    for name, value in headers.items():
        template = configured.get(name)
        # Literal text in a configured value may be the secret itself.
        literal = template is not None and bool(VARIABLE.sub("", template).strip())
        secret = literal or secret_name(name) or looks_secret(value)
        shown[name] = value if name.lower() in PUBLIC_HEADERS or not secret else MASK
    return shown


def keep_stored(
    url: str,
    headers: Mapping[str, str],
    marked: Iterable[str],
    stored_url: str,
    stored_headers: Mapping[str, str],
) -> tuple[str, dict[str, str]]:
    """The action with every `***` the author left in place replaced by the stored value."""
    if (MASK in url or MASK in headers.values()) and _origin(url) != _origin(stored_url):
        raise InvalidArgument(
            f"the target changed: enter the secret values again instead of {MASK}",
            field="action.url",
        )
    stored_by_name = {name.lower(): value for name, value in stored_headers.items()}
    kept: dict[str, str] = {}
    for name, value in headers.items():
        if value == MASK:
            if name.lower() not in stored_by_name:
                raise InvalidArgument(
                    f"header {name}: enter its value ({MASK} keeps a stored value only)",
                    field=f"action.headers.{name}",
                )
            value = stored_by_name[name.lower()]
        kept[name] = value
    _, stored_items, _ = _query_items(stored_url)
    stored_params: dict[str, str] = {}
    for _, name, value in stored_items:
        stored_params.setdefault(name, value)
    head, items, tail = _query_items(url)
    parts = []
    for item, name, value in items:
        if value == MASK:
            if name not in stored_params or not _is_secret_param(name, marked):
                raise InvalidArgument(
                    f"action.url: enter the value of {name} ({MASK} keeps a stored secret only)",
                    field="action.url",
                )
            item = f"{item.partition('=')[0]}={stored_params[name]}"
        parts.append(item)
    return head + "&".join(parts) + tail, kept


def _origin(url: str) -> str:
    return target_origin(VARIABLE.sub("x", url))


def seal(box: SecretBox, workflow_id: str, url: str, headers: Mapping[str, str]) -> bytes:
    return box.seal(workflow_id, orjson.dumps({"url": url, "headers": dict(headers)}).decode())


def unseal(box: SecretBox, workflow_id: str, sealed: bytes) -> tuple[str, dict[str, str]]:
    """The real URL and headers (SecretUnavailable when they no longer open)."""
    opened = orjson.loads(box.open(workflow_id, sealed))
    return str(opened["url"]), dict(opened["headers"])
