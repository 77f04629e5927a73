"""Secrets the services must use again (webhook signing secrets, workflow header values), stored
encrypted: AES-256-GCM with a key derived from APP_SECRET and a purpose, so a key serves one
kind of secret. The owner's id is the associated data: a sealed value copied onto another row
does not open."""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

_NONCE_BYTES = 12


class SecretUnavailable(Exception):
    """A stored secret does not open (APP_SECRET changed since it was sealed)."""


class SecretBox:
    def __init__(
        self, app_secret: str, purpose: str, *, unavailable: str, cache_size: int = 4096
    ) -> None:
        key = hashlib.sha256(purpose.encode() + b":" + app_secret.encode()).digest()
        self._aead = AESGCM(key)
        self._unavailable = unavailable  # the error when a value does not open
        # Opened values by (owner id, sealed bytes): a new value changes the sealed bytes.
        self._opened: OrderedDict[tuple[str, bytes], str] = OrderedDict()
        self._cache_size = cache_size

    def seal(self, owner_id: str, secret: str) -> bytes:
        nonce = os.urandom(_NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, secret.encode(), owner_id.encode())

    def open(self, owner_id: str, sealed: bytes) -> str:
        key = (owner_id, sealed)
        secret = self._opened.get(key)
        if secret is None:
            secret = self._decrypt(owner_id, sealed)
            self._opened[key] = secret
            if len(self._opened) > self._cache_size:
                self._opened.popitem(last=False)
        else:
            self._opened.move_to_end(key)
        return secret

    def _decrypt(self, owner_id: str, sealed: bytes) -> str:
        nonce, ciphertext = sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:]
        try:
            return self._aead.decrypt(nonce, ciphertext, owner_id.encode()).decode()
        except InvalidTag:
            raise SecretUnavailable(self._unavailable) from None
