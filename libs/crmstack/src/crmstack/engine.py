"""The container engine of `make images` and `make container-test`: Docker where an engine
answers, otherwise podman/buildah configured under the project's own state folder.

podman runs with the settings this kind of machine needs (docs/deploy.md, "Containers without
Docker"): runc (crun refuses hybrid cgroups), cgroupfs and a file events log (no systemd),
ulimits no higher than the hard limits. Its configuration and storage live in `.containers/`
(CONTAINERS_CONF, CONTAINERS_STORAGE_CONF) so the machine's own settings stay untouched. No
registry is needed: when the Dockerfile's base image cannot be pulled, one is made from Debian's
packages (debootstrap from the mirror in the machine's apt sources).
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from crmstack.processes import say

STATE_DIR = ".containers"
DOCKERFILE = "deploy/images/Dockerfile"
INFRA_DOCKERFILE = "deploy/images/infra.Dockerfile"
# The base image the service Dockerfile names, and the registry-free stand-in made when it
# cannot be pulled.
LOCAL_BASE = "localhost/crm-base:bookworm"
INFRA_IMAGE = "localhost/crm-infra:bookworm"
APT_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
APT_SOURCES_LIST = Path("/etc/apt/sources.list")
# Mounted read-only into every build step (never copied into a layer): the package registry
# is reached only with the host's CA bundle and pip configuration.
BUILD_MOUNTS = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pip.conf")
PACKAGES = ("podman", "buildah", "debootstrap", "runc")
MAX_NPROC = 32768
PULL_TIMEOUT = 90.0


class EngineError(RuntimeError):
    """The engine cannot be set up or a command failed; the message is the one line to show."""


def run(
    command: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 1800,
) -> None:
    say("$ " + " ".join(command))
    try:
        result = subprocess.run(command, env=env, cwd=cwd, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise EngineError(
            f"`{' '.join(command[:3])} ...` took longer than {timeout:.0f}s"
        ) from None
    if result.returncode != 0:
        raise EngineError(
            f"`{' '.join(command[:3])} ...` failed with exit code {result.returncode}"
        )


def wait_healthy(url: str, timeout: float) -> None:
    """Until `url`/healthz answers 200 (the podman and the kind stacks alike)."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=5) as response:
                if response.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            last = f"{exc.code}: {exc.read()[:300]!r}"
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            last = str(exc)
        time.sleep(1)
    raise EngineError(f"{url}/healthz not 200 after {timeout:.0f}s (last: {last})")


def docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        result = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0 and bool(result.stdout.strip())


def apt_usable() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def why_no_podman() -> str | None:
    """None when podman is present or can be installed here; otherwise the reason it cannot."""
    if shutil.which("podman") is not None:
        return None
    if os.geteuid() != 0:
        return "podman is not installed and installing it needs root"
    if shutil.which("apt-get") is None:
        return "podman is not installed and apt-get is not available to install it"
    return None


def install_packages() -> None:
    """podman, buildah, debootstrap and runc from Debian's packages, when any is missing."""
    missing = [name for name in PACKAGES if shutil.which(name) is None]
    if not missing:
        return
    reason = why_no_podman()
    if reason is not None or not apt_usable():
        raise EngineError(reason or f"{', '.join(missing)} missing and apt-get is not usable")
    say(f"installing {' '.join(PACKAGES)} from Debian's packages")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-qq", *PACKAGES]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        run(["apt-get", "update", "-qq"], env=env, timeout=600)
        run(install, env=env, timeout=900)


def apt_mirror(sources: Path = APT_SOURCES, legacy: Path = APT_SOURCES_LIST) -> str:
    """The Debian mirror of the machine's apt sources (deb822 first, then sources.list)."""
    if sources.exists():
        for line in sources.read_text().splitlines():
            match = re.match(r"^URIs:\s*(\S+)", line)
            if match and "security" not in match.group(1):
                return match.group(1)
    if legacy.exists():
        for line in legacy.read_text().splitlines():
            match = re.match(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)", line)
            if match and "security" not in match.group(1):
                return match.group(1)
    raise EngineError(f"no Debian mirror found in {sources} or {legacy}")


def containers_conf(nofile_hard: int) -> str:
    nofile = nofile_hard if nofile_hard != resource.RLIM_INFINITY else 1048576
    nproc = MAX_NPROC
    return (
        "# Written by crmstack.engine: the settings this machine needs (docs/deploy.md).\n"
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
    )


def storage_conf(state: Path) -> str:
    return (
        "# Written by crmstack.engine: images and containers under the project's state folder.\n"
        "[storage]\n"
        'driver = "overlay"\n'
        f'graphroot = "{state / "storage"}"\n'
        f'runroot = "{state / "run"}"\n'
    )


@dataclass(frozen=True)
class Engine:
    """One container CLI (docker or podman) with the environment it runs under."""

    command: str
    env: dict[str, str]

    @property
    def is_podman(self) -> bool:
        return self.command == "podman"

    def argv(self, *args: str) -> list[str]:
        return [self.command, *args]

    def run(self, *args: str, timeout: float = 1800) -> None:
        run(self.argv(*args), env=self.env, timeout=timeout)

    def output(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        result = subprocess.run(
            self.argv(*args), env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and result.returncode != 0:
            raise EngineError(
                f"`{self.command} {' '.join(args[:2])} ...` failed: {result.stderr.strip()[-400:]}"
            )
        return result.stdout

    def succeeds(self, *args: str, timeout: float = 120) -> bool:
        try:
            result = subprocess.run(
                self.argv(*args), env=self.env, capture_output=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return False
        return result.returncode == 0

    def image_exists(self, name: str) -> bool:
        if self.is_podman:
            return self.succeeds("image", "exists", name)
        return self.succeeds("image", "inspect", name)

    def image_size(self, name: str) -> int:
        return int(self.output("image", "inspect", "--format", "{{.Size}}", name).strip())


def podman(root: Path) -> Engine:
    """podman with the project's containers.conf and storage.conf (written on every call)."""
    install_packages()
    state = (root / STATE_DIR).resolve()
    state.mkdir(parents=True, exist_ok=True)
    conf = state / "containers.conf"
    storage = state / "storage.conf"
    conf.write_text(containers_conf(resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    storage.write_text(storage_conf(state))
    env = dict(os.environ, CONTAINERS_CONF=str(conf), CONTAINERS_STORAGE_CONF=str(storage))
    return Engine("podman", env)


def engine(root: Path) -> Engine:
    """Docker when an engine answers, podman otherwise (installed when missing and possible)."""
    if docker_answers():
        return Engine("docker", dict(os.environ))
    reason = why_no_podman()
    if reason is not None:
        raise EngineError(f"no Docker engine answers and {reason}")
    return podman(root)


def dockerfile_base(root: Path) -> str:
    match = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", (root / DOCKERFILE).read_text(), re.MULTILINE)
    if match is None:
        raise EngineError(f"{DOCKERFILE} names no ARG PYTHON_IMAGE")
    return match.group(1)


def debootstrap_image(
    engine: Engine, name: str, include: Sequence[str], *, suite: str = "bookworm"
) -> None:
    """An image from Debian's packages (debootstrap minbase + `include`), no registry involved."""
    mirror = apt_mirror()
    cache = Path(engine.env["CONTAINERS_CONF"]).parent / "debootstrap-cache"
    cache.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="crm-rootfs-", dir=engine.env.get("TMPDIR")) as tmp:
        rootfs = Path(tmp) / "rootfs"
        run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--cache-dir={cache}",
                f"--include={','.join(include)}",
                suite,
                str(rootfs),
                mirror,
            ],
            timeout=1800,
        )
        shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
        (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
        for lists in (rootfs / "var/lib/apt/lists").glob("*_Packages"):
            lists.unlink()
        say(f"importing {name}")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            engine.argv(
                "import",
                "--change",
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--change",
                "ENV LANG=C.UTF-8",
                "-",
                name,
            ),
            env=engine.env,
            stdin=tar.stdout,
            stdout=subprocess.DEVNULL,
        )
        tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise EngineError(f"importing {name} failed")


def base_image(engine: Engine, root: Path) -> str:
    """The base the service images build on: the Dockerfile's named image when it is present or
    can be pulled, else the registry-free one (built once, then reused)."""
    named = dockerfile_base(root)
    if engine.image_exists(named):
        return named
    if not engine.is_podman:
        return named  # docker build pulls it
    if engine.image_exists(LOCAL_BASE):
        say(f"base image: {LOCAL_BASE} (made from Debian's packages earlier)")
        return LOCAL_BASE
    say(f"pulling {named} (up to {PULL_TIMEOUT:.0f}s)")
    if engine.succeeds("pull", "--quiet", f"docker.io/library/{named}", timeout=PULL_TIMEOUT):
        return f"docker.io/library/{named}"
    say(f"{named} cannot be pulled: making {LOCAL_BASE} from Debian's packages (about a minute)")
    # python3-pip: the build stage runs `python3 -m pip --python VENV`, as in the python image.
    debootstrap_image(
        engine, LOCAL_BASE, ("python3", "python3-venv", "python3-pip", "ca-certificates")
    )
    return LOCAL_BASE


def build_args(engine: Engine) -> list[str]:
    """The options every podman build gets: host network, the host's CA bundle and pip config
    mounted read-only, so that they never enter a layer."""
    if not engine.is_podman:
        return []
    options = ["--network", "host"]
    for path in BUILD_MOUNTS:
        if Path(path).exists():
            options += ["-v", f"{path}:{path}:ro"]
    return options


IMAGE_REPOSITORY = "crm"


def image_name(service: str, tag: str, repository: str = IMAGE_REPOSITORY) -> str:
    return f"{repository}-{service}:{tag}"


# The ports each image documents (EXPOSE): the gateway serves HTTP, the others gRPC and metrics.
EXPOSED_PORTS = {"gateway": "3000"}
GRPC_EXPOSED_PORTS = "50051 9464"


def build_services(engine: Engine, root: Path, services: Sequence[str], tag: str) -> list[str]:
    """Every service image from the one Dockerfile (ARG SERVICE), printing progress per image."""
    base = base_image(engine, root)
    names = []
    for number, service in enumerate(services, start=1):
        name = image_name(service, tag)
        say(f"[{number}/{len(services)}] building {name}")
        started = time.monotonic()
        engine.run(
            "build",
            *build_args(engine),
            "-f",
            DOCKERFILE,
            "--build-arg",
            f"SERVICE={service}",
            "--build-arg",
            f"PORTS={EXPOSED_PORTS.get(service, GRPC_EXPOSED_PORTS)}",
            "--build-arg",
            f"PYTHON_IMAGE={base}",
            "-t",
            name,
            str(root),
        )
        size = engine.image_size(name) / 1e6
        took = time.monotonic() - started
        say(f"[{number}/{len(services)}] {name}: {size:.0f} MB in {took:.0f}s")
        names.append(name)
    return names


def build_infra(engine: Engine, root: Path) -> str:
    """PostgreSQL, Redis and NATS in one image built from Debian's packages on the local base."""
    base = LOCAL_BASE if engine.image_exists(LOCAL_BASE) else base_image(engine, root)
    say(f"building {INFRA_IMAGE} (PostgreSQL, Redis, NATS from Debian's packages)")
    engine.run(
        "build",
        *build_args(engine),
        "-f",
        INFRA_DOCKERFILE,
        "--build-arg",
        f"BASE_IMAGE={base}",
        "-t",
        INFRA_IMAGE,
        str(root / "deploy" / "images"),
    )
    return INFRA_IMAGE
