"""`python -m <service>` for every service: `serve` (default) or `migrate`."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import uvloop

from crmkit.logs import configure_logging
from crmkit.settings import CommonSettings, load_settings
from crmkit.telemetry import configure_tracing

S = TypeVar("S", bound=CommonSettings)


def main(
    service: str,
    settings_class: type[S],
    serve: Callable[[S], Coroutine[Any, Any, None]],
    migrate: Callable[[S], Coroutine[Any, Any, None]] | None = None,
) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {service}")
    parser.add_argument(
        "command",
        nargs="?",
        default="serve",
        choices=["serve", "migrate"] if migrate else ["serve"],
        help="serve (default) or apply database migrations and exit",
    )
    args = parser.parse_args()
    settings = load_settings(settings_class)
    configure_logging(service, settings.LOG_LEVEL)
    if args.command == "migrate":
        assert migrate is not None
        asyncio.run(migrate(settings))
        return
    provider = configure_tracing(service)
    try:
        uvloop.run(serve(settings))
    finally:
        provider.shutdown()
