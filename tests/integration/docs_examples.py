"""The runnable examples of README.md and docs/*.md, for test_docs_examples.py.

Rules (docs/development.md, "Docs examples"):
- A fenced ```sh / ```bash / ```shell block holds shell commands (lines joined at a trailing
  backslash). A command whose program is `curl` is an API example and runs against the test stack;
  any other program (`make`, `helm`, `grpcurl`, `python`, ...) is not, and must be one of
  NOT_API_PROGRAMS, so a new kind of command cannot be left out unnoticed.
- A comment line right after a curl command (`# 201 {...}`, `# {"data": ...}`) states its status
  and/or the shape of its answer; so does a ```json block right after a block of one curl command.
  Without a status, any 2xx passes.
- A fenced ```graphql block holds GraphQL operations; each runs on POST /graphql and must answer
  without errors. Subscriptions are not runnable over HTTP (docs/subscriptions.md has its own
  tests) and are listed as skipped.
- `<!-- docs-test: skip: <reason> -->` on the line before a fence skips that block, with the reason
  shown in the test's report.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[2]
NOT_API_PROGRAMS = frozenset({"make", "helm", "kubectl", "grpcurl", "python", "kind", "podman"})
_FENCE = re.compile(r"^```(\w*)\s*$")
_SKIP = re.compile(r"^<!--\s*docs-test:\s*skip:\s*(.+?)\s*-->\s*$")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")
_STATUS = re.compile(r"^(\d{3})\b[,\s]*(.*)$")


@dataclass
class Expected:
    status: int | None = None
    shape: str | None = None  # the documented answer, as written


@dataclass
class Example:
    source: str  # file:line
    kind: str  # "curl", "graphql" or "other"
    text: str
    expected: Expected = field(default_factory=Expected)
    skip_reason: str | None = None

    @property
    def program(self) -> str:
        words = [w for w in self.text.split() if not _ENV_ASSIGNMENT.match(w)]
        return words[0].rsplit("/", 1)[-1] if words else ""  # .venv/bin/python: python


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _blocks(path: Path) -> list[tuple[int, str, list[str], str | None]]:
    """(line of the fence, language, lines, skip reason) of each fenced block."""
    lines = path.read_text().splitlines()
    blocks: list[tuple[int, str, list[str], str | None]] = []
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if match is None:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        marker = _SKIP.match(lines[index - 1]) if index else None
        blocks.append((index + 1, match.group(1), lines[index + 1 : end], marker and marker[1]))
        index = end + 1
    return blocks


def _trailing_comment(command: str) -> str | None:
    """The text of an unquoted ` # comment` ending the command."""
    quote = ""
    for index, char in enumerate(command):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and index and command[index - 1].isspace():
            return command[index + 1 :].strip()
    return None


def _complete(command: str) -> bool:
    """Whether `command` closes its quotes (a quoted body may span lines)."""
    try:
        shlex.split(command, comments=True)
    except ValueError:
        return False
    return True


def _shell_commands(lines: list[str]) -> list[tuple[str, list[str]]]:
    """(command, the comment lines that follow it) of a shell block."""
    commands: list[tuple[str, list[str]]] = []
    pending = ""
    for line in lines:
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            if commands and stripped.startswith("#"):
                commands[-1][1].append(stripped[1:].strip())
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        pending += stripped
        if not _complete(pending):
            pending += "\n"
            continue
        trailing = _trailing_comment(pending)
        commands.append((pending, [] if trailing is None else [trailing]))
        pending = ""
    return commands


def _expected(comments: list[str]) -> Expected:
    """The status and shape stated by the comments after a command (a shape may go on over
    several comment lines)."""
    expected = Expected()
    text = " ".join(comments)
    match = _STATUS.match(text)
    if match is not None:
        expected.status = int(match[1])
        text = match[2]
    if text.startswith(("{", "[")):
        expected.shape = text
    return expected


def examples() -> list[Example]:
    found: list[Example] = []
    for path in doc_files():
        name = path.relative_to(ROOT).as_posix()
        blocks = _blocks(path)
        for position, (line, language, lines, skip) in enumerate(blocks):
            source = f"{name}:{line}"
            if language in ("sh", "bash", "shell"):
                commands = _shell_commands(lines)
                following = blocks[position + 1] if position + 1 < len(blocks) else None
                for command, comments in commands:
                    kind = "curl" if command.split()[0] == "curl" else "other"
                    example = Example(source, kind, command, _expected(comments), skip)
                    if (
                        kind == "curl"
                        and len(commands) == 1
                        and example.expected.shape is None
                        and following is not None
                        and following[1] == "json"
                        and following[0] == line + len(lines) + 3  # the next block, one blank line
                    ):
                        example.expected.shape = "\n".join(following[2])
                    found.append(example)
            elif language == "graphql":
                found.append(Example(source, "graphql", "\n".join(lines), skip_reason=skip))
    return found


def documented_shape(text: str) -> Any:
    """The documented answer as JSON, `...` elisions dropped; None when it is not JSON."""
    cleaned = re.sub(r",\s*\.\.\.(?=\s*[}\]])", "", text)
    cleaned = re.sub(r"(?<=[\[{])\s*\.\.\.\s*,?", "", cleaned)
    cleaned = re.sub(r"(?<=[,\s])\.\.\.\s*,", "", cleaned)
    try:
        return orjson.loads(cleaned)
    except orjson.JSONDecodeError:
        return None


def shape_mismatches(documented: Any, actual: Any, at: str = "") -> list[str]:
    """Where `actual` lacks a key the documented answer shows, or has another kind of value
    (object, list, scalar); values themselves are examples and are not compared."""
    if isinstance(documented, dict):
        if not isinstance(actual, dict):
            return [f"{at or '.'}: expected an object, got {actual!r:.80}"]
        problems: list[str] = []
        for key, value in documented.items():
            if key not in actual:
                problems.append(f"{at}.{key}: missing")
            else:
                problems += shape_mismatches(value, actual[key], f"{at}.{key}")
        return problems
    if isinstance(documented, list):
        if not isinstance(actual, list):
            return [f"{at}: expected a list, got {actual!r:.80}"]
        if documented and not actual:
            return [f"{at}: expected a non-empty list"]
        if documented:
            return shape_mismatches(documented[0], actual[0], f"{at}[0]")
    return []


def documented_keys(text: str) -> list[str]:
    """The top-level keys an answer written in shorthand (`{"accessToken", "user": {...}}`)
    names: quoted words at depth 1 that are not values."""
    keys: list[str] = []
    depth = 0
    for match in re.finditer(r'[{}\[\]]|"([^"\\]*)"\s*([:,}])?', text):
        token = match[0]
        if token in "{[":
            depth += 1
        elif token in "}]":
            depth -= 1
        elif depth == 1 and match[1] is not None and match[2] is not None:
            before = text[: match.start()].rstrip()
            if not before.endswith(":"):
                keys.append(match[1])
    return keys
