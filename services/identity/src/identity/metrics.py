"""Every metric the identity process exposes, defined in one place."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter


@dataclass(frozen=True)
class IdentityMetrics:
    logins: Counter
    credential_resolutions: Counter
    emails: Counter
    revocations: Counter
    cache_failures: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> IdentityMetrics:
        return cls(
            logins=Counter(
                "identity_logins_total",
                "Password logins (REST and the OAuth consent page), by outcome.",
                ["outcome"],
                registry=registry,
            ),
            credential_resolutions=Counter(
                "identity_credential_resolutions_total",
                "Credentials resolved from Postgres on a gateway cache miss, by kind and outcome.",
                ["kind", "outcome"],
                registry=registry,
            ),
            emails=Counter(
                "identity_emails_total",
                "Emails handled by the email job, by outcome (sent, retried, failed).",
                ["outcome"],
                registry=registry,
            ),
            revocations=Counter(
                "identity_credential_revocations_total",
                "Credentials revoked, by kind.",
                ["kind"],
                registry=registry,
            ),
            cache_failures=Counter(
                "identity_credential_cache_failures_total",
                "Credential cache writes that failed or were skipped while Redis was unreachable.",
                ["operation"],
                registry=registry,
            ),
        )
