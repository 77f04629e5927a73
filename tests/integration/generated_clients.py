"""Throwaway environments for the third-party client generators of test_generated_clients.py.

Each generator is installed, at a pinned version, into its own virtualenv under a temporary
folder: their dependencies clash with the project's pins (ariadne-codegen wants graphql-core
< 3.3 and ruff < 0.16), and the generated code runs in that environment too. The environments
come from the package registry as pip is configured on the machine; when the registry cannot be
reached the tests skip saying so, and any other install failure fails them.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

OPENAPI_TOOLS = (
    "openapi-python-client==0.29.1",
    "openapi-spec-validator==0.9.0",
    "python-dateutil",  # what the generated client imports
)
GRAPHQL_TOOLS = ("ariadne-codegen==0.19.0",)
# pip's words for "the registry could not be reached" (as opposed to a bad pin or a build error).
_UNREACHABLE = (
    "Failed to establish a new connection",
    "NewConnectionError",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Connection refused",
    "ConnectTimeoutError",
    "Read timed out",
)


class Environment:
    """A virtualenv for `packages`; `install` makes it, `run` executes its programs."""

    def __init__(self, folder: Path, packages: tuple[str, ...]) -> None:
        self.folder = folder
        self.packages = packages

    def install(self) -> Environment:
        """Create the virtualenv and install its packages (the project's pip drives it, without
        byte-compiling: the generators run once). Skips when the registry is unreachable."""
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(self.folder)],
            check=True,
            timeout=300,
        )
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(self.bin("python")),
                "install",
                "--quiet",
                "--no-compile",
                "--disable-pip-version-check",
                *self.packages,
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if result.returncode != 0:
            output = result.stdout + result.stderr
            if any(marker in output for marker in _UNREACHABLE):
                pytest.skip(f"the package registry is unreachable: cannot install {self.packages}")
            raise AssertionError(f"pip install {self.packages} failed:\n{output[-3000:]}")
        return self

    def bin(self, name: str) -> Path:
        return self.folder / "bin" / name

    def run(self, *command: str, cwd: Path, env: dict[str, str] | None = None) -> str:
        """The command's output; AssertionError with its output when it fails."""
        path = f"{self.folder / 'bin'}:/usr/local/bin:/usr/bin:/bin"
        result = subprocess.run(
            list(command),
            capture_output=True,
            text=True,
            cwd=cwd,
            env={"PATH": path, "HOME": str(cwd), **(env or {})},
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, (command, result.stdout[-3000:], result.stderr[-3000:])
        return result.stdout


def install_together(folder: Path) -> dict[str, Future[Environment]]:
    """Both generators' environments, installed at once (the time is mostly the registry's)."""
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="generator-install")
    futures = {
        "openapi": pool.submit(Environment(folder / "openapi-venv", OPENAPI_TOOLS).install),
        "graphql": pool.submit(Environment(folder / "ariadne-venv", GRAPHQL_TOOLS).install),
    }
    pool.shutdown(wait=False)
    return futures
