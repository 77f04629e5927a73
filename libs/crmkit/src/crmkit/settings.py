"""Typed settings read once from the environment, failing fast with the variable's name."""

from __future__ import annotations

import sys
from typing import Annotated, Literal, TypeVar

from pydantic import BeforeValidator, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from crmkit.durations import parse_duration_seconds

Environment = Literal["development", "test", "production"]

# A duration variable in the usual forms (`30m`, `90d`, `3600`), as whole seconds.
Duration = Annotated[int, BeforeValidator(parse_duration_seconds)]


class CommonSettings(BaseSettings):
    """What every process reads. Services subclass it and add their own variables."""

    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", frozen=True)

    APP_SECRET: str = Field(min_length=16, description="signs tokens; identical in every process")
    CRM_ENV: Environment = "production"
    LOG_LEVEL: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    OTEL_SERVICE_NAME: str = ""
    METRICS_PORT: int = Field(default=9464, ge=0, le=65535)  # 0: pick a free port
    METRICS_HOST: str = "0.0.0.0"
    # gRPC channels ping an idle peer this often; servers accept pings twice as often.
    GRPC_KEEPALIVE_TIME: float = Field(default=30.0, gt=0, description="seconds")

    @property
    def is_development(self) -> bool:
        return self.CRM_ENV == "development"


class GrpcServiceSettings(CommonSettings):
    """Settings of a gRPC service process."""

    GRPC_HOST: str = "0.0.0.0"
    GRPC_PORT: int = Field(default=50051, ge=1, le=65535)
    # Also listen on this Unix socket (the one-box launcher sets it: no TCP stack between
    # processes on one host); empty: TCP only.
    GRPC_UNIX_SOCKET: str = ""
    GRPC_MAX_WORKERS_CONCURRENCY: int = Field(default=1000, ge=1)
    SHUTDOWN_GRACE_SECONDS: float = Field(default=10.0, ge=0)
    GRPC_CALL_TIMEOUT: float = Field(
        default=10.0, gt=0, description="deadline for outgoing calls, s"
    )
    GRPC_MAX_CONNECTION_AGE: Duration = Field(
        default=300, ge=1, description="clients reconnect (and re-resolve) after this long"
    )


class DatabaseSettings(BaseSettings):
    DATABASE_URL: str = Field(pattern=r"^postgres(ql)?://")
    DB_POOL_MIN_SIZE: int = Field(default=2, ge=0)
    DB_POOL_MAX_SIZE: int = Field(default=10, ge=1)


class NatsSettings(BaseSettings):
    NATS_URL: str = Field(pattern=r"^(nats|tls)://")


class RedisSettings(BaseSettings):
    REDIS_URL: str = Field(pattern=r"^rediss?://")


S = TypeVar("S", bound=BaseSettings)


def load_settings(cls: type[S]) -> S:
    """Build settings from the environment or exit with one line naming the bad variable."""
    try:
        return cls()
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            name = ".".join(str(part) for part in error["loc"]) or "settings"
            problems.append(f"{name}: {error['msg']}")
        sys.stderr.write("configuration error: " + "; ".join(problems) + "\n")
        raise SystemExit(2) from None
