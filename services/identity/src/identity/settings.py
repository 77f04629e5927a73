"""Settings of the identity service, read once at start."""

from __future__ import annotations

from pydantic import Field

from crmkit.settings import DatabaseSettings, Duration, GrpcServiceSettings, RedisSettings


class IdentitySettings(GrpcServiceSettings, DatabaseSettings, RedisSettings):
    METADATA_ADDR: str

    # Token lifetimes (spec: Limits), in the usual duration forms (`30m`, `90d`, seconds).
    ACCESS_TOKEN_EXPIRES_IN: Duration = 30 * 60
    REFRESH_TOKEN_EXPIRES_IN: Duration = 90 * 86400
    LOGIN_TOKEN_EXPIRES_IN: Duration = 15 * 60
    FILE_TOKEN_EXPIRES_IN: Duration = 86400
    PASSWORD_RESET_TOKEN_EXPIRES_IN: Duration = 5 * 60
    OAUTH_CODE_EXPIRES_IN: Duration = 10 * 60

    # Brute-force limits (docs/auth.md): failed password checks per (email, client IP) and failed
    # OAuth client authentications per client IP and per client_id; failed password checks per
    # client IP, whatever the email, under their own, higher limit. Fixed windows.
    AUTH_MAX_FAILED_ATTEMPTS: int = Field(default=10, ge=1)
    AUTH_MAX_FAILED_ATTEMPTS_PER_IP: int = Field(default=50, ge=1)
    AUTH_ATTEMPT_WINDOW: Duration = 60

    # Sign-up (an argon2 hash and a new schema each): per client IP and in total, every attempt.
    SIGNUP_MAX_PER_IP: int = Field(default=100, ge=1)
    SIGNUP_MAX_TOTAL: int = Field(default=2000, ge=1)
    SIGNUP_WINDOW: Duration = 600

    # Password hashes computed at once (argon2id takes 64 MiB each): bounds memory under load.
    PASSWORD_HASH_CONCURRENCY: int = Field(default=2, ge=1, le=64)

    # Active API keys a user may have created, and active personal access tokens a user may
    # hold, each (docs/auth.md): creating one more is refused until one is deleted.
    MAX_CREDENTIALS_PER_USER: int = Field(default=1000, ge=1)

    # How long a credential's principal stays in Redis before it is read again from Postgres.
    CREDENTIAL_CACHE_TTL: Duration = 3600

    # Password-reset email. Without SMTP_URL the email is kept pending (and logged as such).
    SMTP_URL: str | None = Field(default=None, pattern=r"^smtps?://")
    SMTP_TIMEOUT: float = Field(default=10.0, gt=0)
    EMAIL_FROM: str = "CRM <no-reply@crm.localhost>"
    # When set, the email links to `<PASSWORD_RESET_URL>?token=<token>` (the product's page).
    PASSWORD_RESET_URL: str | None = None
    EMAIL_MAX_ATTEMPTS: int = Field(default=8, ge=1)
