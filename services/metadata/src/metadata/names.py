"""Rules for object and field names: camelCase, not reserved, short enough to be identifiers."""

from __future__ import annotations

import re

from crmkit.errors import InvalidArgument

CAMEL_CASE = re.compile(r"^[a-z][a-zA-Z0-9]*$")
OPTION_VALUE = re.compile(r"^[A-Z][A-Z0-9_]*$")
MAX_NAME = 48  # leaves room for column suffixes (CurrencyCode, Id) within Postgres' 63 bytes
MAX_LABEL = 200

SYSTEM_FIELD_NAMES = ("id", "ownerId", "createdAt", "updatedAt", "deletedAt")

# Names the APIs use themselves: GraphQL roots and built-in types, REST path segments, metadata
# and settings operations. An object with one of these names would shadow them.
RESERVED_OBJECT_NAMES = frozenset(
    {
        "batch", "restore", "duplicates", "merge", "groupBy", "openApi", "rest", "graphql",
        "metadata", "object", "objects", "field", "fields", "webhook", "webhooks", "apiKey",
        "apiKeys", "workflow", "workflows", "workflowRun", "workflowRuns", "currentUser", "user",
        "users", "role", "roles", "workspace", "workspaces", "workspaceMember",
        "workspaceMembers", "query", "mutation", "subscription", "event", "events", "node",
        "nodes", "edge", "edges", "pageInfo", "apiVersion", "schema", "type", "types",
        "aggregate", "string", "int", "float", "boolean", "uuid", "date", "dateTime", "json",
        "rawJson", "currency", "link", "email", "phone", "select", "multiSelect", "relation",
        "filter", "orderBy", "cursor", "connection", "credential", "credentials", "oauthClient",
        "auth", "healthz", "search", "record", "records",
    }
)  # fmt: skip

# Field names that would clash with list arguments, connection shapes or relation writes.
RESERVED_FIELD_NAMES = frozenset(
    {
        "and", "or", "not", "filter", "orderBy", "limit", "first", "last", "after", "before",
        "cursor", "depth", "fields", "edges", "node", "pageInfo", "totalCount", "connect",
        "disconnect", "data", "typename", "count", "sum", "avg", "min", "max",
        "countNotNull", "deleted", "object",
    }
) | frozenset(
    # PostgreSQL's system columns: every table already has them, so no field may take them.
    {"tableoid", "xmin", "cmin", "xmax", "cmax", "ctid", "oid"}
)  # fmt: skip


def check_name(value: str, field: str, *, reserved: frozenset[str], what: str) -> str:
    if not value:
        raise InvalidArgument(f"{field} is required", field=field)
    if len(value) > MAX_NAME:
        raise InvalidArgument(f"{field} is longer than {MAX_NAME} characters", field=field)
    if not CAMEL_CASE.match(value):
        raise InvalidArgument(
            f"{field} must be camelCase (a lowercase letter, then letters and digits), "
            f"got {value!r}",
            field=field,
        )
    if value in reserved:
        raise InvalidArgument(f"{field}: {value!r} is reserved and cannot name {what}", field=field)
    return value


def check_label(value: str, field: str, fallback: str) -> str:
    label = value.strip() or humanize(fallback)
    if len(label) > MAX_LABEL:
        raise InvalidArgument(f"{field} is longer than {MAX_LABEL} characters", field=field)
    return label


def humanize(name: str) -> str:
    """`jobTitle` → `Job title`."""
    words = re.sub(r"(?<=[a-z0-9])([A-Z])", r" \1", name).split(" ")
    text = " ".join(word.lower() for word in words)
    return text[:1].upper() + text[1:]
