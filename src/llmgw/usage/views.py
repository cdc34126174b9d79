"""Usage roll-up rows and single requests' records as the CLI's `--json` and the
admin API show them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmgw.store import UsageDimension, UsageRecord, UsageRow


def usage_row_view(
    row: UsageRow,
    group_by: Sequence[UsageDimension],
    names: Mapping[str, str],
    team_names: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One row as JSON-ready fields; `names` maps key ids to key names, `team_names`
    team ids to team names."""
    out: dict[str, Any] = {}
    if "hour" in group_by:
        out["hour"] = row.hour.isoformat() if row.hour is not None else None
    if "day" in group_by:
        out["day"] = row.day.date().isoformat() if row.day is not None else None
    if "team" in group_by:
        out["team_id"] = row.team_id
        out["team"] = (team_names or {}).get(row.team_id) if row.team_id is not None else None
    if "key" in group_by:
        out["key_id"] = row.key_id
        out["key_name"] = names.get(row.key_id) if row.key_id is not None else None
    if "end-user" in group_by:
        out["end_user"] = row.end_user
    if "model" in group_by:
        out["model"] = row.model
        if row.base is not None:
            out["adapter_of"] = row.base
    out.update(
        requests=row.requests,
        errors=row.errors,
        prompt_tokens=row.prompt_tokens,
        completion_tokens=row.completion_tokens,
        total_tokens=row.total_tokens,
        mean_latency_ms=round(row.mean_latency_ms, 3),
    )
    return out


def usage_record_view(record: UsageRecord, names: Mapping[str, str]) -> dict[str, Any]:
    """One request's record as JSON-ready fields; `names` maps key ids to key names."""
    return {
        "ts": record.ts.isoformat(),
        "request_id": record.request_id,
        "key_id": record.key_id,
        "key_name": names.get(record.key_id) if record.key_id is not None else None,
        "model": record.model,
        "route": record.route or None,
        "endpoint": record.endpoint,
        "status": record.status,
        "streamed": record.streamed,
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "latency_ms": round(record.latency_ms, 3),
        "ttft_ms": None if record.ttft_ms is None else round(record.ttft_ms, 3),
        "queue_ms": round(record.queue_ms, 3),
        "continued": record.continued,
        "version": record.version or None,
        "end_user": record.end_user or None,
    }
