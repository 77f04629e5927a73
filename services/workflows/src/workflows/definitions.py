"""A workflow's trigger and action as given to the API: shape checks, then checks against the
workspace's data model (objects, fields, relations) where they can be known at save time.

Field names in errors are the API's: `name`, `trigger.object`, `trigger.filter`,
`trigger.fields`, `trigger.cron`, `trigger.timezone`, `action.method`, `action.url`,
`action.headers`, `action.body`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

from crm.metadata.v1 import metadata_pb2 as md
from crm.workflows.v1 import workflows_pb2 as wf
from crmkit.errors import InvalidArgument
from crmkit.filters import parse_filter, referenced_fields
from crmkit.http_send import is_framing_header
from crmkit.outbound import validate_http_url
from workflows import templates
from workflows.templates import TemplateError

MAX_NAME_LENGTH = 200
MAX_URL_LENGTH = 2048
MAX_BODY_LENGTH = 64 * 1024
MAX_HEADERS = 50
# An HTTP header name (RFC 9110 token).
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
RECORD_CREATED, RECORD_UPDATED, SCHEDULED = "record_created", "record_updated", "scheduled"
TRIGGER_NAMES: dict[wf.TriggerType, str] = {
    wf.TRIGGER_TYPE_RECORD_CREATED: RECORD_CREATED,
    wf.TRIGGER_TYPE_RECORD_UPDATED: RECORD_UPDATED,
    wf.TRIGGER_TYPE_SCHEDULED: SCHEDULED,
}
TRIGGER_VALUES = {name: value for value, name in TRIGGER_NAMES.items()}
# What the templates of a SCHEDULED workflow can read (see runner.tick_context).
SCHEDULED_VARIABLES = frozenset({"scheduledAt", "workflowId", "workflowName"})


@dataclass(frozen=True)
class TriggerSpec:
    type: str
    object: str = ""
    filter: dict[str, Any] | None = None
    fields: list[str] = field(default_factory=list)
    cron: str = ""
    timezone: str = "UTC"


@dataclass(frozen=True)
class ActionSpec:
    method: str
    url: str
    headers: dict[str, str]
    body: str
    secret_params: list[str] = field(default_factory=list)


def validate_name(value: str) -> str:
    name = value.strip()
    if not name:
        raise InvalidArgument("name is required", field="name")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidArgument(f"name must be at most {MAX_NAME_LENGTH} characters", field="name")
    return name


def _json(raw: bytes, field_name: str) -> Any:
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidArgument(f"{field_name} must be JSON", field=field_name) from None


def read_trigger(message: wf.Trigger) -> TriggerSpec:
    kind = TRIGGER_NAMES.get(message.type)
    if kind is None:
        raise InvalidArgument(
            "trigger.type must be RECORD_CREATED, RECORD_UPDATED or SCHEDULED",
            field="trigger.type",
        )
    if kind == SCHEDULED:
        if message.object or message.filter_json or message.fields:
            raise InvalidArgument(
                "a SCHEDULED trigger takes cron and timezone, not object, filter or fields",
                field="trigger.object",
            )
        return TriggerSpec(
            type=kind, cron=" ".join(message.cron.split()), timezone=message.timezone or "UTC"
        )
    if message.cron or message.timezone:
        raise InvalidArgument(
            "cron and timezone belong to SCHEDULED triggers", field="trigger.cron"
        )
    obj = message.object.strip()
    if not obj:
        raise InvalidArgument("trigger.object is required", field="trigger.object")
    raw_filter = _json(message.filter_json, "trigger.filter")
    try:
        parse_filter(raw_filter, field="trigger.filter")
    except InvalidArgument as exc:
        raise InvalidArgument(f"filter: {exc.message}", field="trigger.filter") from None
    fields = [name.strip() for name in message.fields if name.strip()]
    if fields and kind != RECORD_UPDATED:
        raise InvalidArgument(
            "watched fields apply to RECORD_UPDATED triggers only", field="trigger.fields"
        )
    return TriggerSpec(
        type=kind,
        object=obj,
        filter=raw_filter or None,
        fields=list(dict.fromkeys(fields)),
    )


def read_action(message: wf.HttpAction) -> ActionSpec:
    if message.type not in (wf.ACTION_TYPE_UNSPECIFIED, wf.ACTION_TYPE_SEND_HTTP_REQUEST):
        raise InvalidArgument("action.type must be SEND_HTTP_REQUEST", field="action.type")
    method = (message.method or "POST").strip().upper()
    if method not in METHODS:
        raise InvalidArgument(
            f"action.method must be one of {', '.join(METHODS)}", field="action.method"
        )
    url = _checked_url_template(message.url)
    headers = _headers(_json(message.headers_json, "action.headers"))
    body = message.body
    if len(body) > MAX_BODY_LENGTH:
        raise InvalidArgument(
            f"action.body must be at most {MAX_BODY_LENGTH} characters", field="action.body"
        )
    try:
        templates.check_syntax(body, "action.body")
        if templates.is_json_body(body, headers) and body.strip():
            templates.check_json_shape(body, "action.body")
    except TemplateError as exc:
        raise InvalidArgument(exc.message, field=exc.field) from None
    if body and method == "GET":
        raise InvalidArgument("a GET request has no body", field="action.body")
    secret_params = [name.strip() for name in message.secret_params if name.strip()]
    return ActionSpec(
        method=method,
        url=url,
        headers=headers,
        body=body,
        secret_params=list(dict.fromkeys(secret_params)),
    )


def _checked_url_template(value: str) -> str:
    url = value.strip()
    try:
        templates.check_syntax(url, "action.url")
    except TemplateError as exc:
        raise InvalidArgument(exc.message, field=exc.field) from None
    # Variables may fill the path and query, never the scheme, host or port: a record must not
    # choose where the request goes.
    probe = templates.VARIABLE.sub("x", url)
    validate_http_url(probe, "action.url", max_length=MAX_URL_LENGTH)
    authority = urlsplit(url).netloc
    if templates.VARIABLE.search(authority) or "{" in authority:
        raise InvalidArgument(
            "action.url: variables may fill the path and query, not the host",
            field="action.url",
        )
    return url


def _headers(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgument("action.headers must be a JSON object", field="action.headers")
    if len(value) > MAX_HEADERS:
        raise InvalidArgument(
            f"action.headers: at most {MAX_HEADERS} headers", field="action.headers"
        )
    headers: dict[str, str] = {}
    for name, text in value.items():
        if not _TOKEN.match(name):
            raise InvalidArgument(f"invalid header name {name!r}", field="action.headers")
        refuse_framing(name)
        if not isinstance(text, str):
            raise InvalidArgument(
                f"header {name}: the value must be a string", field=f"action.headers.{name}"
            )
        if "\r" in text or "\n" in text or "\x00" in text:
            raise InvalidArgument(
                f"header {name}: the value must not contain line breaks or NUL characters",
                field=f"action.headers.{name}",
            )
        try:
            templates.check_syntax(text, f"action.headers.{name}")
        except TemplateError as exc:
            raise InvalidArgument(exc.message, field=exc.field) from None
        headers[name] = text
    return headers


def refuse_framing(name: str) -> None:
    """Refuse a header that frames the request or steers the connection (the client sets those);
    checked again before a stored workflow is activated or tested (it may predate the rule)."""
    if is_framing_header(name):
        raise InvalidArgument(
            f"header {name} is set by the HTTP client and cannot be configured",
            field=f"action.headers.{name}",
        )


def template_variables(action: ActionSpec) -> list[tuple[str, str]]:
    """(variable path, API field of the template using it) for every template of the action."""
    found: list[tuple[str, str]] = []
    found += [(path, "action.url") for path in templates.variables(action.url)]
    for name, value in action.headers.items():
        found += [(path, f"action.headers.{name}") for path in templates.variables(value)]
    found += [(path, "action.body") for path in templates.variables(action.body)]
    return found


# -- against the data model ----------------------------------------------------------------------
def _field_names(obj: md.ObjectMetadata) -> set[str]:
    names: set[str] = set()
    for item in obj.fields:
        if not item.is_active:
            continue
        names.add(item.name)
        if (
            item.type == md.FIELD_TYPE_RELATION
            and item.relation.kind == md.RELATION_KIND_MANY_TO_ONE
        ):
            names.add(f"{item.name}Id")
    return names


def _path_known(path: str, obj: md.ObjectMetadata, objects: Mapping[str, md.ObjectMetadata]) -> str:
    """ "" when `path` can be read from a record of `obj`, else why not."""
    head, _, rest = path.partition(".")
    if head not in _field_names(obj):
        return f"{head!r} is not a field of {obj.name_singular}"
    if not rest:
        return ""
    definition = next((f for f in obj.fields if f.name == head), None)
    if definition is None or definition.type != md.FIELD_TYPE_RELATION:
        return ""  # into a composite value (e.g. amount.amountMicros): its parts vary
    if definition.relation.kind != md.RELATION_KIND_MANY_TO_ONE:
        return f"{head!r} is a one-to-many relation: only many-to-one relations can be read"
    target = objects.get(definition.relation.target_object_name)
    if target is None:
        return f"{head!r} leads to an unknown object"
    second, _, deeper = rest.partition(".")
    if second not in _field_names(target):
        return f"{second!r} is not a field of {target.name_singular}"
    inner = next((f for f in target.fields if f.name == second), None)
    if deeper and inner is not None and inner.type == md.FIELD_TYPE_RELATION:
        return "templates read one relation deep (e.g. company.name)"
    return ""


def check_against_model(
    trigger: TriggerSpec, action: ActionSpec, schema: md.WorkspaceSchema
) -> None:
    """Refuse an unknown object, and fields or template variables the object does not have."""
    if trigger.type == SCHEDULED:
        for path, where in template_variables(action):
            if path.split(".")[0] not in SCHEDULED_VARIABLES:
                raise InvalidArgument(
                    f"variable {{{{{path}}}}}: a SCHEDULED workflow's templates can use "
                    f"{', '.join(sorted(SCHEDULED_VARIABLES))}",
                    field=where,
                )
        return
    objects = {obj.name_singular: obj for obj in schema.objects if obj.is_active}
    obj = objects.get(trigger.object)
    if obj is None:
        raise InvalidArgument(f"unknown object {trigger.object!r}", field="trigger.object")
    names = _field_names(obj)
    for name in trigger.fields:
        if name not in names:
            raise InvalidArgument(
                f"{name!r} is not a field of {obj.name_singular}", field="trigger.fields"
            )
    for path in sorted(referenced_fields(parse_filter(trigger.filter, field="trigger.filter"))):
        problem = _path_known(path, obj, objects)
        if problem:
            raise InvalidArgument(f"filter: {problem}", field="trigger.filter")
    for path, where in template_variables(action):
        problem = _path_known(path, obj, objects)
        if problem:
            raise InvalidArgument(f"variable {{{{{path}}}}}: {problem}", field=where)


def read_objects(trigger: TriggerSpec, action: ActionSpec, schema: md.WorkspaceSchema) -> list[str]:
    """The objects a workflow's runs read records of: its trigger's object and the objects of
    the many-to-one relations its filter and templates follow (none for a SCHEDULED one)."""
    if trigger.type == SCHEDULED:
        return []
    obj = next((o for o in schema.objects if o.name_singular == trigger.object), None)
    found = {trigger.object}
    paths = [path for path, _ in template_variables(action)]
    paths += referenced_fields(parse_filter(trigger.filter, field="trigger.filter"))
    for path in paths:
        head, _, rest = path.partition(".")
        relation = next(
            (
                f
                for f in (obj.fields if obj is not None else ())
                if f.name == head and f.type == md.FIELD_TYPE_RELATION
            ),
            None,
        )
        if rest and relation is not None:
            found.add(relation.relation.target_object_name)
    return sorted(found)


def relation_heads(paths: list[str], record: Mapping[str, Any]) -> list[str]:
    """The first segments of dotted paths that the record does not hold as a nested value
    (relations to load before a filter or template can read them)."""
    heads: list[str] = []
    for path in paths:
        head, _, rest = path.partition(".")
        nested = isinstance(record.get(head), Mapping)
        if rest and not nested and f"{head}Id" in record and head not in heads:
            heads.append(head)
    return heads
