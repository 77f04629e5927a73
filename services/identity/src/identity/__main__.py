"""`python -m identity`: serve gRPC, or `python -m identity migrate`."""

from __future__ import annotations

from crmkit.entrypoint import main
from identity.app import migrate, serve
from identity.settings import IdentitySettings

if __name__ == "__main__":
    main("identity", IdentitySettings, serve, migrate)
