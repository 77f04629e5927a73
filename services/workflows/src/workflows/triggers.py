"""Whether a record event starts a run of a workflow: pure rules, shared by intake and tests.

- RECORD_CREATED fires on created events of its object, RECORD_UPDATED on updated events
  (restores and merges included: they are updates);
- the filter (API filter language) is evaluated on the record after the change;
- watched fields (RECORD_UPDATED): fires only when one of them changed;
- a workflow never fires for an event its own run caused (the event's actor carries the
  workflow id; see crmkit.workflow_origin).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crm.common.v1 import common_pb2
from crmkit.filters import matches, parse_filter
from workflows.definitions import RECORD_CREATED, RECORD_UPDATED

ACTION_TRIGGERS = {"created": RECORD_CREATED, "updated": RECORD_UPDATED}


@dataclass(frozen=True)
class RecordTrigger:
    workflow_id: str
    workspace_id: str
    type: str
    object: str
    filter: common_pb2.Filter | None
    fields: frozenset[str]

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> RecordTrigger:
        return cls(
            workflow_id=row["id"],
            workspace_id=row["workspace_id"],
            type=row["trigger_type"],
            object=row["object"],
            filter=parse_filter(row["filter"]) if row["filter"] else None,
            fields=frozenset(row["fields"] or ()),
        )


@dataclass(frozen=True)
class Event:
    id: str
    workspace_id: str
    object: str
    action: str  # created, updated, deleted
    record: dict[str, Any] | None
    previous_record: dict[str, Any] | None
    changed_fields: frozenset[str]
    actor_workflow_id: str


def changed(event: Event) -> frozenset[str]:
    if event.changed_fields:
        return event.changed_fields
    before, after = event.previous_record or {}, event.record or {}
    return frozenset(key for key in set(before) | set(after) if before.get(key) != after.get(key))


def wants(trigger: RecordTrigger, event: Event) -> bool:
    """Whether the event passes the trigger's type, loop rule and watched fields (the filter is
    checked apart, once relations it names are loaded)."""
    if trigger.workspace_id != event.workspace_id or trigger.object != event.object:
        return False
    if ACTION_TRIGGERS.get(event.action) != trigger.type:
        return False
    if event.actor_workflow_id and event.actor_workflow_id == trigger.workflow_id:
        return False
    watched = trigger.type == RECORD_UPDATED and bool(trigger.fields)
    return not watched or bool(trigger.fields & changed(event))


def filter_matches(trigger: RecordTrigger, record: Mapping[str, Any] | None) -> bool:
    if trigger.filter is None:
        return True
    return record is not None and matches(trigger.filter, record)
