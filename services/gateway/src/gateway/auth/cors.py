"""CORS: off by default (the API is meant for backends); CORS_ORIGINS is an exact allow-list."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from gateway.settings import GatewaySettings

EXPOSED_HEADERS = ["X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After"]


def install_cors(app: FastAPI, settings: GatewaySettings) -> None:
    origins = settings.cors_origins
    if not origins:
        return
    app.add_middleware(
        CORSMiddleware,
        allow_origins=origins,
        allow_methods=["GET", "POST", "PATCH", "PUT", "DELETE", "OPTIONS"],
        allow_headers=["Authorization", "Content-Type"],
        expose_headers=EXPOSED_HEADERS,
        allow_credentials=False,  # bearer tokens, never cookies
        max_age=600,
    )
