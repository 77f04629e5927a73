"""Scalars shared by every schema the gateway serves, and the Strawberry config that uses them.

Records arrive as JSON, so the date scalars serialize ISO strings as they are (and datetime
objects from static parts as ISO strings); inputs parse into datetime/date objects, which
`inputs.to_json_value` turns back into ISO strings for the services. Parsers raise ValueError
(not a GraphQLError), so GraphQL reports the failure with the value's location and path.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, NewType

import strawberry
from graphql.type.scalars import serialize_id, serialize_string
from strawberry.schema.config import StrawberryConfig

BigInt = NewType("BigInt", int)

_MAX_BIGINT = 2**63 - 1


def serialize_datetime(value: Any) -> str:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        text: str = value.astimezone(dt.UTC).isoformat(timespec="milliseconds")
        return text.replace("+00:00", "Z")
    if isinstance(value, dt.date):
        return value.isoformat() + "T00:00:00.000Z"
    return str(value)


def _parse_datetime(value: Any) -> dt.datetime:
    """ISO 8601 date-time (a bare date means midnight UTC); naive values are UTC."""
    if not isinstance(value, str):
        raise ValueError(f"DateTime cannot represent {value!r}: expected ISO 8601")
    try:
        if len(value) == 10:
            day = dt.date.fromisoformat(value)
            return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"DateTime cannot represent {value!r}: expected ISO 8601") from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def _serialize_date(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return value.date().isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    return str(value)


def _parse_date(value: Any) -> dt.date:
    """YYYY-MM-DD; an ISO date-time is accepted too and stands for its UTC date."""
    if not isinstance(value, str):
        raise ValueError(f"Date cannot represent {value!r}: expected YYYY-MM-DD")
    try:
        if len(value) == 10:
            return dt.date.fromisoformat(value)
        return _parse_datetime(value).astimezone(dt.UTC).date()
    except ValueError:
        raise ValueError(f"Date cannot represent {value!r}: expected YYYY-MM-DD") from None


def _serialize_bigint(value: Any) -> int:
    return int(value)


def _parse_bigint(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"BigInt cannot represent {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.lstrip("-").isdecimal():
        value = int(value)
    if not isinstance(value, int) or abs(value) > _MAX_BIGINT:
        raise ValueError(f"BigInt cannot represent {value!r}: expected a 64-bit integer")
    return value


def _parse_uuid(value: Any) -> uuid.UUID:
    if not isinstance(value, str):
        raise ValueError(f"UUID cannot represent {value!r}")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ValueError(f"UUID cannot represent {value!r}") from None


SCALAR_MAP: dict[object, Any] = {
    uuid.UUID: strawberry.scalar(
        name="UUID",
        description="A UUID, e.g. 123e4567-e89b-12d3-a456-426614174000",
        serialize=str,
        parse_value=_parse_uuid,
    ),
    dt.datetime: strawberry.scalar(
        name="DateTime",
        description="ISO 8601 date-time in UTC, e.g. 2026-11-22T10:00:00.000Z",
        serialize=serialize_datetime,
        parse_value=_parse_datetime,
    ),
    dt.date: strawberry.scalar(
        name="Date",
        description="ISO 8601 calendar date, e.g. 2026-11-22",
        serialize=_serialize_date,
        parse_value=_parse_date,
    ),
    BigInt: strawberry.scalar(
        name="BigInt",
        description="A 64-bit integer (amounts in micros)",
        serialize=_serialize_bigint,
        parse_value=_parse_bigint,
    ),
}


# Output coercions that answer a str as it is (gateway.graphql.execution skips calling them
# for one): GraphQL's String and ID, and this module's UUID, DateTime and Date.
STR_OUTPUT_AS_IS: frozenset[Any] = frozenset(
    {serialize_string, serialize_id, str, serialize_datetime, _serialize_date}
)


def resolve_attribute(source: Any, name: str) -> object:
    """Default resolver: records are dicts (JSON from the services), other sources objects."""
    if type(source) is dict:
        return source.get(name)
    return getattr(source, name)


def schema_config() -> StrawberryConfig:
    """The config every schema of the gateway is built with."""
    return StrawberryConfig(scalar_map=SCALAR_MAP, default_resolver=resolve_attribute)
