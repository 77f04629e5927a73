"""`python -m workflows` (or `crm-workflows`): serve gRPC, or `python -m workflows migrate`."""

from __future__ import annotations

from crmkit import entrypoint
from workflows.app import migrate, serve
from workflows.settings import WorkflowsSettings


def main() -> None:
    entrypoint.main("workflows", WorkflowsSettings, serve, migrate)


if __name__ == "__main__":
    main()
