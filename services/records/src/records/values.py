"""Field values in, checked and brought to one canonical JSON form per type.

Writes are strict (JSON bodies carry real types); filter operands are lenient, because REST query
parameters arrive as strings ("42", "true", "2026-01-31"). Every failure is an InvalidArgument
naming the field path the caller used (`email`, `[3].email`, `amount.currencyCode`).
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime
from functools import partial
from typing import Any

from crm.metadata.v1 import metadata_pb2 as md
from crmkit.errors import InvalidArgument
from crmkit.jsondepth import MAX_JSON_DEPTH, exceeds_depth
from records.model import FieldModel, type_name

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_CURRENCY_CODE = re.compile(r"^[A-Z]{3}$")
_BIGINT = 2**63
MAX_TEXT = 65_536


def fail(path: str, message: str) -> InvalidArgument:
    return InvalidArgument(f"{path}: {message}", field=path)


def check_text(value: str, path: str) -> str:
    if "\x00" in value:
        raise fail(path, "text cannot contain the NUL character")
    if len(value) > MAX_TEXT:
        raise fail(path, f"text longer than {MAX_TEXT} characters")
    return value


def check_json(value: Any, path: str) -> Any:
    """RAW_JSON: any JSON nested at most MAX_JSON_DEPTH levels, without NUL characters (Postgres
    jsonb refuses them); walked without recursion, so no depth can exhaust the stack."""
    if exceeds_depth(value, MAX_JSON_DEPTH):
        raise fail(path, f"JSON nested more than {MAX_JSON_DEPTH} levels deep")
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            check_text(item, path)
        elif isinstance(item, dict):
            for key in item:
                check_text(key, path)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, float) and not math.isfinite(item):
            raise fail(path, "numbers must be finite")
    return value


def canonical_uuid(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise fail(path, "expected a UUID string")
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise fail(path, f"invalid UUID {value[:64]!r}") from None


def format_timestamp(moment: datetime) -> str:
    """ISO 8601 UTC with milliseconds, e.g. 2026-11-22T10:00:00.000Z (the contract's form)."""
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def parse_timestamp(value: Any, path: str, *, truncate: bool = True) -> str:
    if not isinstance(value, str):
        raise fail(path, "expected an ISO 8601 date-time string")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise fail(path, f"invalid date-time {value[:64]!r}: use ISO 8601") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if not truncate:
        return moment.astimezone(UTC).isoformat()
    return format_timestamp(moment)


def parse_date(value: Any, path: str, *, lenient: bool = False) -> str:
    if not isinstance(value, str):
        raise fail(path, "expected a date string YYYY-MM-DD")
    try:
        return date.fromisoformat(value).isoformat()
    except ValueError:
        pass
    if lenient:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            if moment.tzinfo is not None:
                moment = moment.astimezone(UTC)
            return moment.date().isoformat()
    raise fail(path, f"invalid date {value[:64]!r}: use YYYY-MM-DD")


def parse_number(value: Any, path: str, *, lenient: bool = False) -> float | int:
    if isinstance(value, bool):
        raise fail(path, "expected a number")
    if lenient and isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            raise fail(path, f"expected a number, got {value[:64]!r}") from None
    if isinstance(value, int):
        if abs(value) >= 2**53:
            return float(value)
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise fail(path, "numbers must be finite")
        return value
    raise fail(path, "expected a number")


def parse_bigint(value: Any, path: str, *, lenient: bool = False) -> int:
    if lenient and isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise fail(path, f"expected an integer, got {value[:64]!r}") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(path, "expected an integer")
    if not -_BIGINT <= value < _BIGINT:
        raise fail(path, "integer out of range")
    return value


def parse_boolean(value: Any, path: str, *, lenient: bool = False) -> bool:
    if isinstance(value, bool):
        return value
    if lenient and isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise fail(path, "expected true or false")


def parse_string(value: Any, path: str, *, lenient: bool = False) -> str:
    if isinstance(value, str):
        return check_text(value, path)
    if lenient and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise fail(path, "expected a string")


def parse_option(item: FieldModel, value: Any, path: str) -> str:
    text = parse_string(value, path)
    if text not in item.options:
        allowed = ", ".join(sorted(item.options))
        raise fail(path, f"{text[:64]!r} is not an option of {item.name} ({allowed})")
    return text


def parse_currency(value: Any, path: str) -> tuple[int | None, str | None]:
    if not isinstance(value, dict):
        raise fail(path, 'expected {"amountMicros": integer, "currencyCode": "EUR"}')
    unknown = set(value) - {"amountMicros", "currencyCode"}
    if unknown:
        key = sorted(unknown)[0]
        raise fail(f"{path}.{key}", "unknown currency key; use amountMicros and currencyCode")
    amount = value.get("amountMicros")
    code = value.get("currencyCode")
    if amount is not None:
        amount = parse_bigint(amount, f"{path}.amountMicros")
    if code is not None:
        code = parse_string(code, f"{path}.currencyCode")
        if not _CURRENCY_CODE.match(code):
            raise fail(f"{path}.currencyCode", "expected a three-letter ISO 4217 code, e.g. EUR")
    return amount, code


# A field's write check: (value, path) -> the value in canonical JSON form.
Writer = Callable[[Any, str], Any]


def _parse_email(value: Any, path: str) -> str:
    text = parse_string(value, path)
    if text and not _EMAIL.match(text):
        raise fail(path, f"invalid email address {text[:64]!r}")
    return text


def _parse_options(item: FieldModel, value: Any, path: str) -> list[str]:
    if not isinstance(value, list):
        raise fail(path, "expected an array of option values")
    chosen = [parse_option(item, entry, f"{path}[{i}]") for i, entry in enumerate(value)]
    return list(dict.fromkeys(chosen))


def _not_writable(kind: int, value: Any, path: str) -> Any:
    raise fail(path, f"fields of type {type_name(kind)} cannot be written directly")


def writer(item: FieldModel) -> Writer:
    """The write check of a single-column field, chosen once (an import applies it per row)."""
    kind = item.type
    if kind in (md.FIELD_TYPE_TEXT, md.FIELD_TYPE_PHONE, md.FIELD_TYPE_LINK):
        return parse_string
    if kind == md.FIELD_TYPE_EMAIL:
        return _parse_email
    if kind == md.FIELD_TYPE_NUMBER:
        return parse_number
    if kind == md.FIELD_TYPE_BOOLEAN:
        return parse_boolean
    if kind == md.FIELD_TYPE_DATE:
        return parse_date
    if kind == md.FIELD_TYPE_DATE_TIME:
        return parse_timestamp
    if kind in (md.FIELD_TYPE_UUID, md.FIELD_TYPE_RELATION):
        return canonical_uuid
    if kind == md.FIELD_TYPE_SELECT:
        return partial(parse_option, item)
    if kind == md.FIELD_TYPE_MULTI_SELECT:
        return partial(_parse_options, item)
    if kind == md.FIELD_TYPE_RAW_JSON:
        return check_json
    return partial(_not_writable, kind)


def write_value(item: FieldModel, value: Any, path: str) -> Any:
    """A non-null write value of a single-column field in canonical JSON form."""
    return writer(item)(value, path)


def operand(kind: int, item: FieldModel | None, value: Any, path: str) -> Any:
    """A non-null filter operand for a column of `kind`, in the form its SQL parameter takes."""
    if kind in (md.FIELD_TYPE_TEXT, md.FIELD_TYPE_PHONE, md.FIELD_TYPE_LINK, md.FIELD_TYPE_EMAIL):
        return parse_string(value, path, lenient=True)
    if kind == md.FIELD_TYPE_SELECT or kind == md.FIELD_TYPE_MULTI_SELECT:
        assert item is not None
        return parse_option(item, value, path)
    if kind == md.FIELD_TYPE_NUMBER:
        return float(parse_number(value, path, lenient=True))
    if kind == md.FIELD_TYPE_BOOLEAN:
        return parse_boolean(value, path, lenient=True)
    if kind == md.FIELD_TYPE_DATE:
        return parse_date(value, path, lenient=True)
    if kind == md.FIELD_TYPE_DATE_TIME:
        return parse_timestamp(value, path, truncate=False)
    if kind in (md.FIELD_TYPE_UUID, md.FIELD_TYPE_RELATION):
        return canonical_uuid(value, path)
    if kind == md.FIELD_TYPE_RAW_JSON:
        return check_json(value, path)
    raise fail(path, f"cannot filter on fields of type {type_name(kind)}")
