"""A failure's summary quotes the engine's last message whole, not a wrapped fragment."""

from __future__ import annotations

from datetime import UTC, datetime

from llmgw.control.reconciler.state import Failure

AT = datetime(2026, 1, 1, tzinfo=UTC)


def summary(*tail: str) -> str:
    return Failure("m", "node-a", "m-1", "engine exited", tuple(tail), 1, AT).describe()


def test_a_plain_last_line_is_quoted_as_it_is() -> None:
    assert summary("INFO starting", "ValueError: no such model 'x'", "") == (
        "replica m-1 on node node-a failed: engine exited (exit code 1); "
        "last output: ValueError: no such model 'x'"
    )


def test_a_message_wrapped_inside_a_box_is_quoted_whole() -> None:
    boxed = (
        "INFO loading",
        "╭─ Error ─────────────────────────────────────────────╮",
        "│ Invalid value for '--max-model-len': the model's    │",
        "│ max seq len (32768) is larger than the KV cache      │",
        "│ (2048 tokens). Try increasing gpu_memory_utilization.│",
        "╰──────────────────────────────────────────────────────╯",
    )
    assert summary(*boxed).endswith(
        "last output: Invalid value for '--max-model-len': the model's max seq len (32768) "
        "is larger than the KV cache (2048 tokens). Try increasing gpu_memory_utilization."
    )


def test_only_the_last_paragraph_of_a_box_and_at_most_a_bounded_quote() -> None:
    boxed = (
        "╭──────────────╮",
        "│ Usage: vllm  │",
        "│              │",
        "│ Error: bad   │",
        "│ flag --x     │",
        "╰──────────────╯",
    )
    assert summary(*boxed).endswith("last output: Error: bad flag --x")
    long_box = ("╭─╮", *(f"│ word{i:03d} " + "x" * 60 + " │" for i in range(40)), "╰─╯")
    quoted = summary(*long_box).split("last output: ", 1)[1]
    assert quoted.startswith("… word") and quoted.endswith("word039 " + "x" * 60)
    assert len(quoted) <= 600 + 2


def test_the_summary_for_api_clients_says_where_not_why() -> None:
    failure = Failure(
        "m",
        "node-a",
        "m-1",
        "health probe failing: cannot connect to 10.0.3.7:20001",
        ("INFO: Uvicorn running on http://10.0.3.7:20001",),
        1,
        AT,
    )
    assert failure.summary() == "replica m-1 on node node-a failed (exit code 1)"
    assert "10.0.3.7" in failure.describe()
