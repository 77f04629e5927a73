"""Webhook secrets: generated, shown once, stored encrypted (they must sign every delivery, so a
one-way hash will not do). AES-256-GCM with a key derived from APP_SECRET; the webhook id is the
associated data, so a sealed secret copied onto another webhook does not open."""

from __future__ import annotations

import hashlib
import os
import secrets
from collections import OrderedDict

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

SECRET_PREFIX = "whsec_"  # noqa: S105  # a prefix, not a secret
_NONCE_BYTES = 12


class SecretUnavailable(Exception):
    """A stored secret does not open (APP_SECRET changed since it was sealed)."""


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


class SecretBox:
    def __init__(self, app_secret: str, *, cache_size: int = 4096) -> None:
        key = hashlib.sha256(b"crm-webhook-secret:" + app_secret.encode()).digest()
        self._aead = AESGCM(key)
        # Opened secrets by (webhook id, sealed bytes): a rotation changes the sealed bytes.
        self._opened: OrderedDict[tuple[str, bytes], str] = OrderedDict()
        self._cache_size = cache_size

    def seal(self, webhook_id: str, secret: str) -> bytes:
        nonce = os.urandom(_NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, secret.encode(), webhook_id.encode())

    def open(self, webhook_id: str, sealed: bytes) -> str:
        key = (webhook_id, sealed)
        secret = self._opened.get(key)
        if secret is None:
            secret = self._decrypt(webhook_id, sealed)
            self._opened[key] = secret
            if len(self._opened) > self._cache_size:
                self._opened.popitem(last=False)
        else:
            self._opened.move_to_end(key)
        return secret

    def _decrypt(self, webhook_id: str, sealed: bytes) -> str:
        nonce, ciphertext = sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:]
        try:
            return self._aead.decrypt(nonce, ciphertext, webhook_id.encode()).decode()
        except InvalidTag:
            raise SecretUnavailable(
                "the webhook secret cannot be decrypted (APP_SECRET changed?); rotate it"
            ) from None
