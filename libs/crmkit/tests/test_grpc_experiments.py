"""Every process starts gRPC with crmkit's GRPC_EXPERIMENTS default (read at `import grpc`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from crmkit import GRPC_EXPERIMENTS_DEFAULT

SERVICE_ENTRY_MODULES = [
    "gateway.__main__",
    "identity.__main__",
    "metadata.__main__",
    "records.__main__",
    "webhooks.__main__",
    "workflows.__main__",
]

# Prints GRPC_EXPERIMENTS as it is when the first `import grpc` starts, then imports the module.
WATCH_FIRST_GRPC_IMPORT = """
import os, sys

class FirstGrpcImport:
    def find_spec(self, name, path=None, target=None):
        if name == "grpc":
            print("GRPC_EXPERIMENTS=" + os.environ.get("GRPC_EXPERIMENTS", "<unset>"), flush=True)
            sys.meta_path.remove(self)
        return None

sys.meta_path.insert(0, FirstGrpcImport())
import {module}
"""


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-c", code],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


@pytest.mark.parametrize("module", SERVICE_ENTRY_MODULES)
def test_every_service_has_the_default_before_grpc_is_imported(module: str) -> None:
    result = _python(WATCH_FIRST_GRPC_IMPORT.format(module=module))
    assert result.stdout.splitlines()[0] == f"GRPC_EXPERIMENTS={GRPC_EXPERIMENTS_DEFAULT}"


def test_an_operators_setting_wins() -> None:
    result = _python(WATCH_FIRST_GRPC_IMPORT.format(module="records.__main__"), GRPC_EXPERIMENTS="")
    assert result.stdout.splitlines()[0] == "GRPC_EXPERIMENTS="


def test_this_grpcio_knows_the_experiments_it_is_told_to_turn_off() -> None:
    """grpc logs `Unknown experiment: <name>` for names it no longer has (a grpcio upgrade that
    made them permanent): then the default in crmkit/__init__.py has to be revisited."""
    result = _python("import crmkit, grpc; grpc.insecure_channel('127.0.0.1:1').close()")
    assert "Unknown experiment" not in result.stderr
    bogus = _python("import grpc", GRPC_EXPERIMENTS="-no_such_experiment")
    assert "Unknown experiment: no_such_experiment" in bogus.stderr
