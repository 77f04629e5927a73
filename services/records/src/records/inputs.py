"""Write payloads (record JSON from the caller) checked and turned into column values.

Relations are written as `{"company": {"connect": "<id>"}}`, `{"company": {"disconnect": true}}`
(or null), or directly as `"companyId": "<id>" | null`. System timestamps are read-only; `id` may
be given on create (a UUID); `ownerId` defaults to the creating user.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from crm.metadata.v1 import metadata_pb2 as md
from crmkit.authz import Access
from crmkit.errors import PermissionDenied
from records import values
from records.model import MISSING, TIMESTAMP_FIELDS, FieldModel, ObjectModel

MAX_BATCH = 1000


class RecordIds:
    """UUIDv7 ids: time-ordered (so id order is creation order), monotonic within a process."""

    def __init__(self) -> None:
        self._last_ms = 0
        self._counter = 0

    def new(self) -> str:
        now = time.time_ns() // 1_000_000
        if now <= self._last_ms:
            self._counter += 1
            if self._counter > 0xFFF:
                self._last_ms += 1
                self._counter = 0
            now = self._last_ms
        else:
            self._last_ms = now
            self._counter = 0
        random_bits = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
        value = (now << 80) | (0x7 << 76) | (self._counter << 64) | (0b10 << 62) | random_bits
        text = f"{value:032x}"
        return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def _path(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


@dataclass
class Prepared:
    """Column values of one record, in canonical JSON form, keyed by column name."""

    columns: dict[str, Any] = field(default_factory=dict)
    fields: list[str] = field(default_factory=list)  # field names the payload set


def _relation_value(item: FieldModel, key: str, value: Any, path: str) -> str | None:
    if key == item.key:  # companyId
        return None if value is None else values.canonical_uuid(value, path)
    if value is None:
        return None
    if isinstance(value, dict) and len(value) == 1:
        if "connect" in value:
            return values.canonical_uuid(value["connect"], f"{path}.connect")
        if value.get("disconnect") is True:
            return None
    raise values.fail(path, 'relations are written as {"connect": "<id>"} or {"disconnect": true}')


def _set_field(obj: ObjectModel, prepared: Prepared, item: FieldModel, key: str, value: Any,
               path: str) -> None:  # fmt: skip
    if item.name in prepared.fields:
        raise values.fail(path, f"{item.name} is given twice")
    prepared.fields.append(item.name)
    if item.is_many_to_one:
        prepared.columns[item.column] = _relation_value(item, key, value, path)
        return
    if item.type == md.FIELD_TYPE_CURRENCY:
        amount_column, code_column = (c.name for c in item.columns)
        amount, code = (None, None) if value is None else values.parse_currency(value, path)
        prepared.columns[amount_column] = amount
        prepared.columns[code_column] = code
        return
    prepared.columns[item.column] = None if value is None else values.write_value(item, value, path)


def _lookup(obj: ObjectModel, key: str, path: str) -> FieldModel:
    item = obj.field(key)
    if item is None:
        raise values.fail(path, f"unknown field {key!r} on {obj.name_singular}")
    if item.name in TIMESTAMP_FIELDS:
        raise values.fail(path, f"{item.name} is set by the service and cannot be written")
    if item.is_one_to_many:
        raise values.fail(
            path,
            f"{key} is the one-to-many side of a relation; set it on the related records instead",
        )
    return item


def _check_owner(access: Access, owner: Any, path: str) -> None:
    if access.own_records_only and owner != access.owner_id:
        raise PermissionDenied(f"{path}: your role may only own its own records", field=path)


def prepare_create(
    obj: ObjectModel, data: Any, prefix: str, access: Access, ids: RecordIds
) -> Prepared:
    if not isinstance(data, dict):
        raise values.fail(prefix or "data", "a record is a JSON object")
    prepared = Prepared()
    record_id: str | None = None
    for key, value in data.items():
        path = _path(prefix, key)
        if key == "id":
            if value is not None:
                record_id = values.canonical_uuid(value, path)
            continue
        _set_field(obj, prepared, _lookup(obj, key, path), key, value, path)
    prepared.columns["id"] = record_id or ids.new()
    for item in obj.writable_fields:
        if item.name in prepared.fields or item.name == "id":
            continue
        if item.name == "ownerId":
            prepared.columns["ownerId"] = access.owner_id or None
            continue
        if item.default is not MISSING and item.default is not None:
            _set_field(obj, prepared, item, item.name, item.default, _path(prefix, item.name))
        else:
            for column in item.columns:
                prepared.columns.setdefault(column.name, None)
    _check_owner(access, prepared.columns.get("ownerId"), _path(prefix, "ownerId"))
    for item in obj.writable_fields:
        if not item.is_nullable and all(prepared.columns.get(c.name) is None for c in item.columns):
            raise values.fail(_path(prefix, item.name), f"{item.name} is required")
    return prepared


def prepare_update(obj: ObjectModel, data: Any, access: Access) -> Prepared:
    if not isinstance(data, dict):
        raise values.fail("data", "the changes are a JSON object")
    prepared = Prepared()
    for key, value in data.items():
        if key == "id":
            raise values.fail("id", "id cannot be changed")
        item = _lookup(obj, key, key)
        _set_field(obj, prepared, item, key, value, key)
        if not item.is_nullable and all(prepared.columns.get(c.name) is None for c in item.columns):
            raise values.fail(key, f"{item.name} is required and cannot be null")
    if "ownerId" in prepared.columns:
        _check_owner(access, prepared.columns["ownerId"], "ownerId")
    return prepared


def prepare_batch(obj: ObjectModel, data: Any, access: Access, ids: RecordIds) -> list[Prepared]:
    if not isinstance(data, list):
        raise values.fail("data", "a batch is a JSON array of records")
    if len(data) > MAX_BATCH:
        raise values.fail("data", f"at most {MAX_BATCH} records per batch")
    return [prepare_create(obj, entry, f"[{i}]", access, ids) for i, entry in enumerate(data)]
