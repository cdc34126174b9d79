"""Usage roll-up rows as the CLI's `--json` and the admin API show them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmgw.store import UsageDimension, UsageRow


def usage_row_view(
    row: UsageRow, group_by: Sequence[UsageDimension], names: Mapping[str, str]
) -> dict[str, Any]:
    """One row as JSON-ready fields; `names` maps key ids to key names."""
    out: dict[str, Any] = {}
    if "hour" in group_by:
        out["hour"] = row.hour.isoformat() if row.hour is not None else None
    if "day" in group_by:
        out["day"] = row.day.date().isoformat() if row.day is not None else None
    if "key" in group_by:
        out["key_id"] = row.key_id
        out["key_name"] = names.get(row.key_id) if row.key_id is not None else None
    if "model" in group_by:
        out["model"] = row.model
    out.update(
        requests=row.requests,
        errors=row.errors,
        prompt_tokens=row.prompt_tokens,
        completion_tokens=row.completion_tokens,
        total_tokens=row.total_tokens,
        mean_latency_ms=round(row.mean_latency_ms, 3),
    )
    return out
