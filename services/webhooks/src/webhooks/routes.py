"""Which (workspace, operation) pairs active webhooks want: the intake's filter, kept current.

The deliverer sees every record event of every workspace; most match no webhook. `Routes` holds
the operations of the active webhooks per workspace, as of a `webhooks.routing_version` that a
trigger bumps in the same transaction as any change to `webhooks.webhooks`. The intake reads the
committed version in the statement it runs for every batch (after the batch was received, so
after its events were committed): when it differs, the routes are reloaded and the batch matched
again before anything is acknowledged. So an event committed after a webhook was created (or
updated to want it) always reaches it, on every replica, and an event no webhook wants costs no
write. The intake's SQL still matches against the webhooks table itself; the cache only decides
which events are worth sending to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from webhooks.operations import matching_patterns

# Every active webhook's workspace and operations, with the version they are current for.
LOAD = """
SELECT v.version, w.workspace_id::text, w.operations
FROM webhooks.routing_version v
LEFT JOIN webhooks.webhooks w ON w.is_active
"""
VERSION = "SELECT version FROM webhooks.routing_version"


@dataclass(frozen=True)
class Routes:
    version: int = 0  # 0: never loaded (the table starts at 1)
    operations: dict[str, frozenset[str]] = field(default_factory=dict)  # workspace -> patterns

    @classmethod
    def of(cls, rows: Iterable[tuple[int, str | None, list[str] | None]]) -> Routes:
        """From the rows of LOAD: (version, workspace, operations), the last two null when
        no webhook is active."""
        version = 0
        merged: dict[str, set[str]] = {}
        for row_version, workspace_id, operations in rows:
            version = row_version
            if workspace_id is not None:
                merged.setdefault(workspace_id, set()).update(operations or ())
        return cls(version, {key: frozenset(value) for key, value in merged.items()})

    def wants(self, workspace_id: str, object_name: str, action: str) -> bool:
        patterns = self.operations.get(workspace_id)
        return patterns is not None and any(
            pattern in patterns for pattern in matching_patterns(object_name, action)
        )
