"""Closed-loop HTTP load with wrk (Debian's package), as the peer harness (`shared/peers/load.sh`)
drives it: `wrk -t2 -c16`, keep-alive, a bearer token, GET or a POST whose body is made unique per
request (an email address). A Lua `done` hook prints the exact counts and percentiles, so nothing
is parsed from wrk's human summary.

wrk costs far less CPU per request than a Python client, which matters on two cores: the client
competes with the stack it loads. Where wrk is not installed, callers fall back to
`benchlib.drive` and say so.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import orjson

THREADS = 2
UNIQUE = "@@UNIQUE@@"  # replaced in a POST body by a value no other request of the run has

_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRKJSON {\\"requests\\": %d, \\"duration_us\\": %d, \\"p50_us\\": %d, "
    .. "\\"p99_us\\": %d, \\"non2xx\\": %d, \\"socket_errors\\": %d}\\n", summary.requests,
    summary.duration, latency:percentile(50), latency:percentile(99), e.status,
    e.connect + e.read + e.write + e.timeout))
end
"""


@dataclass(frozen=True)
class Request:
    """One request shape: GET `path`, or POST `path` with `body` (UNIQUE marks the unique part)."""

    path: str
    token: str
    body: str | None = None


@dataclass(frozen=True)
class WrkRun:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    non2xx: int
    socket_errors: int

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


def available() -> bool:
    return shutil.which("wrk") is not None


def _lua_string(text: str) -> str:
    level = "=" * 4
    if f"]{level}]" in text:
        raise ValueError("a request body may not contain ']====]'")
    return f"[{level}[{text}]{level}]"


def script(request: Request) -> str:
    """The Lua script for one request shape (also what load.sh's scripts do)."""
    lines = [
        f'wrk.headers["Authorization"] = {_lua_string("Bearer " + request.token)}',
        # each thread its own id, so that two threads never make the same unique value
        "local next_id = 1",
        "function setup(thread) thread:set('tid', next_id); next_id = next_id + 1 end",
    ]
    if request.body is not None:
        lines += ['wrk.method = "POST"', 'wrk.headers["Content-Type"] = "application/json"']
    if request.body is not None and UNIQUE not in request.body:
        lines.append(f"wrk.body = {_lua_string(request.body)}")
    elif request.body is not None:
        head, _, tail = request.body.partition(UNIQUE)
        lines += [
            f"local head, tail = {_lua_string(head)}, {_lua_string(tail)}",
            "local n = 0",
            "request = function()",
            "  n = n + 1",
            "  return wrk.format(nil, nil, nil, head .. string.format('w%d.%d.%d', tid or 0, "
            "math.random(1, 1e9), n) .. tail)",
            "end",
        ]
    return "\n".join(lines) + "\n" + _DONE


async def run(
    base_url: str, request: Request, *, connections: int, seconds: float, timeout_s: float = 10
) -> WrkRun:
    """One bounded wrk run (`seconds` long, each request timing out after `timeout_s`)."""
    with tempfile.TemporaryDirectory(prefix="crm-wrk-") as folder:
        lua = Path(folder) / "request.lua"
        lua.write_text(script(request))
        process = await asyncio.create_subprocess_exec(
            *("wrk", f"-t{min(THREADS, connections)}", f"-c{connections}"),
            *(f"-d{max(1, round(seconds))}s", f"--timeout={timeout_s:g}s", "-s", str(lua)),
            base_url + request.path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), timeout=seconds + 60)
    for line in out.decode(errors="replace").splitlines():
        if line.startswith("WRKJSON "):
            data = orjson.loads(line.removeprefix("WRKJSON "))
            return WrkRun(
                requests=data["requests"],
                seconds=data["duration_us"] / 1e6,
                p50_ms=data["p50_us"] / 1000,
                p99_ms=data["p99_us"] / 1000,
                non2xx=data["non2xx"],
                socket_errors=data["socket_errors"],
            )
    raise RuntimeError(f"wrk gave no summary (exit {process.returncode}): {err.decode()[-500:]}")
