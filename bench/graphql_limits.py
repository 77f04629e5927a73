"""Cost of the GraphQL request limits per request (gateway.graphql.limits), in process.

What the gateway adds before running a GraphQL request: parse with a token limit (an LRU keeps
the documents of repeated query texts, so steady traffic parses nothing), then one pass over the
operation counting depth, aliases and top-level fields and estimating the cost. Measured on a
schema shaped like a workspace's, for a typical list query with a nested relation, with the
document cached (steady state) and with a new query text every time (first sight: the parse).
Budget: p50 under 0.05 ms per request with the document cached.

    .venv/bin/python bench/graphql_limits.py            # 20,000 checks per case
    .venv/bin/python bench/graphql_limits.py --smoke    # 1,000, in a second
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

from graphql import build_schema

from gateway.graphql.limits import QueryLimits, check_request

P50_BUDGET_MS = 0.05
SCHEMA = build_schema("""
type Query {
  people(filter: String, first: Int, last: Int, limit: Int, after: String): PersonConnection
  companies(filter: String, first: Int, last: Int, limit: Int, after: String): CompanyConnection
}
type PageInfo { hasNextPage: Boolean, endCursor: String }
type PersonConnection { edges: [PersonEdge], pageInfo: PageInfo, totalCount: Int }
type PersonEdge { node: Person, cursor: String }
type CompanyConnection { edges: [CompanyEdge], pageInfo: PageInfo, totalCount: Int }
type CompanyEdge { node: Company, cursor: String }
type Person {
  id: ID, firstName: String, lastName: String, email: String, city: String
  company: Company
}
type Company { id: ID, name: String, people(first: Int): PersonConnection }
""")
QUERY = """query People($first: Int) {
  people(first: $first) {
    edges { node { id firstName lastName email city company { id name } } cursor }
    pageInfo { hasNextPage endCursor }
    totalCount
  }
}"""
LIMITS = QueryLimits(
    max_depth=15, max_aliases=50, max_root_fields=50, max_tokens=15_000, max_cost=25_000
)


def measure(check: Callable[[int], object], iterations: int) -> tuple[float, float]:
    for number in range(min(500, iterations)):
        check(number)
    samples = []
    for number in range(iterations):
        started = time.perf_counter()
        check(number)
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    iterations = 1_000 if parser.parse_args().smoke else 20_000
    variables = {"first": 50}
    cases = {
        "cached document": lambda n: check_request(SCHEMA, QUERY, variables, None, LIMITS),
        # A comment makes each text new: the parse is paid every time.
        "new document": lambda n: check_request(
            SCHEMA, f"# {n}-{time.perf_counter_ns()}\n{QUERY}", variables, None, LIMITS
        ),
    }
    print(f"{'case':<18} {'p50 ms':>8} {'p99 ms':>8}")
    results = {}
    for name, check in cases.items():
        p50, p99 = measure(check, iterations)
        results[name] = p50
        print(f"{name:<18} {p50:8.4f} {p99:8.4f}")
    ok = results["cached document"] < P50_BUDGET_MS
    print(f"budget: cached p50 < {P50_BUDGET_MS} ms: {'pass' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
