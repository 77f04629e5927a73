"""Marks requests sent by a workflow run, so writes they cause do not trigger that workflow again.

Every request a workflow sends carries `X-CRM-Workflow-Run: <workflowId>.<runId>.<signature>`,
an HMAC (key derived from APP_SECRET) over the workspace, workflow and run ids. When such a
request comes back to the API with a credential of the same workspace, the gateway verifies the
signature (constant time) and stamps the workflow id on the caller's principal; the records
service copies it into the record event's actor, and the workflow runner never starts a run of a
workflow for an event that workflow caused. The header grants nothing: it only names the origin
of a write that is otherwise authorized by its own credential.
"""

from __future__ import annotations

import hashlib
import hmac

WORKFLOW_RUN_HEADER = "X-CRM-Workflow-Run"


class WorkflowOrigin:
    def __init__(self, app_secret: str) -> None:
        self._key = hashlib.sha256(b"crm-workflow-origin:" + app_secret.encode()).digest()

    def header_value(self, workspace_id: str, workflow_id: str, run_id: str) -> str:
        return f"{workflow_id}.{run_id}.{self._sign(workspace_id, workflow_id, run_id)}"

    def workflow_of(self, value: str, workspace_id: str) -> str | None:
        """The workflow a header value names, if it is genuine for `workspace_id`."""
        parts = value.strip().split(".")
        if len(parts) != 3 or not all(parts):
            return None
        workflow_id, run_id, signature = parts
        expected = self._sign(workspace_id, workflow_id, run_id)
        if not hmac.compare_digest(expected.encode(), signature.encode()):
            return None
        return workflow_id

    def _sign(self, workspace_id: str, workflow_id: str, run_id: str) -> str:
        message = f"{workspace_id}.{workflow_id}.{run_id}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()
