"""Unix sockets between the processes of one host.

On one host the launcher's processes reach PostgreSQL and each other's gRPC servers through Unix
sockets instead of TCP over loopback: a message then skips the TCP stack on both sides (on
loopback the sender's system call runs the receiver's TCP input too). Measured on the REST
create and list at 16 connections (docs/benchmarks.md, seventh reading): -4% CPU per request,
+3% requests/s. The TCP ports stay open beside them for health checks, grpcurl and tools; a path
longer than a socket's address can hold (a deep data directory) keeps TCP.
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

# sun_path holds 108 bytes with the terminating NUL.
UNIX_SOCKET_PATH_MAX = 107


def fits(path: Path) -> bool:
    """Whether `path` can be a Unix socket's address."""
    return len(os.fsencode(path)) <= UNIX_SOCKET_PATH_MAX


def grpc_socket(data_dir: Path, name: str) -> Path | None:
    """The socket process `name` serves gRPC on besides its port, or None to keep TCP only."""
    path = data_dir / "sockets" / f"{name}.sock"
    return path if fits(path) else None


def postgres_url(socket_dir: Path, port: int, database: str) -> str | None:
    """The URL of the embedded PostgreSQL through its socket in `socket_dir` (its `-k`), or
    None when the socket's path is too long."""
    if not fits(socket_dir / f".s.PGSQL.{port}"):
        return None
    host = urllib.parse.quote(str(socket_dir), safe="/")
    return f"postgresql://postgres@/{database}?host={host}&port={port}"
