"""`python -m records`: serve gRPC, or `python -m records migrate`."""

from __future__ import annotations

from crmkit.entrypoint import main
from records.app import migrate, serve
from records.settings import RecordsSettings

if __name__ == "__main__":
    main("records", RecordsSettings, serve, migrate)
