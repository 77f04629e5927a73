"""Write payloads (record JSON from the caller) checked and turned into column values.

Relations are written as `{"company": {"connect": "<id>"}}`, `{"company": {"disconnect": true}}`
(or null), or directly as `"companyId": "<id>" | null`. System timestamps are read-only; `id` may
be given on create (a UUID); `ownerId` defaults to the creating user.
"""

from __future__ import annotations

import os
import struct
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
    """UUIDv7 ids: time-ordered (so id order is creation order), monotonic within a process.
    Random bits are read from the OS 4 KiB at a time (one system call per 512 ids)."""

    _POOL_SIZE = 512
    _UNPACK = struct.Struct(f">{_POOL_SIZE}Q").unpack
    _RANDOM_MASK = (1 << 62) - 1
    _VERSION_AND_VARIANT = (0x7 << 76) | (0b10 << 62)

    def __init__(self) -> None:
        self._last_ms = 0
        self._counter = 0
        self._random: list[int] = []

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
        if not self._random:
            self._random = list(self._UNPACK(os.urandom(8 * self._POOL_SIZE)))
        random_bits = self._random.pop() & self._RANDOM_MASK
        value = (now << 80) | self._VERSION_AND_VARIANT | (self._counter << 64) | random_bits
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


class CreatePlan:
    """What `prepare_create` works out per object, done once for many records of it (a batch,
    an import job): the field each key names, the defaults of fields a record leaves out, and
    the required fields. `prepare` checks one record exactly as `prepare_create` does."""

    def __init__(self, obj: ObjectModel, access: Access) -> None:
        self.obj = obj
        self.access = access
        self._items: dict[str, FieldModel] = {}
        self._defaults: dict[str, dict[str, Any]] = {}  # field name -> its default's columns
        self._unset = [item for item in obj.writable_fields if item.name != "id"]
        self._required = [  # every record gets an id
            (item.name, [c.name for c in item.columns])
            for item in obj.writable_fields
            if not item.is_nullable and item.name != "id"
        ]

    def _field(self, key: str, path: str) -> FieldModel:
        item = self._items.get(key)
        if item is None:
            item = self._items[key] = _lookup(self.obj, key, path)
        return item

    def _default(self, item: FieldModel, prefix: str) -> dict[str, Any]:
        """The columns of `item`'s default; a default that fails its own check raises (with
        this record's path) every time, a valid one is checked once."""
        found = self._defaults.get(item.name)
        if found is None:
            holder = Prepared()
            _set_field(self.obj, holder, item, item.name, item.default, _path(prefix, item.name))
            found = self._defaults[item.name] = holder.columns
        return found

    def prepare(self, data: Any, prefix: str, ids: RecordIds) -> Prepared:
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
            _set_field(self.obj, prepared, self._field(key, path), key, value, path)
        return self.complete(prepared, record_id, prefix, ids)

    def complete(
        self, prepared: Prepared, record_id: str | None, prefix: str, ids: RecordIds
    ) -> Prepared:
        """The record's id, the defaults of the fields it left out (`prepared.fields` names
        those it set), then the owner and required checks."""
        columns = prepared.columns
        columns["id"] = record_id or ids.new()
        given = set(prepared.fields)
        for item in self._unset:
            if item.name in given:
                continue
            if item.name == "ownerId":
                columns["ownerId"] = self.access.owner_id or None
            elif item.default is not MISSING and item.default is not None:
                columns.update(self._default(item, prefix))
                prepared.fields.append(item.name)
            else:
                for column in item.columns:
                    columns.setdefault(column.name, None)
        if self.access.own_records_only:
            _check_owner(self.access, columns.get("ownerId"), _path(prefix, "ownerId"))
        for name, names in self._required:
            if all(columns.get(c) is None for c in names):
                raise values.fail(_path(prefix, name), f"{name} is required")
        return prepared


def prepare_create(
    obj: ObjectModel, data: Any, prefix: str, access: Access, ids: RecordIds
) -> Prepared:
    return CreatePlan(obj, access).prepare(data, prefix, ids)


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
    plan = CreatePlan(obj, access)
    return [plan.prepare(entry, f"[{i}]", ids) for i, entry in enumerate(data)]
