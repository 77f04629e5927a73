"""Every service's console script ([project.scripts] in its pyproject.toml) starts: it names a
zero-argument function that answers `--help` and, without configuration, exits with one line
naming the missing variables. Each is called as the installed script's wrapper calls it
(`make install` puts the sources on the path without installing scripts); `python -m <service>`,
as the images run it, calls the same function."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

SERVICES = Path(__file__).resolve().parents[2] / "services"


def _console_scripts() -> list[tuple[str, str]]:
    scripts = []
    for pyproject in sorted(SERVICES.glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        scripts += sorted(project.get("scripts", {}).items())
    return scripts


SCRIPTS = _console_scripts()


def _run(target: str, *args: str) -> subprocess.CompletedProcess[str]:
    module, _, function = target.partition(":")
    return subprocess.run(
        [sys.executable, "-c", f"from {module} import {function}; {function}()", *args],
        env={"PATH": "/usr/bin:/bin"},  # nothing of this machine's configuration
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_every_grpc_service_has_a_console_script() -> None:
    names = {name for name, _ in SCRIPTS}
    assert {"crm-records", "crm-metadata", "crm-identity", "crm-webhooks", "crm-workflows"} <= names


@pytest.mark.parametrize(("name", "target"), SCRIPTS, ids=[name for name, _ in SCRIPTS])
def test_the_console_script_starts_and_names_missing_settings(name: str, target: str) -> None:
    result = _run(target)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("configuration error: "), result.stderr
    assert "APP_SECRET: Field required" in result.stderr


@pytest.mark.parametrize(
    ("name", "target"),
    [s for s in SCRIPTS if s[0] != "crm-gateway"],
    ids=[name for name, _ in SCRIPTS if name != "crm-gateway"],
)
def test_the_console_script_answers_help(name: str, target: str) -> None:
    result = _run(target, "--help")
    assert result.returncode == 0, result.stderr
    assert "serve (default) or apply database migrations" in result.stdout
