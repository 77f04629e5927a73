"""`python -m webhooks`: serve gRPC, or `python -m webhooks migrate`."""

from __future__ import annotations

from crmkit.entrypoint import main
from webhooks.app import migrate, serve
from webhooks.settings import WebhooksSettings

if __name__ == "__main__":
    main("webhooks", WebhooksSettings, serve, migrate)
