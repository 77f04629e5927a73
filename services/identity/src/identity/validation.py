"""Input checks shared by the servicers: each failure names the field at fault."""

from __future__ import annotations

import re
import uuid

from crmkit.errors import InvalidArgument

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
MAX_EMAIL_LENGTH = 254
MAX_NAME_LENGTH = 100


def email(value: str, field: str = "email") -> str:
    """The normalized (trimmed, lower-cased) email, or InvalidArgument."""
    normalized = value.strip().lower()
    if not normalized:
        raise InvalidArgument("email is required", field=field)
    if len(normalized) > MAX_EMAIL_LENGTH or not _EMAIL.match(normalized):
        raise InvalidArgument("email is not a valid email address", field=field)
    return normalized


def name(value: str, field: str, *, required: bool) -> str:
    cleaned = value.strip()
    if required and not cleaned:
        raise InvalidArgument(f"{field} is required", field=field)
    if len(cleaned) > MAX_NAME_LENGTH:
        raise InvalidArgument(
            f"{field} must have at most {MAX_NAME_LENGTH} characters", field=field
        )
    return cleaned


def uuid_text(value: str, field: str) -> str:
    """`value` as a canonical UUID string, or InvalidArgument naming `field`."""
    try:
        return str(uuid.UUID(value))
    except (ValueError, AttributeError, TypeError):
        raise InvalidArgument(f"{field} must be a UUID", field=field) from None


def optional_uuid(value: str, field: str) -> str | None:
    return uuid_text(value, field) if value else None
