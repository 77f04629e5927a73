"""The pure parts of the API rate limit: counter keys, headers, refusal and wait times."""

from __future__ import annotations

from crm.common.v1 import common_pb2
from gateway.errors import graphql_extensions, rest_error_body
from gateway.ratelimit.window import Decision, counter_key

P = common_pb2.Principal
NOW_US = 1_700_000_000_250_000  # 2023-11-14T22:13:20.250Z


def _decision(*, allowed: bool, remaining: int, reset_in_us: int) -> Decision:
    return Decision(
        allowed=allowed,
        limit=100,
        remaining=remaining,
        reset_at_us=NOW_US + reset_in_us,
        now_us=NOW_US,
    )


def test_api_keys_count_per_key_within_the_workspace() -> None:
    first = P(workspace_id="w1", kind=common_pb2.PRINCIPAL_KIND_API_KEY, credential_id="k1")
    other_key = P(workspace_id="w1", kind=common_pb2.PRINCIPAL_KIND_API_KEY, credential_id="k2")
    assert counter_key(first) == "crm:ratelimit:w1:key:k1"
    assert counter_key(first) != counter_key(other_key)


def test_session_tokens_count_per_user_whatever_the_session() -> None:
    login = P(
        workspace_id="w1", kind=common_pb2.PRINCIPAL_KIND_USER, user_id="u1", credential_id="s1"
    )
    second_login = P(
        workspace_id="w1", kind=common_pb2.PRINCIPAL_KIND_USER, user_id="u1", credential_id="s2"
    )
    other_workspace = P(
        workspace_id="w2", kind=common_pb2.PRINCIPAL_KIND_USER, user_id="u1", credential_id="s3"
    )
    assert counter_key(login) == counter_key(second_login) == "crm:ratelimit:w1:user:u1"
    assert counter_key(other_workspace) != counter_key(login)


def test_oauth_tokens_count_per_client_and_user() -> None:
    def oauth(client: str, user: str, grant: str) -> common_pb2.Principal:
        return P(
            workspace_id="w1",
            kind=common_pb2.PRINCIPAL_KIND_OAUTH,
            oauth_client_id=client,
            user_id=user,
            credential_id=grant,
        )

    assert counter_key(oauth("c1", "u1", "g1")) == counter_key(oauth("c1", "u1", "g2"))
    assert counter_key(oauth("c1", "u1", "g1")) != counter_key(oauth("c2", "u1", "g1"))
    assert counter_key(oauth("c1", "u1", "g1")) != counter_key(oauth("c1", "u2", "g1"))
    user = P(workspace_id="w1", kind=common_pb2.PRINCIPAL_KIND_USER, user_id="u1")
    assert counter_key(oauth("c1", "u1", "g1")) != counter_key(user)


def test_personal_access_tokens_count_per_token() -> None:
    token = P(
        workspace_id="w1",
        kind=common_pb2.PRINCIPAL_KIND_PERSONAL_ACCESS_TOKEN,
        user_id="u1",
        credential_id="t1",
    )
    assert counter_key(token) == "crm:ratelimit:w1:pat:t1"


def test_headers_of_an_admitted_call() -> None:
    headers = dict(_decision(allowed=True, remaining=41, reset_in_us=59_000_001).headers())
    assert headers == {
        b"x-ratelimit-limit": b"100",
        b"x-ratelimit-remaining": b"41",
        # 22:13:20.250 + 59.000001 s, rounded up to the next whole second
        b"x-ratelimit-reset": b"1700000060",
    }


def test_a_refused_call_also_says_when_to_retry() -> None:
    headers = dict(_decision(allowed=False, remaining=0, reset_in_us=2_100_000).headers())
    assert headers[b"x-ratelimit-remaining"] == b"0"
    assert headers[b"retry-after"] == b"3"
    assert headers[b"x-ratelimit-reset"] == b"1700000003"


def test_retry_after_is_at_least_one_second() -> None:
    assert _decision(allowed=False, remaining=0, reset_in_us=10).retry_after_seconds == 1


def test_the_refusal_in_rest_and_graphql_shapes() -> None:
    error = _decision(allowed=False, remaining=0, reset_in_us=1_500_000).error()
    body = rest_error_body(error)
    assert body["statusCode"] == 429
    assert body["error"] == "Too Many Requests"
    assert set(body) == {"statusCode", "message", "error", "details"}
    extensions = graphql_extensions(error)
    assert extensions == {"code": "RATE_LIMIT_EXCEEDED", "resetAt": "2023-11-14T22:13:21.750Z"}
