"""What every benchmark in bench/ shares: the result row, percentiles, the table and JSON output.

A benchmark module exposes `async def run(ctx: BenchContext) -> list[Result]`; `make bench`
(and `make bench-smoke`, which `make test` runs) collects every module's rows into one table and
`bench/results/latest.json`. Budgets are stated here, beside the number they bound, and never
asserted in tests.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson


@dataclass
class BenchContext:
    base_url: str
    smoke: bool  # seconds-long run that proves the code works; numbers are not meaningful
    database_url: str = ""
    redis_url: str = ""
    nats_url: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Result:
    operation: str
    concurrency: int
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    floor_p50_ms: float | None = None  # the same operation done directly (asyncpg), if any
    budget: str = ""
    passed: bool | None = None  # None when there is no budget
    notes: str = ""

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def ratio_to_floor(self) -> float | None:
        if self.floor_p50_ms is None or self.floor_p50_ms <= 0:
            return None
        return self.p50_ms / self.floor_p50_ms

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["requests_per_second"] = round(self.requests_per_second, 1)
        ratio = self.ratio_to_floor
        data["ratio_to_floor"] = None if ratio is None else round(ratio, 2)
        return data


def percentile(samples_ms: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of latency samples in milliseconds."""
    if not samples_ms:
        return 0.0
    if len(samples_ms) == 1:
        return samples_ms[0]
    cuts = statistics.quantiles(samples_ms, n=100, method="inclusive")
    index = min(max(round(q) - 1, 0), len(cuts) - 1)
    return cuts[index]


def format_table(results: Sequence[Result]) -> str:
    header = (
        f"{'operation':<44} {'conc':>4} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'floor':>7} {'ratio':>6}  {'budget':<32} result"
    )
    lines = [header, "-" * len(header)]
    for row in results:
        floor = "" if row.floor_p50_ms is None else f"{row.floor_p50_ms:.2f}"
        ratio = "" if row.ratio_to_floor is None else f"{row.ratio_to_floor:.1f}x"
        verdict = "-" if row.passed is None else ("pass" if row.passed else "FAIL")
        lines.append(
            f"{row.operation:<44} {row.concurrency:>4} {row.requests_per_second:>9.1f} "
            f"{row.p50_ms:>8.2f} {row.p99_ms:>8.2f} {floor:>7} {ratio:>6}  {row.budget:<32} "
            f"{verdict}"
        )
    return "\n".join(lines)


def write_json(results: Sequence[Result], path: Path, machine: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine, "results": [row.as_json() for row in results]}
    path.write_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2))
