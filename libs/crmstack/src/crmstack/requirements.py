"""`make requirements`: every hashed requirement file, compiled with uv.

- `requirements/dev.txt` from `requirements/dev.in`: what `make install` puts in `.venv`.
- `services/<name>/requirements.txt`, one per image: the dependencies the service's
  `pyproject.toml` names plus those of crmkit and crm-proto, pinned to the versions of dev.txt
  (a constraint), so an image runs exactly what the tests ran.
- `requirements/proto.txt`: grpcio-tools for the images' code-generation stage.

Only the standard library is used here, so it runs before `.venv` exists (it builds dev.txt).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

# Packages of this repository: copied into images as source, never resolved from an index.
FIRST_PARTY_LIBS = {"crmkit": "libs/crmkit", "crm-proto": "libs/crm-proto"}
TARGET = ["--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28"]
DEV_CONSTRAINT = "requirements/dev.txt"


def project_dependencies(pyproject: Path) -> list[str]:
    """The `[project] dependencies` of a pyproject.toml, first-party names left out."""
    data = tomllib.loads(pyproject.read_text())
    names: list[str] = data["project"].get("dependencies", [])
    return [name for name in names if _name(name) not in FIRST_PARTY_LIBS]


def service_inputs(root: Path, service: str) -> list[str]:
    """Everything the image of `service` needs from an index: its own and its libraries' deps."""
    wanted: list[str] = []
    sources = [root / "services" / service, *(root / lib for lib in FIRST_PARTY_LIBS.values())]
    for source in sources:
        for requirement in project_dependencies(source / "pyproject.toml"):
            if _name(requirement) not in {_name(seen) for seen in wanted}:
                wanted.append(requirement)
    return sorted(wanted, key=_name)


def services(root: Path) -> list[str]:
    """Every service folder (a pyproject.toml and a package under src/): each builds an image
    from deploy/images/Dockerfile."""
    return sorted(
        path.name
        for path in (root / "services").iterdir()
        if (path / "pyproject.toml").is_file() and (path / "src" / path.name).is_dir()
    )


def _name(requirement: str) -> str:
    """The normalised project name of a requirement line (`nats-py>=2` -> `nats-py`)."""
    for index, char in enumerate(requirement):
        if not (char.isalnum() or char in "-_."):
            requirement = requirement[:index]
            break
    return requirement.strip().lower().replace("_", "-").replace(".", "-")


def _compile(uv: str, root: Path, output: str, source: str, stdin: str | None = None) -> None:
    # dev.txt keeps the exact command of docs/development.md in its header; the others are
    # constrained to its pins and name `make requirements` as the way to regenerate them.
    command = [uv, "pip", "compile", source, "--generate-hashes", *TARGET]
    if output != DEV_CONSTRAINT:
        command += ["--constraint", DEV_CONSTRAINT, "--custom-compile-command", "make requirements"]
    command += ["-o", output]
    print(f"compiling {output}", flush=True)
    subprocess.run(command, cwd=root, input=stdin, text=True, check=True, capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(prog="make requirements", description=__doc__)
    parser.add_argument("--uv", default="uv", help="the uv executable")
    parser.add_argument("--root", type=Path, default=Path.cwd())
    args = parser.parse_args()
    uv = shutil.which(args.uv)
    if uv is None:
        sys.stderr.write(
            f"make requirements needs uv: {args.uv!r} not found (set UV=/path/to/uv)\n"
        )
        return 2
    root: Path = args.root.resolve()
    try:
        _compile(uv, root, DEV_CONSTRAINT, "requirements/dev.in")
        _compile(uv, root, "requirements/proto.txt", "requirements/proto.in")
        for service in services(root):
            inputs = "\n".join(service_inputs(root, service)) + "\n"
            _compile(uv, root, f"services/{service}/requirements.txt", "-", stdin=inputs)
    except subprocess.CalledProcessError as exc:
        sys.stderr.write(exc.stderr)
        sys.stderr.write(f"uv failed (exit {exc.returncode}); stopped there\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
