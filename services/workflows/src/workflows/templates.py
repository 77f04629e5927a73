"""`{{variable}}` templates of the HTTP action, filled from the triggering record.

A variable is a field name (`{{name}}`) or a dotted path (`{{company.name}}`, through a
many-to-one relation, or into a composite value). Each place escapes what it inserts:

- URL: the value is percent-encoded (`/`, `?`, `&`, `#` included), so it stays one component;
  in the path its dots are encoded too (`..` is `%2E%2E`), so it cannot be a dot segment that
  moves the request up the path. The URL is sent exactly as rendered (no normalisation);
- JSON body (Content-Type contains `json`, or no Content-Type and the body starts with `{` or
  `[`): inside a JSON string the value is JSON-escaped (quotes, backslashes, control
  characters); outside a string it becomes a JSON value (`"text"`, `42`, `true`, `null`,
  objects), so `{"amount": {{amount}}}` sends a number;
- form bodies (Content-Type `application/x-www-form-urlencoded`): form-encoded, so a value
  stays one value (`x&role=admin` is `x%26role%3Dadmin`);
- other bodies and header values: the value as text (header values must not contain line
  breaks or other control characters).

A variable whose path is not in the record is an error (TemplateError naming the template); a
path that exists with a null value is empty (`null` as a JSON value).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, quote_plus, urlsplit

import orjson
from yarl import URL

VARIABLE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\s*\}\}")
_OPEN_OR_CLOSE = re.compile(r"\{\{|\}\}")
_MISSING = object()
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# Written by the author in a URL template and kept as written: reserved characters and escapes.
_URL_LITERAL_SAFE = "!#$%&'()*+,/:;=?@[]~"


class TemplateError(Exception):
    """A template that cannot be filled; `field` names it in the API (e.g. `action.body`)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


@dataclass(frozen=True)
class Rendered:
    method: str
    url: str
    headers: dict[str, str]
    body: str


def variables(template: str) -> list[str]:
    """The variable paths a template uses, in order, without repeats."""
    found: list[str] = []
    for match in VARIABLE.finditer(template):
        if match.group(1) not in found:
            found.append(match.group(1))
    return found


def check_syntax(template: str, field: str) -> None:
    """Refuse `{{` or `}}` that do not form a variable (a typo that would be sent as is)."""
    remainder = VARIABLE.sub("", template)
    if _OPEN_OR_CLOSE.search(remainder):
        raise TemplateError(
            "malformed template: use {{fieldName}} or {{relation.fieldName}}", field
        )


def lookup(context: Mapping[str, Any], path: str, field: str) -> Any:
    current: Any = context
    for segment in path.split("."):
        if current is None:
            return None  # an empty relation or value: everything under it is empty
        if not isinstance(current, Mapping):
            raise TemplateError(
                f"variable {{{{{path}}}}}: {segment!r} is not inside a value", field
            )
        current = current.get(segment, _MISSING)
        if current is _MISSING:
            raise TemplateError(f"variable {{{{{path}}}}} is not a field of the record", field)
    return current


def as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def render_text(template: str, context: Mapping[str, Any], field: str) -> str:
    return VARIABLE.sub(lambda m: as_text(lookup(context, m.group(1), field)), template)


def render_url(template: str, context: Mapping[str, Any], field: str) -> str:
    """The URL to send, fully percent-encoded (send it as is: `yarl.URL(url, encoded=True)`)."""
    parts = urlsplit(template)
    authority_end = len(parts.scheme) + 3 + len(parts.netloc)  # variables never reach it
    rendered = [str(URL(template[:authority_end]))]  # an IDN host in its ASCII form
    rest = template[authority_end:]
    in_path = True
    position = 0
    for match in VARIABLE.finditer(rest):
        literal = rest[position : match.start()]
        rendered.append(quote(literal, safe=_URL_LITERAL_SAFE))
        in_path = in_path and "?" not in literal and "#" not in literal
        value = quote(as_text(lookup(context, match.group(1), field)), safe="")
        rendered.append(value.replace(".", "%2E") if in_path else value)
        position = match.end()
    rendered.append(quote(rest[position:], safe=_URL_LITERAL_SAFE))
    return "".join(rendered)


def render_form(template: str, context: Mapping[str, Any], field: str) -> str:
    return VARIABLE.sub(
        lambda m: quote_plus(as_text(lookup(context, m.group(1), field)), safe=""), template
    )


def _segments(template: str) -> Iterator[tuple[str, str | None, bool]]:
    """(literal text, variable path or None, whether the variable sits inside a JSON string)."""
    in_string = False
    escaped = False
    position = 0
    for match in VARIABLE.finditer(template):
        literal = template[position : match.start()]
        for char in literal:
            if escaped:
                escaped = False
            elif char == "\\" and in_string:
                escaped = True
            elif char == '"':
                in_string = not in_string
        yield literal, match.group(1), in_string
        position = match.end()
    yield template[position:], None, in_string


def render_json(template: str, context: Mapping[str, Any], field: str) -> str:
    parts: list[str] = []
    for literal, path, in_string in _segments(template):
        parts.append(literal)
        if path is None:
            continue
        value = lookup(context, path, field)
        if in_string:
            parts.append(orjson.dumps(as_text(value)).decode()[1:-1])
        else:
            parts.append(orjson.dumps(value).decode())
    return "".join(parts)


def check_json_shape(template: str, field: str) -> None:
    """Refuse a JSON body template that is not JSON once its variables are filled."""
    parts: list[str] = []
    for literal, path, in_string in _segments(template):
        parts.append(literal)
        if path is not None:
            parts.append("x" if in_string else "0")
    try:
        orjson.loads("".join(parts))
    except orjson.JSONDecodeError as exc:
        raise TemplateError(f"the body is not valid JSON: {exc}", field) from None


def content_type(headers: Mapping[str, str]) -> str | None:
    for name, value in headers.items():
        if name.lower() == "content-type":
            return value
    return None


def is_json_body(body: str, headers: Mapping[str, str]) -> bool:
    declared = content_type(headers)
    if declared is not None:
        return "json" in declared.lower()
    return body.lstrip().startswith(("{", "["))


def is_form_body(headers: Mapping[str, str]) -> bool:
    declared = content_type(headers) or ""
    return "application/x-www-form-urlencoded" in declared.lower()


def render_request(
    method: str, url: str, headers: Mapping[str, str], body: str, context: Mapping[str, Any]
) -> Rendered:
    """The request to send, every template filled (TemplateError on the first problem)."""
    rendered_headers: dict[str, str] = {}
    for name, value in headers.items():
        text = render_text(value, context, f"action.headers.{name}")
        if _CONTROL.search(text):
            raise TemplateError(
                f"header {name} would contain a line break or another control character",
                f"action.headers.{name}",
            )
        rendered_headers[name] = text
    json_body = is_json_body(body, headers)
    if json_body and content_type(headers) is None:
        rendered_headers["Content-Type"] = "application/json"
    elif body and content_type(headers) is None:
        rendered_headers["Content-Type"] = "text/plain; charset=utf-8"
    if json_body:
        rendered_body = render_json(body, context, "action.body")
    elif is_form_body(headers):
        rendered_body = render_form(body, context, "action.body")
    else:
        rendered_body = render_text(body, context, "action.body")
    return Rendered(method, render_url(url, context, "action.url"), rendered_headers, rendered_body)
