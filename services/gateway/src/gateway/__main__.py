"""`python -m gateway`: serve the HTTP API on PORT."""

from __future__ import annotations

import uvicorn

from crmkit.logs import configure_logging
from crmkit.settings import load_settings
from crmkit.telemetry import configure_tracing
from gateway.app import create_app
from gateway.settings import GatewaySettings


def main() -> None:
    settings = load_settings(GatewaySettings)
    configure_logging("gateway", settings.LOG_LEVEL)
    provider = configure_tracing("gateway")
    try:
        uvicorn.run(
            create_app(settings),
            host=settings.HOST,
            port=settings.PORT,
            loop="uvloop",
            http="httptools",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=10,
            timeout_keep_alive=settings.HTTP_KEEPALIVE_TIMEOUT,
            # GraphQL WebSockets without permessage-deflate: a zlib context per socket (tens of
            # kB each) and a compression per subscriber per event cost more than the bytes they
            # save (as the ws library for Node also decides by default).
            ws_per_message_deflate=False,
        )
    finally:
        provider.shutdown()


if __name__ == "__main__":
    main()
