"""Which addresses the launcher gives its processes on one host (crmstack.local_sockets)."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from crmstack.local_sockets import UNIX_SOCKET_PATH_MAX, grpc_socket, postgres_url


def test_a_grpc_socket_lives_in_the_data_dir_and_is_refused_when_too_long() -> None:
    assert grpc_socket(Path("/tmp/crm"), "records") == Path("/tmp/crm/sockets/records.sock")
    deep = Path("/" + "d" * (UNIX_SOCKET_PATH_MAX - len("/") - len("/sockets/records.sock")))
    assert grpc_socket(deep, "records") == deep / "sockets" / "records.sock"
    assert grpc_socket(deep / "x", "records") is None


def test_the_postgres_url_names_the_socket_dir_quoted_and_the_port() -> None:
    url = postgres_url(Path("/tmp/a dir/postgres"), 5433, "crm")
    assert url == "postgresql://postgres@/crm?host=/tmp/a%20dir/postgres&port=5433"
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    assert query == {"host": ["/tmp/a dir/postgres"], "port": ["5433"]}
    assert postgres_url(Path("/" + "p" * UNIX_SOCKET_PATH_MAX), 5433, "crm") is None
