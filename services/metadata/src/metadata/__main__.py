"""`python -m metadata` (or `crm-metadata`): serve gRPC, or `python -m metadata migrate`."""

from __future__ import annotations

from crmkit import entrypoint
from metadata.app import migrate, serve
from metadata.settings import MetadataSettings


def main() -> None:
    entrypoint.main("metadata", MetadataSettings, serve, migrate)


if __name__ == "__main__":
    main()
