"""API key secrets and finding them in request headers."""

from __future__ import annotations

import hashlib

import pytest

from llmgw.auth import (
    ANONYMOUS,
    AuthError,
    ExpiredKey,
    InvalidKey,
    KeyInputError,
    MissingKey,
    ModelNotAllowed,
    OpenAuthenticator,
    Principal,
    generate_secret,
    hash_secret,
    secret_prefix,
    token_from_headers,
)
from llmgw.limits import KeyLimits


def test_secrets_are_random_prefixed_and_hashed_with_sha256() -> None:
    secrets = {generate_secret() for _ in range(100)}
    assert len(secrets) == 100
    for secret in secrets:
        assert secret.startswith("sk-llmgw-")
        assert len(secret) == len("sk-llmgw-") + 43  # 32 bytes of URL-safe base64
        assert hash_secret(secret) == hashlib.sha256(secret.encode()).hexdigest()
        assert secret_prefix(secret) == secret[:12]


@pytest.mark.parametrize(
    ("authorization", "x_api_key", "expected"),
    [
        (b"Bearer sk-llmgw-abc", None, "sk-llmgw-abc"),
        (b"bearer sk-llmgw-abc", None, "sk-llmgw-abc"),
        (b"BEARER   sk-llmgw-abc  ", None, "sk-llmgw-abc"),
        (None, b"sk-llmgw-xyz", "sk-llmgw-xyz"),
        (b"Bearer sk-llmgw-abc", b"sk-llmgw-xyz", "sk-llmgw-abc"),
        (b"Basic dXNlcjpwYXNz", b"sk-llmgw-xyz", "sk-llmgw-xyz"),
        (b"Basic dXNlcjpwYXNz", None, None),
        (b"Bearer", None, None),
        (b"Bearer ", b"", None),
        (None, None, None),
        (b"", b"  ", None),
    ],
)
def test_token_from_headers(
    authorization: bytes | None, x_api_key: bytes | None, expected: str | None
) -> None:
    assert token_from_headers(authorization, x_api_key) == expected


def test_auth_errors_carry_openai_codes_and_statuses() -> None:
    missing = MissingKey()
    assert (missing.status, missing.code) == (401, "missing_api_key")
    assert missing.message == "no API key: send Authorization: Bearer <key> or x-api-key"
    invalid = InvalidKey()
    assert (invalid.status, invalid.code, invalid.type) == (
        401,
        "invalid_api_key",
        "invalid_request_error",
    )
    assert invalid.message.startswith("invalid API key")
    expired = ExpiredKey("API key expired at 2025-01-01 00:00:00 UTC")
    assert (expired.status, expired.code) == (401, "expired_api_key")
    assert all(isinstance(e, AuthError) for e in (missing, invalid, expired))


def test_key_input_errors_name_fields_the_callers_way() -> None:
    exc = KeyInputError("budget_tokens", "needs {period} day|month")
    assert str(exc) == "budget_tokens needs period day|month"
    assert (
        exc.render({"budget_tokens": "--budget-tokens", "period": "--period"})
        == "--budget-tokens needs --period day|month"
    )
    assert exc.field == "budget_tokens"


def test_principal_model_permissions() -> None:
    limits = KeyLimits(key_id="key_1", rpm=10, tpm=None, budget_tokens=None, budget_period=None)
    team = Principal(
        key_id="key_1",
        name="team-a",
        models=frozenset({"llama-8b", "qwen-7b"}),
        is_admin=False,
        limits=limits,
    )
    assert team.may_use("llama-8b")
    assert not team.may_use("llama-70b")
    team.check_model("qwen-7b")
    with pytest.raises(ModelNotAllowed) as refused:
        team.check_model("llama-70b")
    assert refused.value.status == 403
    assert refused.value.code == "model_not_allowed"
    assert "'team-a' may not use model 'llama-70b'; it may use: llama-8b, qwen-7b" in str(
        refused.value
    )
    assert ANONYMOUS.may_use("anything")


async def test_open_mode_makes_everyone_anonymous() -> None:
    auth = OpenAuthenticator()
    for token in (None, "", "sk-llmgw-whatever"):
        principal = await auth.authenticate(token)
        assert principal == ANONYMOUS
        assert principal.key_id is None
        assert principal.limits is None
        assert not principal.is_admin
        assert principal.models is None
