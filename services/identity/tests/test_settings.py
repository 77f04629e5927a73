from __future__ import annotations

import pytest
from pydantic import ValidationError

from identity.settings import IdentitySettings

BASE = {
    "APP_SECRET": "x" * 40,
    "DATABASE_URL": "postgresql://localhost/crm",
    "REDIS_URL": "redis://localhost",
    "METADATA_ADDR": "localhost:1",
}


def _settings(**env: str) -> IdentitySettings:
    return IdentitySettings(**{**BASE, **env})  # type: ignore[arg-type]


def test_token_lifetime_defaults_match_the_spec() -> None:
    settings = _settings()
    assert settings.ACCESS_TOKEN_EXPIRES_IN == 30 * 60
    assert settings.REFRESH_TOKEN_EXPIRES_IN == 90 * 86400
    assert settings.LOGIN_TOKEN_EXPIRES_IN == 15 * 60
    assert settings.FILE_TOKEN_EXPIRES_IN == 86400
    assert settings.PASSWORD_RESET_TOKEN_EXPIRES_IN == 5 * 60
    assert settings.OAUTH_CODE_EXPIRES_IN == 10 * 60


@pytest.mark.parametrize(
    ("text", "seconds"), [("2h", 7200), ("45m", 2700), ("90", 90), ("7d", 604800)]
)
def test_lifetimes_accept_the_usual_forms(text: str, seconds: int) -> None:
    assert seconds == _settings(ACCESS_TOKEN_EXPIRES_IN=text).ACCESS_TOKEN_EXPIRES_IN


def test_bad_lifetime_names_the_variable() -> None:
    with pytest.raises(ValidationError, match="REFRESH_TOKEN_EXPIRES_IN"):
        _settings(REFRESH_TOKEN_EXPIRES_IN="forever")
    with pytest.raises(ValidationError, match="SMTP_URL"):
        _settings(SMTP_URL="http://mail")
