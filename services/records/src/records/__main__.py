"""`python -m records` (or `crm-records`): serve gRPC, or `python -m records migrate`."""

from __future__ import annotations

from crmkit import entrypoint
from records.app import migrate, serve
from records.settings import RecordsSettings


def main() -> None:
    entrypoint.main("records", RecordsSettings, serve, migrate)


if __name__ == "__main__":
    main()
