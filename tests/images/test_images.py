"""What the service images are built from: one Dockerfile, hashed requirements, build context."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from crmstack.requirements import FIRST_PARTY_LIBS, service_inputs, services
from crmstack.stack import ALL_SERVICES

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "images" / "Dockerfile"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\]+)")


def pins(path: Path) -> dict[str, str]:
    """name -> version of a hashed requirement file, checking that every pin carries hashes."""
    found: dict[str, str] = {}
    current: str | None = None
    hashes = 0
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        assert not stripped.startswith("-") or stripped.startswith("--hash="), (
            f"{path}: option line {stripped!r} (no index or find-links lines allowed)"
        )
        match = PIN.match(stripped)
        if match:
            assert current is None or hashes, f"{path}: {current} has no hash"
            current, hashes = match.group(1).lower(), 0
            found[current] = match.group(2)
        elif stripped.startswith("--hash=sha256:"):
            hashes += 1
        else:
            raise AssertionError(f"{path}: unexpected line {stripped!r}")
    assert current is None or hashes, f"{path}: {current} has no hash"
    return found


def normalise(name: str) -> str:
    return re.split(r"[^A-Za-z0-9._-]", name, maxsplit=1)[0].lower().replace("_", "-")


def test_every_service_builds_an_image() -> None:
    assert services(ROOT) == sorted(ALL_SERVICES)


def test_one_dockerfile_is_multi_stage_pinned_and_non_root() -> None:
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.MULTILINE)
    assert base is not None
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+", base.group(1)), base.group(1)
    stages = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    assert stages == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    build, runtime = text.split("\nFROM ")[1:]
    assert "ARG SERVICE\n" in build
    assert "ARG SERVICE\n" in runtime
    assert "COPY --from=build /opt/crm /opt/crm" in runtime
    user = re.search(r"^USER (\d+):(\d+)$", runtime, re.MULTILINE)
    assert user is not None
    assert int(user.group(1)) > 0
    assert int(user.group(2)) > 0
    assert "CRM_SERVICE=${SERVICE}" in runtime
    assert 'exec python -m \\"$CRM_SERVICE\\" \\"$@\\"' in runtime  # PID 1, args passed on
    copy = "COPY services/${SERVICE}/requirements.txt services/${SERVICE}/"
    assert copy in build
    # A layer keyed on SERVICE comes first, or services with equal requirements share a layer.
    assert build.index('RUN mkdir -p "services/${SERVICE}"') < build.index(copy)
    assert 'RUN deploy/images/assemble.sh deps "${SERVICE}" /opt/crm' in build
    assert 'RUN deploy/images/assemble.sh app "${SERVICE}" /opt/crm' in build
    # Only the named service's files enter its image: every service path goes through SERVICE.
    assert not re.findall(r"services/(?!\$\{SERVICE\})", text)


def test_no_service_keeps_a_dockerfile_of_its_own() -> None:
    assert not sorted(ROOT.glob("services/*/Dockerfile"))


@pytest.mark.parametrize("service", ALL_SERVICES)
def test_images_are_built_with_the_service_and_its_ports(service: str) -> None:
    """`make images` passes SERVICE (and the ports the image documents) to the one recipe."""
    from crmstack.engine import EXPOSED_PORTS, GRPC_EXPOSED_PORTS, Engine, build_services

    commands: list[tuple[str, ...]] = []

    class Recording(Engine):
        def run(self, *args: str, timeout: float = 1800) -> None:
            commands.append(args)

        def image_exists(self, name: str) -> bool:
            return True

        def image_size(self, name: str) -> int:
            return 0

    built = build_services(Recording("docker", {}), ROOT, [service], "t")
    assert built == [f"crm-{service}:t"]
    (command,) = commands
    assert command[command.index("-f") + 1] == "deploy/images/Dockerfile"
    assert f"SERVICE={service}" in command
    ports = EXPOSED_PORTS.get(service, GRPC_EXPOSED_PORTS)
    assert f"PORTS={ports}" in command
    assert command[-1] == str(ROOT)


def test_build_stage_installs_only_hash_checked_wheels() -> None:
    script = (ROOT / "deploy" / "images" / "assemble.sh").read_text()
    install = script[script.index("install_hashed() {") : script.index("}\n")]
    for flag in ("--require-hashes", "--no-deps", "--only-binary=:all:", "--no-cache-dir"):
        assert flag in install
    assert script.count("install_hashed ") == 2  # the runtime venv and the codegen venv
    assert 'proto/generate.sh "$dest.codegen/bin/python" "$dest/app"' in script
    assert "compileall" in script  # bytecode is written at build time: the root fs is read-only


@pytest.mark.parametrize("service", ALL_SERVICES)
def test_requirements_cover_the_service_and_its_libraries_at_dev_versions(service: str) -> None:
    requirements = pins(ROOT / "services" / service / "requirements.txt")
    development = pins(ROOT / "requirements" / "dev.txt")
    wanted = {normalise(name) for name in service_inputs(ROOT, service)}
    assert wanted, service
    assert wanted <= set(requirements), wanted - set(requirements)
    assert not set(FIRST_PARTY_LIBS) & set(requirements), (
        "first-party code is copied, not installed"
    )
    for name, version in requirements.items():
        assert development.get(name) == version, (
            f"{name}: image {version}, dev {development.get(name)}"
        )


def test_service_inputs_include_the_libraries_dependencies() -> None:
    records = {normalise(name) for name in service_inputs(ROOT, "records")}
    assert {"grpcio", "protobuf", "pydantic-settings", "sqlalchemy", "asyncpg"} <= records
    assert not records & set(FIRST_PARTY_LIBS)
    assert "fastapi" not in records  # the gateway's, not records'


def test_codegen_requirements_pin_grpcio_tools_like_dev() -> None:
    proto = pins(ROOT / "requirements" / "proto.txt")
    development = pins(ROOT / "requirements" / "dev.txt")
    assert proto["grpcio-tools"] == development["grpcio-tools"]
    assert all(development.get(name) == version for name, version in proto.items())


def test_build_context_leaves_out_local_state() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {
        ".git",
        ".venv",
        ".data",
        ".containers",
        "libs/crm-proto/src/crm",
        "**/__pycache__",
    } <= ignored
