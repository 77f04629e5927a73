"""`python -m identity` (or `crm-identity`): serve gRPC, or `python -m identity migrate`."""

from __future__ import annotations

from crmkit import entrypoint
from identity.app import migrate, serve
from identity.settings import IdentitySettings


def main() -> None:
    entrypoint.main("identity", IdentitySettings, serve, migrate)


if __name__ == "__main__":
    main()
