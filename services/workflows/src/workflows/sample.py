"""A made-up record of an object, for testWorkflow when the object has no records yet."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from crm.metadata.v1 import metadata_pb2 as md

_NOW = "2026-01-01T09:00:00.000Z"


def _value(item: md.FieldMetadata) -> Any:
    kind = item.type
    if kind == md.FIELD_TYPE_UUID:
        return str(uuid.UUID(int=0))
    if kind in (md.FIELD_TYPE_NUMBER,):
        return 1000
    if kind == md.FIELD_TYPE_BOOLEAN:
        return True
    if kind == md.FIELD_TYPE_DATE:
        return _NOW[:10]
    if kind == md.FIELD_TYPE_DATE_TIME:
        return _NOW
    if kind == md.FIELD_TYPE_CURRENCY:
        return {"amountMicros": 1_000_000_000, "currencyCode": "EUR"}
    if kind == md.FIELD_TYPE_SELECT:
        return item.options[0].value if item.options else "OPTION"
    if kind == md.FIELD_TYPE_MULTI_SELECT:
        return [item.options[0].value] if item.options else []
    if kind == md.FIELD_TYPE_EMAIL:
        return "sample@example.com"
    if kind == md.FIELD_TYPE_PHONE:
        return "+33100000000"
    if kind == md.FIELD_TYPE_LINK:
        return "https://example.com"
    if kind == md.FIELD_TYPE_RAW_JSON:
        return {}
    return f"Sample {item.label or item.name}"


def sample_record(obj: md.ObjectMetadata) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for item in obj.fields:
        if not item.is_active:
            continue
        if item.type == md.FIELD_TYPE_RELATION:
            if item.relation.kind == md.RELATION_KIND_MANY_TO_ONE:
                record[f"{item.name}Id"] = None
                record[item.name] = None
            continue
        record[item.name] = _value(item)
    record["id"] = str(uuid.UUID(int=0))
    record["createdAt"] = record["updatedAt"] = datetime(2026, 1, 1, 9, tzinfo=UTC).isoformat()
    record["deletedAt"] = None
    return record
