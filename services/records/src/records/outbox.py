"""The event outbox: one row per changed record, written by the same statement as the change.

`records.outbox` is read by the relay (`records.relay`), which publishes unpublished rows to
JetStream, in sequence order per record, and sets `published_at`. Rows are inserted from a
data-modifying CTE, so a batch of 1000 records writes 1000 outbox rows in the same round trip.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from crm.common.v1 import common_pb2
from crmkit.telemetry import trace_context_headers
from records.model import ObjectModel
from records.sql import Params, literal

CREATED, UPDATED, DELETED = "created", "updated", "deleted"

# A session with this setting 'on' writes no outbox row while nobody listens to the workspace
# (`records.events_wanted`, migration 0011); any other session writes every event.
SKIP_UNHEARD_SETTING = "records.skip_unheard_events"
WRITE, RESTORE, MERGE = "write", "restore", "merge"

_KINDS = {
    common_pb2.PRINCIPAL_KIND_USER: "user",
    common_pb2.PRINCIPAL_KIND_API_KEY: "api_key",
    common_pb2.PRINCIPAL_KIND_OAUTH: "oauth",
    common_pb2.PRINCIPAL_KIND_PERSONAL_ACCESS_TOKEN: "personal_access_token",
    common_pb2.PRINCIPAL_KIND_SYSTEM: "system",
}


# The outbox keeps the record once: `previous_record` holds only the keys whose value the change
# altered (`{}` when none did; NULL for created), and the relay rebuilds the whole previous record
# as the record overlaid with them (`envelope.previous_record_json`).
_PREVIOUS = (
    "CASE WHEN s.before IS NULL THEN NULL ELSE coalesce((SELECT json_object_agg(b.key, b.value) "
    "FROM json_each(s.before::json) b "
    "WHERE b.value::jsonb IS DISTINCT FROM (s.after::jsonb -> b.key)), '{}'::json) END"
)


def write_settings(publish: str) -> dict[str, str]:
    """The server settings of a connection that writes records, for RECORD_EVENTS_PUBLISH
    `publish`: with `interested`, events nobody listens to are not written."""
    return {SKIP_UNHEARD_SETTING: "on"} if publish == "interested" else {}


def actor_kind(principal: common_pb2.Principal) -> str:
    return _KINDS.get(principal.kind, "unspecified")


@dataclass(frozen=True)
class Provenance:
    """Who made a change, and under which trace: placeholders bound once per statement, shared
    by its outbox and history rows (records.history). `trace` is the SQL of the events' trace
    context, "" when the statement writes no event (an unused parameter would have no type).
    Their order is fixed, so a statement built once per object serves every caller
    (records.writes.create_statement)."""

    workspace: str
    kind: str
    user: str
    credential: str
    workflow: str
    trace: str

    @classmethod
    def bound(
        cls,
        params: Params,
        principal: common_pb2.Principal,
        *,
        events: bool = True,
        traces: dict[str, dict[str, str]] | None = None,
    ) -> Provenance:
        """The placeholders of `principal`'s change; its events carry the current trace
        context, or with `traces` (record id -> trace context) each record's own: the creates of
        several requests written by one statement (records.create_groups)."""
        workspace = params.add(principal.workspace_id, "uuid")
        kind = params.add(actor_kind(principal), "text")
        user = params.add(principal.user_id, "text")
        credential = params.add(principal.credential_id, "text")
        workflow = params.add(principal.workflow_id, "text")
        if not events:
            trace = ""
        elif traces is None:
            trace = params.add(orjson.dumps(trace_context_headers()).decode(), "text")
        else:
            trace = f"({params.add(traces, 'jsonb')} -> s.id::text)"
        return cls(workspace, kind, user, credential, workflow, trace)


def outbox_cte(
    name: str,
    source: str,
    obj: ObjectModel,
    provenance: Provenance,
    *,
    action: str,
    cause: str,
    changed: str = "'{}'::text[]",
    record: str = "s.after",
    bulk: bool = False,
) -> str:
    """`<name> AS (INSERT INTO records.outbox ...)` for every row of CTE `source`, while
    somebody listens to the workspace's events (`records.events_wanted`, evaluated once).

    `source` must expose `id`, `after` (json) and `before` (json or NULL). `record` is the SQL of
    the event's record: `s.after` unless the caller builds it here (only for the rows written,
    only while somebody listens). With a `provenance` bound without events (an import that
    emits no events) the CTE writes nothing; `bulk` marks the rows of a bulk write (an import),
    which the relay publishes several to a message.
    """
    if not provenance.trace:
        return f"{name} AS (SELECT NULL WHERE FALSE)"
    workspace = provenance.workspace
    return (
        f"{name}_wanted AS MATERIALIZED (SELECT records.events_wanted({workspace}) AS yes), "
        f"{name} AS (INSERT INTO records.outbox (event_id, workspace_id, object, "
        "object_metadata_id, record_id, action, cause, record, previous_record, changed_fields, "
        "actor_kind, actor_user_id, actor_credential_id, actor_workflow_id, trace_context, bulk) "
        f"SELECT gen_random_uuid(), {workspace}, "
        f"{literal(obj.name_singular)}, {literal(obj.id)}::uuid, s.id, {literal(action)}, "
        f"{literal(cause)}, {record}, {_PREVIOUS}, {changed}, {provenance.kind}, "
        f"{provenance.user}, {provenance.credential}, {provenance.workflow}, "
        f"{provenance.trace}::jsonb, {'true' if bulk else 'false'} "
        f"FROM {source} s, {name}_wanted w WHERE w.yes)"
    )
