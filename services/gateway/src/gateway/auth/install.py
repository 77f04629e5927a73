"""Registers the /auth/* routes and the CORS policy on the gateway app."""

from __future__ import annotations

from fastapi import FastAPI

from gateway.auth import oauth_routes, routes
from gateway.auth.cors import install_cors
from gateway.routing import RouteTable
from gateway.settings import GatewaySettings


def install_auth(app: FastAPI, table: RouteTable, settings: GatewaySettings) -> None:
    table.add(app, "/auth/signup", routes.signup, ["POST"])
    table.add(app, "/auth/login", routes.login, ["POST"])
    table.add(app, "/auth/refresh", routes.refresh, ["POST"])
    table.add(app, "/auth/logout", routes.logout, ["POST"])
    table.add(app, "/auth/password-reset", routes.password_reset, ["POST"])
    table.add(app, "/auth/password-reset/confirm", routes.password_reset_confirm, ["POST"])
    table.add(app, "/auth/authorize", oauth_routes.authorize_page, ["GET"])
    table.add(app, "/auth/authorize", oauth_routes.authorize_submit, ["POST"])
    table.add(app, "/auth/token", oauth_routes.token, ["POST"])
    install_cors(app, settings)
