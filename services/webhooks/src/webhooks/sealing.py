"""Webhook secrets: generated, shown once, stored encrypted (they must sign every delivery, so a
one-way hash will not do) with `crmkit.sealing`; the webhook id is the associated data."""

from __future__ import annotations

import secrets

from crmkit import sealing
from crmkit.sealing import SecretUnavailable

__all__ = ["SECRET_PREFIX", "SecretBox", "SecretUnavailable", "new_secret"]

SECRET_PREFIX = "whsec_"  # noqa: S105  # a prefix, not a secret


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


class SecretBox(sealing.SecretBox):
    def __init__(self, app_secret: str, *, cache_size: int = 4096) -> None:
        super().__init__(
            app_secret,
            "crm-webhook-secret",
            unavailable="the webhook secret cannot be decrypted (APP_SECRET changed?); rotate it",
            cache_size=cache_size,
        )
