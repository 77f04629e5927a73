"""What record history costs per write: CPU per REST create and update and the REST batch import
rate, with the CPU of the gateway, the records service and PostgreSQL (every backend) measured;
then the statement alone in PostgreSQL: the create statement's INSERT and outbox CTE with and
without the history CTE, alternated, median server time per statement (1 and 1000 rows).

    .venv/bin/python bench/history_cost.py [--creates 400] [--batches 8]

Run it on two checkouts (history off: the commit before it; on: with it) on the same machine and
compare; each run starts its own stack (PostgreSQL without fsync, so CPU rather than the disk is
measured) and prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, cast

import asyncpg
import httpx
import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.benchlib import cpu_seconds
from crm.common.v1 import common_pb2
from crmstack.client import signup
from crmstack.stack import Stack, StackConfig
from records import history
from records.model import ObjectModel
from records.outbox import Provenance
from records.sql import Params, workspace_schema_name

BATCH = 1000
ENV = {"LOG_LEVEL": "WARNING", "API_RATE_LIMITING_LIMIT": "1000000000"}


class Cpu:
    """CPU seconds of named processes, PostgreSQL counted with every child (the backends)."""

    def __init__(self, pids: dict[str, int], postmaster: int) -> None:
        self.pids = pids
        self.postmaster = postmaster

    def _postgres(self) -> float:
        root = psutil.Process(self.postmaster)
        return cpu_seconds([root, *root.children(recursive=True)])

    def now(self) -> dict[str, float]:
        used = {name: sum(psutil.Process(pid).cpu_times()[:2]) for name, pid in self.pids.items()}
        used["postgres"] = self._postgres()
        return used


def _postmaster(data_dir: Path) -> int:
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if "postgres" in cmdline and str(data_dir) in cmdline and " -D " in f" {cmdline} ":
            pid: int = process.info["pid"]
            return pid
    raise RuntimeError("no postmaster found for the stack")


def _person(i: int, tag: str, company: str) -> dict[str, Any]:
    return {
        "firstName": "Bench",
        "lastName": f"{tag} {i}",
        "email": f"{tag}-{i}-{secrets.token_hex(3)}@example.com",
        "jobTitle": "Engineer",
        "companyId": company,
    }


def uuid7() -> str:
    """A time-ordered UUID, as the records service generates record ids."""
    ms = time.time_ns() // 1_000_000
    rand = secrets.randbits(74)
    value = (ms << 80) | (0x7 << 76) | ((rand >> 62) << 64) | (0b10 << 62) | (rand & (2**62 - 1))
    return str(uuid.UUID(int=value))


def _measure(cpu: Cpu, count: int, work: Any) -> dict[str, float]:
    before = cpu.now()
    started = time.perf_counter()
    work()
    wall = time.perf_counter() - started
    after = cpu.now()
    result = {f"{k}_ms": round((after[k] - before[k]) * 1000 / count, 3) for k in after}
    result["per_second"] = round(count / wall, 1)
    return result


async def _batches(base_url: str, headers: dict[str, str], company: str, count: int) -> None:
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=120) as http:

        async def one(i: int) -> None:
            rows = [_person(i * BATCH + n, "batch", company) for n in range(BATCH)]
            response = await http.post("/rest/batch/people", content=orjson.dumps(rows))
            assert response.status_code == 201, response.text

        for start in range(0, count, 4):
            await asyncio.gather(*(one(i) for i in range(start, min(start + 4, count))))


class _Person:
    """What history_cte reads of an object model."""

    def __init__(self, object_id: str) -> None:
        self.id = object_id


def _statement(
    schema: str, workspace_id: str, object_id: str, user_id: str, with_history: bool
) -> str:
    params = Params(["-"])  # $1 is the JSON rows
    principal = common_pb2.Principal(
        workspace_id=workspace_id, user_id=user_id, kind=common_pb2.PRINCIPAL_KIND_USER
    )
    hist = ""
    if with_history:
        hist = ", " + history.history_cte(
            "hi",
            "ins",
            cast(ObjectModel, _Person(object_id)),
            Provenance.bound(params, principal, events=False),
            action=history.CREATED,
        )
    return (
        f'WITH ins AS (INSERT INTO "{schema}"."person" AS t (id, "firstName", "lastName", email, '
        '"jobTitle", "companyId", "createdAt", "updatedAt") SELECT x.id, '
        'x."firstName", x."lastName", x.email, x."jobTitle", x."companyId", now(), now() '
        'FROM json_to_recordset($1::json) AS x(id uuid, "firstName" text, "lastName" text, '
        'email text, "jobTitle" text, "companyId" uuid) RETURNING t.id, row_to_json(t) AS after, '
        "NULL::json AS before), ob AS (INSERT INTO records.outbox (event_id, workspace_id, object, "
        "object_metadata_id, record_id, action, cause, record, actor_kind) SELECT "
        f"gen_random_uuid(), '{workspace_id}'::uuid, 'person', '{object_id}'::uuid, s.id, "
        f"'created', 'write', s.after, 'user' FROM ins s){hist} SELECT count(*) FROM ins"
    )


async def _sql_cost(
    database_url: str, workspace_id: str, user_id: str, company: str, rounds: int
) -> dict[str, float]:
    connection = await asyncpg.connect(database_url)
    try:
        schema = workspace_schema_name(workspace_id)
        object_id = str(
            await connection.fetchval(
                "SELECT obj_description(c.oid, 'pg_class') FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = 'person'",
                schema,
            )
        ).removeprefix("crm:object:")
        plain = _statement(schema, workspace_id, object_id, user_id, False)
        extra: list[str] = []
        with_history = _statement(schema, workspace_id, object_id, user_id, True)
        values = [workspace_id, "user", user_id, "", ""]
        result: dict[str, float] = {}
        for size in (1, BATCH):
            times: dict[bool, list[float]] = {False: [], True: []}
            for i in range(rounds if size == 1 else max(rounds // 20, 5)):
                for on in (False, True) if i % 2 else (True, False):
                    rows = orjson.dumps(
                        [
                            {**_person(i * size + n, "sql", company), "id": uuid7()}
                            for n in range(size)
                        ]
                    ).decode()
                    sql = with_history if on else plain
                    args = [rows, *values] if on else [rows, *extra]
                    async with connection.transaction():
                        started = time.perf_counter()
                        await connection.fetchval(sql, *args)
                        times[on].append(time.perf_counter() - started)
            off_ms = statistics.median(times[False]) * 1000
            on_ms = statistics.median(times[True]) * 1000
            result[f"rows_{size}_off_ms"] = round(off_ms, 3)
            result[f"rows_{size}_on_ms"] = round(on_ms, 3)
            result[f"rows_{size}_history_us_per_row"] = round((on_ms - off_ms) * 1000 / size, 2)
        return result
    finally:
        await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--creates", type=int, default=400)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--sql-rounds", type=int, default=400)
    parser.add_argument("--sql-only", action="store_true", help="only the statement in SQL")
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="crm-history-cost-"))
    stack = Stack(
        StackConfig(
            data_dir=data_dir,
            app_secret=secrets.token_urlsafe(48),
            extra_env=ENV,
            fast_postgres=True,
        )
    )
    stack.start()
    try:
        pids = {name: stack.instances[name][0].process.pid or 0 for name in ("gateway", "records")}
        cpu = Cpu(pids, _postmaster(data_dir))
        with httpx.Client(base_url=stack.base_url, timeout=60) as http:
            session = signup(http)
            headers = session.headers
            company = http.post("/rest/companies", json={"name": "Acme"}, headers=headers).json()
            company_id = company["data"]["id"]
            ids: list[str] = []

            def creates(tag: str, n: int) -> None:
                for i in range(n):
                    response = http.post(
                        "/rest/people", json=_person(i, tag, company_id), headers=headers
                    )
                    assert response.status_code == 201, response.text
                    ids.append(response.json()["data"]["id"])

            def updates() -> None:
                for i, record_id in enumerate(ids[: args.creates]):
                    response = http.patch(
                        f"/rest/people/{record_id}",
                        json={"jobTitle": f"Lead {i}"},
                        headers=headers,
                    )
                    assert response.status_code == 200, response.text

            measured: dict[str, Any] = {}
            if not args.sql_only:
                creates("warm", 50)
                ids.clear()
                measured["create"] = _measure(
                    cpu, args.creates, lambda: creates("api", args.creates)
                )
                measured["update"] = _measure(cpu, args.creates, updates)
                asyncio.run(_batches(stack.base_url, headers, company_id, 2))  # warm up
                measured["batch_c4"] = _measure(
                    cpu,
                    args.batches * BATCH,
                    lambda: asyncio.run(
                        _batches(stack.base_url, headers, company_id, args.batches)
                    ),
                )
            measured["sql"] = asyncio.run(
                _sql_cost(
                    stack.env["DATABASE_URL"],
                    session.workspace_id,
                    session.user_id,
                    company_id,
                    args.sql_rounds,
                )
            )
        measured["load"] = psutil.getloadavg()
        print(orjson.dumps(measured).decode(), flush=True)
    finally:
        stack.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
