"""`python -m gateway`: serve the HTTP API on PORT."""

from __future__ import annotations

import uvicorn

from crmkit.logs import configure_logging
from crmkit.settings import load_settings
from crmkit.telemetry import configure_tracing
from gateway.app import create_app
from gateway.http_protocol import GatewayHttpProtocol
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
            http=GatewayHttpProtocol,
            log_config=None,
            access_log=False,
            # The client's address is the peer's unless TRUSTED_PROXIES names the peer
            # (gateway.auth.client_ip): uvicorn's own X-Forwarded-For handling would also
            # believe any loopback peer (a sidecar proxy's clients, say) and costs a layer.
            proxy_headers=False,
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
