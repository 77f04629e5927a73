"""What one request acts with: the caller, the workspace model, the object, and access checks."""

from __future__ import annotations

from dataclasses import dataclass, field

from crm.common.v1 import common_pb2
from crmkit import authz
from crmkit.authz import Access
from crmkit.errors import NotFound
from records.model import ObjectModel, WorkspaceModel


@dataclass
class RequestContext:
    principal: common_pb2.Principal
    model: WorkspaceModel
    _read: dict[str, Access | None] = field(default_factory=dict)

    def object(self, name: str) -> ObjectModel:
        found = self.model.object(name)
        if found is None:
            raise NotFound(f"unknown object {name!r}", field="object")
        return found

    def require(self, obj: ObjectModel, action: int) -> Access:
        return authz.require_object_access(self.principal, obj.name_singular, action)

    def read_access(self, obj: ObjectModel) -> Access | None:
        """READ access to a related object (for nesting and relation filters); None hides it."""
        if obj.id not in self._read:
            self._read[obj.id] = authz.object_access(self.principal, obj.name_singular, authz.READ)
        return self._read[obj.id]
