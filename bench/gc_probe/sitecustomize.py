"""Imported at start-up by every Python process with this folder on PYTHONPATH (bench/collector.py):
while GC_PROBE_DIR is set, the garbage collector's collections and CPU time per generation are
written to GC_PROBE_DIR/<pid>.json every second, with the process's own CPU time."""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

_FOLDER = os.environ.get("GC_PROBE_DIR")
_started: dict[int, float] = {}
_counts = [0, 0, 0]
_seconds = [0.0, 0.0, 0.0]


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    generation = int(info["generation"])
    now = time.thread_time()
    if phase == "start":
        _started[generation] = now
        return
    _counts[generation] += 1
    _seconds[generation] += now - _started.pop(generation, now)


def _write(path: Path) -> None:
    while True:
        time.sleep(1.0)
        report = {
            "program": " ".join(sys.argv)[:200],
            "cpu_seconds": time.process_time(),
            "collections": _counts,
            "collector_seconds": _seconds,
            "threshold": gc.get_threshold(),
            "frozen": gc.get_freeze_count(),
        }
        partial = path.with_suffix(".part")
        partial.write_text(json.dumps(report))
        partial.replace(path)


if _FOLDER:
    gc.callbacks.append(_on_collection)
    threading.Thread(
        target=_write, args=(Path(_FOLDER) / f"{os.getpid()}.json",), daemon=True
    ).start()
