"""`python -m workflows`: serve gRPC, or `python -m workflows migrate`."""

from __future__ import annotations

from crmkit.entrypoint import main
from workflows.app import migrate, serve
from workflows.settings import WorkflowsSettings

if __name__ == "__main__":
    main("workflows", WorkflowsSettings, serve, migrate)
