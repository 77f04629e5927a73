"""Free loopback ports.

A port handed out here is free when it is picked and stays this process's until it exits, even
before the server it is meant for binds it:
- it lies below the kernel's ephemeral range, so no outbound connection (a service's connection
  to PostgreSQL, opened between the pick and the bind) can take it as its source port; port 0
  handed out ports from that very range, and one such collision failed a CI run;
- a lock file claims it against other launchers on this machine (two test workers starting
  stacks at once), released by the kernel when the claiming process ends.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Below the ephemeral range, far enough above the ports servers usually take (3000, 5432, 8080).
_LOWEST = 15000
_DEFAULT_EPHEMERAL_LOW = 32768
_ATTEMPTS = 200
# Open claim files by port: closing one (or this process ending) releases the claim.
_claims: dict[int, int] = {}


def _picking_range() -> range:
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = _DEFAULT_EPHEMERAL_LOW
    return range(_LOWEST, low) if low - _LOWEST >= 1000 else range(0)


def _claim_folder() -> Path:
    folder = Path(tempfile.gettempdir()) / "crmstack-ports"
    if not folder.is_dir():
        folder.mkdir(exist_ok=True)
        # Shared by every user's launchers, like /tmp itself (mkdir's mode is cut by the umask).
        with contextlib.suppress(OSError):
            folder.chmod(0o1777)
    return folder


def _claim(port: int) -> bool:
    """Whether this process now holds the machine-wide claim on port."""
    if port in _claims:
        return False
    path = _claim_folder() / str(port)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)  # flock needs no write access
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    _claims[port] = fd
    return True


def release_port(port: int) -> None:
    """Give a port picked by free_port back (its server has stopped)."""
    fd = _claims.pop(port, None)
    if fd is not None:
        os.close(fd)


def free_port(host: str = "127.0.0.1") -> int:
    candidates = _picking_range()
    if candidates:
        for _ in range(_ATTEMPTS):
            port = random.choice(candidates)  # noqa: S311 (spreading picks, not a secret)
            if _claim(port):
                if port_is_free(port, host):
                    return port
                release_port(port)
    # No room below the ephemeral range (or all of it taken): let the kernel choose.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def wait_for_port(port: int, timeout: float, host: str = "127.0.0.1") -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.2)
            if sock.connect_ex((host, port)) == 0:
                return True
        time.sleep(0.05)
    return False
