from pathlib import Path

import pytest

from crmstack.infra import Infrastructure
from crmstack.ports import free_port, release_port
from crmstack.stack import MIGRATING_SERVICES, Stack, StackConfig, StackError


def test_every_service_s_failed_migration_is_named_with_its_error(tmp_path: Path) -> None:
    closed = free_port()  # claimed, so nothing of this machine's launchers listens on it
    stack = Stack(StackConfig(data_dir=tmp_path, app_secret="x" * 48))
    try:
        stack.infra = Infrastructure(
            database_url=f"postgresql://postgres@127.0.0.1:{closed}/crm",
            redis_url=f"redis://127.0.0.1:{closed}/0",
            nats_url=f"nats://127.0.0.1:{closed}",
        )
        stack._plan()
        with pytest.raises(StackError) as failed:
            stack._migrate()
    finally:
        stack.stop()
        release_port(closed)
    for service in MIGRATING_SERVICES:
        assert f"migrations of {service} failed:" in str(failed.value)
    assert "Connect call failed" in str(failed.value) or "refused" in str(failed.value)
