"""A small REST client that pages through a whole list and backs off when rate limited.

Every page is one call against the credential's rate limit (default 100 calls per 60 s, a sliding
window: docs/api.md, "Rate limits"). On 429 the client waits as the answer says: `Retry-After`
(seconds), or else until `X-RateLimit-Reset` (Unix time), then asks again for the same page; the
cursor (`pageInfo.endCursor`) stays valid, so no record is skipped or seen twice.

Run it (standard library only, Python 3.10+):

    python examples/paging_client.py --base http://127.0.0.1:3000 --token "$TOKEN" people \\
        --limit 200 --param 'filter[city][eq]=London'

Each record is printed as a JSON line; waits are reported on stderr. Use it as a library too:
`iter_records(...)` yields the records of a list, `RestClient.get(...)` makes one call with
backoff.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

Sleep = Callable[[float], None]


def _report(seconds: float) -> None:
    print(f"rate limited: waiting {seconds:.1f} s", file=sys.stderr)


@dataclass
class RestClient:
    base_url: str
    token: str
    max_retries: int = 10  # consecutive 429s on one call before giving up
    timeout: float = 30.0
    on_wait: Callable[[float], None] = _report
    sleep: Sleep = time.sleep
    waits: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if urllib.parse.urlsplit(self.base_url).scheme not in ("http", "https"):
            raise ValueError(f"not an http(s) URL: {self.base_url}")

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """GET `path` (e.g. /rest/people) and decode its JSON; waits out 429s."""
        query = urllib.parse.urlencode(params or {})
        url = f"{self.base_url.rstrip('/')}{path}" + (f"?{query}" if query else "")
        headers = {"Authorization": f"Bearer {self.token}"}
        request = urllib.request.Request(url, headers=headers)  # noqa: S310 (http(s) only)
        for _ in range(self.max_retries + 1):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                    return json.load(response)
            except urllib.error.HTTPError as error:
                if error.code != 429:
                    raise
                delay = retry_delay(dict(error.headers.items()))
                error.close()
            self.waits.append(delay)
            self.on_wait(delay)
            self.sleep(delay)
        raise RuntimeError(f"still rate limited after {self.max_retries} waits: {path}")


def retry_delay(headers: Mapping[str, str], now: float | None = None) -> float:
    """Seconds to wait after a 429: Retry-After, else X-RateLimit-Reset minus now, else 1."""
    headers = {name.lower(): value for name, value in headers.items()}  # any case on the wire
    retry_after = headers.get("retry-after")
    if retry_after is not None and retry_after.strip().isdigit():
        return max(1.0, float(retry_after))
    reset = headers.get("x-ratelimit-reset")
    if reset is not None and reset.strip().isdigit():
        return max(1.0, float(reset) - (time.time() if now is None else now))
    return 1.0


def iter_records(
    client: RestClient, plural: str, *, limit: int = 200, params: Mapping[str, str] | None = None
) -> Iterator[dict[str, Any]]:
    """Every record of GET /rest/<plural> (with `params`: filters, orderBy, fields), page by
    page."""
    after: str | None = None
    while True:
        query = {**(params or {}), "limit": str(limit)}
        if after is not None:
            query["after"] = after
        page = client.get(f"/rest/{plural}", query)
        yield from page["data"]
        info = page["pageInfo"]
        if not info["hasNextPage"]:
            return
        after = info["endCursor"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the API's base URL")
    parser.add_argument("--token", required=True, help="an access token or API key")
    parser.add_argument("--limit", type=int, default=200, help="records per page (at most 200)")
    parser.add_argument("--param", action="append", default=[], help="extra NAME=VALUE")
    parser.add_argument("plural", help="the object's plural name, e.g. people")
    args = parser.parse_args()
    params = dict(item.split("=", 1) for item in args.param)
    client = RestClient(args.base, args.token)
    for record in iter_records(client, args.plural, limit=args.limit, params=params):
        print(json.dumps(record))


if __name__ == "__main__":
    main()
