"""`python -m webhooks` (or `crm-webhooks`): serve gRPC, or `python -m webhooks migrate`."""

from __future__ import annotations

from crmkit import entrypoint
from webhooks.app import migrate, serve
from webhooks.settings import WebhooksSettings


def main() -> None:
    entrypoint.main("webhooks", WebhooksSettings, serve, migrate)


if __name__ == "__main__":
    main()
