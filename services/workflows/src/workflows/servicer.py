"""gRPC servicers of the workflows service."""

from __future__ import annotations

from crm.workflows.v1 import workflows_pb2_grpc


class WorkflowServicer(workflows_pb2_grpc.WorkflowServiceServicer):
    """Answers UNIMPLEMENTED until its issue lands."""
