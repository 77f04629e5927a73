"""The garbage collector's share of each service's CPU during a bench run
(`bench/peer.py --gc`): the stack's Python processes import `bench/gc_probe/sitecustomize.py`,
which counts each generation's collections and their CPU time (docs/benchmarks.md, "The
collector after startup")."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

PROBE = Path(__file__).resolve().parent / "gc_probe"


def probe_env(folder: Path) -> dict[str, str]:
    """The environment that makes a stack's Python processes report to `folder` (the caller's
    PYTHONPATH kept after the probe, so `PYTHONPATH=<another checkout>` still applies)."""
    inherited = os.environ.get("PYTHONPATH", "")
    path = str(PROBE) + (os.pathsep + inherited if inherited else "")
    return {"GC_PROBE_DIR": str(folder), "PYTHONPATH": path}


def _name(program: str) -> str:
    script, *arguments = program.split(" ")
    path = Path(script)
    name = path.parent.name if path.name == "__main__.py" else path.stem
    return f"{name} migrate" if "migrate" in arguments else name


def report(folder: Path) -> list[str]:
    """One line per process that reported, busiest first: collections per generation, the
    collector's CPU and its share of the process's."""
    found: list[dict[str, Any]] = []
    for path in folder.glob("*.json"):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    lines = []
    for item in sorted(found, key=lambda entry: -float(entry["cpu_seconds"])):
        cpu = float(item["cpu_seconds"])
        spent = sum(item["collector_seconds"])
        share = 100 * spent / cpu if cpu > 0 else 0.0
        counts = " / ".join(str(n) for n in item["collections"])
        lines.append(
            f"{_name(item['program']):<18} collections (young / middle / full) {counts:<18} "
            f"collector {spent:.2f} s of {cpu:.1f} s CPU ({share:.1f}%), "
            f"threshold {item['threshold'][0]}, frozen {item['frozen']}"
        )
    return lines
