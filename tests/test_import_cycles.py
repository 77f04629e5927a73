"""No import cycle among the modules of services/ and libs/ (run by `make lint`).

Every import statement counts, including one inside a function: deferring an import hides a
cycle from the interpreter, not from the reader (the gateway's schema parts were one). Only
imports under `if TYPE_CHECKING:` are left out (they never run). `from a import b` is an edge to
the module `a.b` when there is one, else to `a`; relative imports are resolved.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ("crm",)  # libs/crm-proto/src/crm: protoc's output, not ours


def source_roots(root: Path = ROOT) -> list[Path]:
    return sorted(p for p in (*root.glob("libs/*/src"), *root.glob("services/*/src")) if p.is_dir())


def module_files(roots: list[Path]) -> dict[str, Path]:
    """Module name → file, for every first-party module under the roots."""
    modules: dict[str, Path] = {}
    for src in roots:
        for path in src.rglob("*.py"):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[0] in GENERATED:
                continue
            if parts[-1] == "__init__":
                parts.pop()
            if parts:
                modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _imports(node.orelse)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    yield from _imports([child])
                elif isinstance(child, ast.ExceptHandler | ast.match_case):
                    yield from _imports(child.body)


def imports_of(name: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The first-party modules `name` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        found.update(t for t in targets if t in modules and t != name)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = module_files(source_roots(root))
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a deep graph cannot hit the recursion limit.
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(found)


def test_the_checker_finds_cycles_and_ignores_type_checking_imports(tmp_path: Path) -> None:
    src = tmp_path / "libs" / "demo" / "src" / "demo"
    src.mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from demo import b\n",
        "b.py": "from .c import thing\n",
        "c.py": "import demo.a\n",
        "d.py": "def later() -> None:\n    from demo.e import x\n",
        "e.py": "from demo.d import later\n",
        "f.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from demo import g\n",
        "g.py": "from demo.f import y\n",
    }
    for name, text in files.items():
        (src / name).write_text(text)
    assert cycles(import_graph(tmp_path)) == [["demo.a", "demo.b", "demo.c"], ["demo.d", "demo.e"]]


def test_no_import_cycle_in_services_and_libs() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)
