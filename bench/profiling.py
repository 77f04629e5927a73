"""Sampling profiles of the stack's services while one workload runs (`bench/run.py --profile`).

`py-spy record --format raw` attaches to each chosen service process (by PID, non-blocking) when
a workload starts and is interrupted when it ends; its collapsed stacks go to
`bench/results/profiles/<workload>.<service>.txt`, and `summarize()` turns one into the top
functions by own time and by inclusive time (what docs/benchmarks.md quotes). py-spy needs
ptrace permission on the target (root, or kernel.yama.ptrace_scope 0); without it the run goes
on and the reason is printed.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

_FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Profiler:
    """Profiles the named processes around a workload; a no-op when `pids` is empty."""

    def __init__(self, pids: dict[str, int], out_dir: Path) -> None:
        self.pids = pids
        self.out_dir = out_dir
        self.binary = _py_spy() if pids else None
        if pids and self.binary is None:
            print("profiling off: py-spy is not installed (pip install py-spy)", flush=True)

    @asynccontextmanager
    async def __call__(self, workload: str) -> AsyncIterator[None]:
        if not self.binary:
            yield
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        running: list[tuple[str, asyncio.subprocess.Process, Path]] = []
        for service, pid in self.pids.items():
            out = self.out_dir / f"{workload}.{service}.txt"
            out.unlink(missing_ok=True)
            process = await asyncio.create_subprocess_exec(
                *(self.binary, "record", "--pid", str(pid), "--format", "raw", "--rate", "200"),
                *("--nonblocking", "--output", str(out)),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            running.append((service, process, out))
        await asyncio.sleep(0.5)  # attached before the first request
        try:
            yield
        finally:
            for service, process, out in running:
                if process.returncode is None:
                    process.send_signal(signal.SIGINT)
                try:
                    _, err = await asyncio.wait_for(process.communicate(), timeout=30)
                except TimeoutError:
                    process.kill()
                    err = b"timed out writing the profile"
                if not out.exists():
                    reason = err.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
                    print(f"  no profile of {service} for {workload}: {reason[0]}", flush=True)


def _parse(path: Path) -> Counter[tuple[str, ...]]:
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in path.read_text().splitlines():
        head, _, count = line.rpartition(" ")
        if head and count.isdigit():
            stacks[tuple(head.split(";"))] += int(count)
    return stacks


def _short(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    file = re.sub(r"^.*/(site-packages|src|lib/python3\.\d+)/", "", match["file"])
    return f"{match['function']} ({file})"


def summarize(path: Path, top: int = 12) -> str:
    """Top functions of one collapsed-stack profile: own samples and inclusive samples."""
    stacks = _parse(path)
    total = sum(stacks.values())
    if not total:
        return f"{path.name}: no samples"
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for frames, count in stacks.items():
        names = [_short(frame) for frame in frames]
        own[names[-1]] += count
        for name in set(names):
            inclusive[name] += count
    lines = [f"{path.name}: {total} samples"]
    lines.append("  own time:")
    lines += [f"    {100 * n / total:5.1f}%  {name}" for name, n in own.most_common(top)]
    lines.append("  inclusive (project code):")
    ours = [
        (name, n)
        for name, n in inclusive.most_common()
        if any(f"({package}/" in name for package in ("gateway", "records", "crmkit", "webhooks"))
    ]
    lines += [f"    {100 * n / total:5.1f}%  {name}" for name, n in ours[:top]]
    return "\n".join(lines)


def main() -> None:
    for name in sys.argv[1:]:
        print(summarize(Path(name)))


if __name__ == "__main__":
    main()
