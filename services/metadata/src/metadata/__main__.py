"""`python -m metadata`: serve gRPC, or `python -m metadata migrate`."""

from __future__ import annotations

from crmkit.entrypoint import main
from metadata.app import migrate, serve
from metadata.settings import MetadataSettings

if __name__ == "__main__":
    main("metadata", MetadataSettings, serve, migrate)
