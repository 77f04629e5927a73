"""The chart's defaults keep every safety guard on: what `make run` relaxes for local work
(crmstack.stack.RELAXED_SETTINGS, named in one line at its start) and the gateway's guards that
only an operator should loosen. A value the chart does not set is the service's own default."""

from __future__ import annotations

from typing import Any

from pydantic_settings import BaseSettings

from crmstack.stack import RELAXED_SETTINGS
from gateway.settings import GatewaySettings
from identity.settings import IdentitySettings
from metadata.settings import MetadataSettings
from records.settings import RecordsSettings
from tests.chart.rendering import RELEASE, container, env_of, render
from webhooks.settings import WebhooksSettings
from workflows.settings import WorkflowsSettings

SETTINGS: dict[str, type[BaseSettings]] = {
    "gateway": GatewaySettings,
    "identity": IdentitySettings,
    "metadata": MetadataSettings,
    "records": RecordsSettings,
    "webhooks": WebhooksSettings,
    "workflows": WorkflowsSettings,
}
# variable -> its safe value, as the environment spells it.
GUARDS: dict[str, str] = {
    **{name: safe for name, (_, safe, _) in RELAXED_SETTINGS.items()},
    # No proxy may name the client in X-Forwarded-For (the per-IP brute-force limits).
    "TRUSTED_PROXIES": "",
    # No browser origin may call the API with the user's credentials (CORS).
    "CORS_ORIGINS": "",
}


def _service_of(owner: str) -> str:
    """crm-webhooks or crm-webhooks-migrate -> webhooks."""
    return owner.removeprefix(f"{RELEASE}-").removesuffix("-migrate")


def _running_value(
    settings: type[BaseSettings], env: dict[str, dict[str, Any]], name: str
) -> str | None:
    """What the process runs with: the rendered value, else its settings' default; None when
    the service does not read the variable."""
    field = settings.model_fields.get(name)
    if field is None:
        return None
    if name in env:
        assert "value" in env[name], f"{name} must be a plain value, got {env[name]}"
        return str(env[name]["value"]).lower()
    return str(field.default).lower()


def test_the_chart_defaults_keep_every_guard_that_make_run_relaxes_on() -> None:
    checked: set[str] = set()
    for owner, spec in render({}).pod_specs():
        settings = SETTINGS[_service_of(owner)]
        env = env_of(container(spec))
        for name, safe in GUARDS.items():
            value = _running_value(settings, env, name)
            if value is not None:
                assert value == safe, f"{owner}: {name}={value}, a deployment keeps {safe!r}"
                checked.add(name)
    assert checked == set(GUARDS), f"no pod reads {set(GUARDS) - checked}"
