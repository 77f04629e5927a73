"""Every HTML page the gateway serves refuses to be framed, including the pages served only in
development (`make run`: CRM_ENV=development), the GraphQL playground and the API docs."""

from __future__ import annotations

from collections.abc import Callable

import httpx

DEVELOPMENT_PAGES = ("/graphql", "/metadata", "/docs", "/docs/oauth2-redirect")


def test_development_html_pages_cannot_be_framed(
    extra_gateway: Callable[[dict[str, str]], str],
) -> None:
    url = extra_gateway({"CRM_ENV": "development"})
    for path in DEVELOPMENT_PAGES:
        response = httpx.get(url + path, headers={"Accept": "text/html"}, timeout=30)
        assert response.status_code == 200, path
        assert response.headers["content-type"].startswith("text/html"), path
        assert response.headers.get("x-frame-options") == "DENY", path
        policy = response.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in policy, path
