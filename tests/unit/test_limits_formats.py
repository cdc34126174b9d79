"""Reset-header durations, prompt-token estimates and limit validation."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from llmgw.limits import KeyLimits, estimate_prompt_tokens, format_duration
from llmgw.limits.periods import period_containing


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (-1, "0s"),
        (0.02, "20ms"),
        (0.0001, "1ms"),
        (0.999, "999ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (8.64, "8.64s"),
        (59.9991, "1m0s"),  # rounded up to the millisecond
        (60, "1m0s"),
        (360, "6m0s"),
        (86.4, "1m26.4s"),
        (3723, "1h2m3s"),
        (7200, "2h0m0s"),
    ],
)
def test_reset_durations_use_openais_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_estimate_counts_chat_text_and_message_overhead() -> None:
    body = {
        "model": "m",
        "max_tokens": 10_000,  # not counted
        "messages": [
            {"role": "system", "content": "x" * 40},
            {"role": "user", "content": [{"type": "text", "text": "y" * 40}]},
        ],
    }
    # 80 chars / 4 + 2 messages * 4 + 3 for the reply
    assert estimate_prompt_tokens(body) == 20 + 8 + 3


def test_estimate_counts_images_as_a_flat_cost() -> None:
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:"}}]}
        ]
    }
    assert estimate_prompt_tokens(body) == 85 + 4 + 3


def test_estimate_of_completion_and_embedding_inputs() -> None:
    assert estimate_prompt_tokens({"prompt": "The capital of France is"}) == 6  # 24 chars
    assert estimate_prompt_tokens({"prompt": ["abcd", "efgh"]}) == 2
    assert estimate_prompt_tokens({"prompt": [1, 2, 3]}) == 3  # token ids count as tokens
    assert estimate_prompt_tokens({"input": [[1, 2], [3]]}) == 3
    assert estimate_prompt_tokens({}) == 0


def test_estimate_counts_tool_definitions() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert estimate_prompt_tokens({"prompt": "", "tools": tools}) > 5


def test_estimate_never_raises_on_odd_bodies() -> None:
    body = {"messages": [None, {"content": 5}, {"content": [None, 3]}], "prompt": {"a": 1}}
    assert estimate_prompt_tokens(body) > 0
    assert estimate_prompt_tokens({"messages": "not a list", "tools": [object()]}) == 0


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"rpm": 0}, "rpm must be >= 1"),
        ({"tpm": -5}, "tpm must be >= 1"),
        ({"budget_tokens": -1, "budget_period": "day"}, "budget_tokens must be >= 0"),
        ({"budget_tokens": 10}, "budget_period must be 'day' or 'month'"),
    ],
)
def test_bad_limits_fail_where_they_are_built(kwargs: dict[str, object], fragment: str) -> None:
    fields: dict[str, object] = {
        "rpm": None,
        "tpm": None,
        "budget_tokens": None,
        "budget_period": None,
    }
    fields.update(kwargs)
    with pytest.raises(ValueError, match=fragment):
        KeyLimits("k1", **fields)  # type: ignore[arg-type]


def test_periods_are_utc_calendar_days_and_months() -> None:
    from datetime import timedelta, timezone

    # 01:30 on March 1st in UTC+2 is still February 28th in UTC.
    at = datetime(2025, 3, 1, 1, 30, tzinfo=timezone(timedelta(hours=2)))
    day = period_containing("day", at)
    assert (day.id, day.start, day.end) == (
        "d2025-02-28",
        datetime(2025, 2, 28, tzinfo=UTC),
        datetime(2025, 3, 1, tzinfo=UTC),
    )
    month = period_containing("month", datetime(2025, 12, 31, 23, 59, tzinfo=UTC))
    assert (month.id, month.end) == ("m2025-12", datetime(2026, 1, 1, tzinfo=UTC))
