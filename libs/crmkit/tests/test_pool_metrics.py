from __future__ import annotations

from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from crmkit.metrics import observe_pools


@dataclass
class Pool:
    size: int
    idle: int
    max_size: int

    def get_size(self) -> int:
        return self.size

    def get_idle_size(self) -> int:
        return self.idle

    def get_max_size(self) -> int:
        return self.max_size


def sample(registry: CollectorRegistry, name: str, pool: str) -> float | None:
    return registry.get_sample_value(name, {"pool": pool})


def test_pool_gauges_are_read_at_scrape_time() -> None:
    registry = CollectorRegistry()
    main, dispatch = Pool(size=4, idle=1, max_size=10), Pool(size=1, idle=1, max_size=4)
    observe_pools(registry, {"webhooks": main, "webhooks-dispatch": dispatch})
    assert sample(registry, "db_pool_connections", "webhooks") == 4
    assert sample(registry, "db_pool_connections_in_use", "webhooks") == 3
    assert sample(registry, "db_pool_connections_idle", "webhooks") == 1
    assert sample(registry, "db_pool_connections_max", "webhooks") == 10
    assert sample(registry, "db_pool_connections_in_use", "webhooks-dispatch") == 0
    main.idle = 4
    main.size = 6
    assert sample(registry, "db_pool_connections_in_use", "webhooks") == 2
    assert sample(registry, "db_pool_connections", "webhooks") == 6


def test_in_use_never_goes_negative_while_the_pool_changes_under_a_scrape() -> None:
    registry = CollectorRegistry()
    observe_pools(registry, {"records": Pool(size=2, idle=3, max_size=10)})
    assert sample(registry, "db_pool_connections_in_use", "records") == 0


def test_names_are_declared_even_without_pools_and_cannot_be_registered_twice() -> None:
    registry = CollectorRegistry()
    observe_pools(registry, {})
    text = generate_latest(registry).decode()
    for name in ("db_pool_connections", "db_pool_connections_in_use", "db_pool_connections_idle"):
        assert f"# TYPE {name} gauge" in text
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        observe_pools(registry, {"other": Pool(1, 1, 1)})
