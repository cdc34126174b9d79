"""Keys as the CLI's `--json` and the admin API show them: never the secret or its hash."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from llmgw.store import ApiKey


def _iso(ts: datetime | None) -> str | None:
    return ts.isoformat() if ts is not None else None


def key_state(key: ApiKey, now: datetime) -> str:
    """active, expired or revoked."""
    if key.revoked:
        return "revoked"
    if key.expires_at is not None and key.expires_at <= now:
        return "expired"
    return "active"


def key_view(key: ApiKey, now: datetime) -> dict[str, Any]:
    """A key as JSON-ready fields."""
    return {
        "id": key.id,
        "name": key.name,
        "prefix": key.prefix,
        "models": list(key.models) if key.models is not None else None,
        "rpm": key.rpm,
        "tpm": key.tpm,
        "budget_tokens": key.budget_tokens,
        "budget_period": key.budget_period,
        "expires_at": _iso(key.expires_at),
        "is_admin": key.is_admin,
        "admin_role": key.admin_role,
        "priority": key.priority,
        "weight": key.weight,
        "max_queue_wait": key.max_queue_wait,
        "scopes": list(key.scopes),
        "team": key.team.name if key.team is not None else None,
        "user_rpm": key.user_rpm,
        "user_tpm": key.user_tpm,
        "user_budget_tokens": key.user_budget_tokens,
        "created_at": _iso(key.created_at),
        "revoked_at": _iso(key.revoked_at),
        "state": key_state(key, now),
    }
