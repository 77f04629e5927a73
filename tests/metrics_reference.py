"""The metrics reference of docs/observability.md as data, for the tests that hold the processes,
the dashboard and the alert rules to it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import promql_parser

DOC = Path(__file__).resolve().parents[1] / "docs" / "observability.md"
_ROW = re.compile(r"^\| `([a-z_:]+)` \| (counter|gauge|histogram) \|[^|]*\| ([a-z, ]+) \|")
_HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


@dataclass(frozen=True)
class Documented:
    name: str
    type: str
    processes: frozenset[str]


def documented() -> list[Documented]:
    rows = []
    for line in DOC.read_text().splitlines():
        match = _ROW.match(line)
        if match:
            processes = frozenset(p.strip() for p in match.group(3).split(","))
            rows.append(Documented(match.group(1), match.group(2), processes))
    return rows


def documented_series() -> set[str]:
    """Every series name a query may use: the metrics, and each histogram's _bucket/_sum/_count."""
    names = set()
    for row in documented():
        names.add(row.name)
        if row.type == "histogram":
            names.update(row.name + suffix for suffix in _HISTOGRAM_SERIES)
    return names


def metric_names(expression: str) -> set[str]:
    """The metric names a PromQL expression selects (ValueError when it does not parse)."""
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                found.add(node.name)
        elif isinstance(node, promql_parser.MatrixSelector):
            walk(node.vector_selector)
        elif isinstance(node, promql_parser.Call):
            for argument in node.args:
                walk(argument)
        elif isinstance(node, promql_parser.AggregateExpr):
            walk(node.expr)
            if node.param is not None:
                walk(node.param)
        elif isinstance(node, promql_parser.BinaryExpr):
            walk(node.lhs)
            walk(node.rhs)
        elif isinstance(
            node, promql_parser.ParenExpr | promql_parser.UnaryExpr | promql_parser.SubqueryExpr
        ):
            walk(node.expr)

    walk(promql_parser.parse(expression))
    return found
