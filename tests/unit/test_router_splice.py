"""Reading back a broken stream, building its continuation and splicing the answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from llmgw.config import ConfigError, load_server_config
from llmgw.config.continuation import ContinuationConfig
from llmgw.engines import continues_of, continues_thoughts, continues_tool_calls
from llmgw.router.requests import parse_request
from llmgw.router.splice import add_usage, continuation_body, read_back, remaining, rewrite

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m"}


def chat_event(content: str | None = None, **delta: Any) -> bytes:
    if content is not None:
        delta["content"] = content
    choice = {"index": 0, "delta": delta, "finish_reason": None}
    return b"data: " + orjson.dumps({**HEAD, "choices": [choice]}) + b"\n\n"


def test_read_back_joins_the_text_and_counts_one_token_per_chunk() -> None:
    sent = chat_event(" w1", role="assistant") + b": llmgw replica r1\n\n" + chat_event(" w2")
    splice = read_back(sent, chat=True)
    assert splice is not None
    assert (splice.text, splice.tokens, splice.head) == (" w1 w2", 2, HEAD)


def test_read_back_takes_crlf_events_and_completions() -> None:
    event = {**HEAD, "object": "text_completion", "choices": [{"index": 0, "text": " w1"}]}
    sent = b"data: " + orjson.dumps(event) + b"\r\n\r\n"
    splice = read_back(sent * 2, chat=False)
    assert splice is not None and (splice.text, splice.tokens) == (" w1 w1", 2)


@pytest.mark.parametrize(
    "sent",
    [
        b"",
        b": only a comment\n\n",
        chat_event(" w1") + chat_event(tool_calls=[{"index": 0, "function": {"arguments": "{"}}]),
        # A thought after the answer began: no markup puts it there.
        chat_event(" w1") + chat_event(reasoning_content="hmm"),
        chat_event(" w1")
        + b"data: "
        + orjson.dumps({**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        + b"\n\n",
        b"data: " + orjson.dumps({**HEAD, "choices": [{"index": 1, "delta": {}}]}) + b"\n\n",
        chat_event(" w1") + b'event: error\ndata: {"error": {"message": "x"}}\n\n',
    ],
)
def test_what_cannot_be_continued_reads_back_as_none(sent: bytes) -> None:
    assert read_back(sent, chat=True) is None


def test_a_chat_continues_its_final_assistant_message_with_fewer_tokens() -> None:
    req = parse_request(
        "/v1/chat/completions",
        orjson.dumps(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "count"}],
                "max_tokens": 10,
                "stream": True,
                "echo": True,
            }
        ),
    )
    splice = read_back(chat_event(" w1") + chat_event(" w2"), chat=True)
    assert splice is not None
    assert remaining(req.body, splice.tokens) == 8
    body = orjson.loads(continuation_body(req, splice) or b"")
    assert body["messages"][-1] == {"role": "assistant", "content": " w1 w2"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_tokens"] == 8 and "echo" not in body
    assert body["stream_options"] == {"include_usage": True}
    # The request itself is unchanged: a second continuation starts from it again.
    assert len(req.body["messages"]) == 1


def test_a_thought_goes_back_in_think_markup_open_while_under_way_and_closed_after() -> None:
    req = parse_request(
        "/v1/chat/completions",
        orjson.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
        ),
    )
    thinking = chat_event(reasoning=" w1", role="assistant") + chat_event(reasoning_content=" w2")
    splice = read_back(thinking, chat=True)
    assert splice is not None and (splice.reasoning, splice.text, splice.tokens) == (
        " w1 w2",
        "",
        2,
    )
    body = orjson.loads(continuation_body(req, splice) or b"")
    assert body["messages"][-1] == {"role": "assistant", "content": "<think> w1 w2"}
    answered = read_back(thinking + chat_event(" w3"), chat=True)
    assert answered is not None
    body = orjson.loads(continuation_body(req, answered) or b"")
    assert body["messages"][-1] == {"role": "assistant", "content": "<think> w1 w2</think> w3"}
    # The continuation's thought and text are counted and passed on as they come.
    out, _ = rewrite(chat_event(reasoning=" w3", role="assistant"), splice)
    assert b'"reasoning":" w3"' in out and b"role" not in out
    assert (splice.reasoning, splice.tokens) == (" w1 w2 w3", 3)


def test_a_tool_call_goes_back_in_hermes_markup_and_its_rest_comes_as_its_arguments() -> None:
    req = parse_request(
        "/v1/chat/completions",
        orjson.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
        ),
    )
    named = {"index": 0, "id": "call-1", "type": "function", "function": {"name": "count"}}
    sent = (
        chat_event(role="assistant", tool_calls=[named])
        + chat_event(tool_calls=[{"index": 0, "function": {"arguments": '{"n": "w1'}}])
        + chat_event(tool_calls=[{"index": 0, "function": {"arguments": " {w2}"}}])
    )
    splice = read_back(sent, chat=True)
    assert splice is not None and len(splice.calls) == 1 and splice.tokens == 2
    body = orjson.loads(continuation_body(req, splice) or b"")
    assert body["messages"][-1]["content"] == (
        '<tool_call>\n{"name": "count", "arguments": {"n": "w1 {w2}'
    )
    # The engine's parser never saw the call open: the rest comes as text.
    rest = chat_event(" w3", role="assistant") + chat_event('"}}\n</tool_call>')
    rest += (
        b"data: "
        + orjson.dumps({**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        + b"\n\n"
    )
    splice.begin()
    out, _ = rewrite(rest, splice)
    deltas = [orjson.loads(e[6:])["choices"][0] for e in out.split(b"\n\n") if e]
    assert [d["delta"] for d in deltas] == [
        {"tool_calls": [{"index": 0, "function": {"arguments": " w3"}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"}'}}]},
        {},
    ]
    assert deltas[-1]["finish_reason"] == "tool_calls"
    assert orjson.loads(splice.calls[0].arguments) == {"n": "w1 {w2} w3"}
    # A delta for an earlier call after a later one opened cannot be written back in order.
    other = {**named, "index": 1, "id": "call-2"}
    late = chat_event(tool_calls=[{"index": 0, "function": {"arguments": "x"}}])
    assert read_back(sent + chat_event(tool_calls=[other]) + late, chat=True) is None


def _deltas(out: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(e[6:])["choices"][0] for e in out.split(b"\n\n") if e]


def test_parallel_calls_after_a_thought_go_back_in_order_and_new_calls_take_the_next_index() -> (
    None
):
    req = parse_request(
        "/v1/chat/completions",
        orjson.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
        ),
    )
    first = {"index": 0, "id": "call-1", "type": "function", "function": {"name": "count"}}
    second = {"index": 1, "id": "call-2", "type": "function", "function": {"name": "count"}}
    sent = (
        chat_event(reasoning=" w1", role="assistant")
        + chat_event(tool_calls=[first])
        + chat_event(tool_calls=[{"index": 0, "function": {"arguments": '{"n": " w2"}'}}])
        + chat_event(tool_calls=[second])
        + chat_event(tool_calls=[{"index": 1, "function": {"arguments": '{"n": " w3'}}])
    )
    splice = read_back(sent, chat=True)
    assert splice is not None and [c.id for c in splice.calls] == ["call-1", "call-2"]
    assert (splice.reasoning, splice.tokens) == (" w1", 3)
    body = orjson.loads(continuation_body(req, splice) or b"")
    assert body["messages"][-1]["content"] == (
        '<think> w1</think><tool_call>\n{"name": "count", "arguments": {"n": " w2"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "count", "arguments": {"n": " w3'
    )
    # The open call's rest comes as text; the engine's next call is its index 0.
    third = {"index": 0, "id": "call-9", "type": "function", "function": {"name": "count"}}
    splice.begin()
    out, _ = rewrite(
        chat_event(' w4"}}\n</tool_call>', role="assistant")
        + chat_event(tool_calls=[third])
        + chat_event(tool_calls=[{"index": 0, "function": {"arguments": '{"n": " w5"}'}}]),
        splice,
    )
    assert [d["delta"] for d in _deltas(out)] == [
        {"tool_calls": [{"index": 1, "function": {"arguments": ' w4"}'}}]},
        {"tool_calls": [{**third, "index": 2}]},
        {"tool_calls": [{"index": 2, "function": {"arguments": '{"n": " w5"}'}}]},
    ]
    assert [(c.index, c.id, c.arguments) for c in splice.calls] == [
        (0, "call-1", '{"n": " w2"}'),
        (1, "call-2", '{"n": " w3 w4"}'),
        (2, "call-9", '{"n": " w5"}'),
    ]
    assert splice.tokens == 5
    # Broken between calls: every call goes back closed, and the next is the engine's 0.
    splice.begin()
    assert (splice.call_base, splice.text_call) == (3, None)
    body = orjson.loads(continuation_body(req, splice) or b"")
    assert body["messages"][-1]["content"].endswith(
        '{"name": "count", "arguments": {"n": " w5"}}\n</tool_call>'
    )


def test_the_engines_say_which_reasoning_parsers_they_write_back() -> None:
    assert continues_thoughts("vllm", ["--reasoning-parser", "deepseek_r1"])
    assert continues_thoughts("vllm", ["--reasoning-parser=qwen3"])
    assert continues_thoughts("sglang", ["--reasoning-parser", "deepseek-r1"])
    assert not continues_thoughts("vllm", ["--reasoning-parser", "granite"])
    assert not continues_thoughts("vllm", [])
    assert not continues_thoughts("llamacpp", ["--reasoning-parser", "deepseek_r1"])
    assert not continues_thoughts("", ["--reasoning-parser", "deepseek_r1"])
    assert continues_tool_calls("vllm", ["--tool-call-parser", "hermes"])
    assert continues_tool_calls("sglang", ["--tool-call-parser", "qwen25"])
    assert not continues_tool_calls("vllm", ["--tool-call-parser", "mistral"])


def test_a_prefilled_assistant_message_is_extended_and_completions_append_to_the_prompt() -> None:
    prefilled = parse_request(
        "/v1/chat/completions",
        orjson.dumps(
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": "c"},
                    {"role": "assistant", "content": "A:"},
                ],
                "continue_final_message": True,
                "add_generation_prompt": False,
                "stream": True,
            }
        ),
    )
    splice = read_back(chat_event(" w1"), chat=True)
    assert splice is not None
    body = orjson.loads(continuation_body(prefilled, splice) or b"")
    assert body["messages"][-1] == {"role": "assistant", "content": "A: w1"}
    completion = parse_request(
        "/v1/completions",
        orjson.dumps({"model": "m", "prompt": ["Count:"], "max_completion_tokens": 1}),
    )
    text = read_back(
        b"data: " + orjson.dumps({**HEAD, "choices": [{"index": 0, "text": " w1"}]}) + b"\n\n",
        chat=False,
    )
    assert text is not None
    # Nothing left to generate: no continuation.
    assert continuation_body(completion, text) is None
    completion.body["max_completion_tokens"] = 3
    assert orjson.loads(continuation_body(completion, text) or b"")["prompt"] == ["Count: w1"]


def test_rewrite_keeps_the_first_answer_s_id_drops_role_usage_and_done() -> None:
    splice = read_back(chat_event(" w1"), chat=True)
    assert splice is not None
    other = {"id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 9, "model": "m"}
    role = {**other, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    token = {**other, "choices": [{"index": 0, "delta": {"role": "assistant", "content": " w2"}}]}
    end = {**other, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    usage = {**other, "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 1}}
    events = b"".join(
        b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in (role, token, end, usage)
    )
    out, found = rewrite(events + b"data: [DONE]\n\n", splice)
    chunks = [orjson.loads(line[len(b"data: ") :]) for line in out.split(b"\n\n") if line]
    assert [c["id"] for c in chunks] == ["chatcmpl-1", "chatcmpl-1"]
    assert chunks[0]["choices"][0]["delta"] == {"content": " w2"}
    assert chunks[1]["choices"][0]["finish_reason"] == "length"
    assert all(c["created"] == 7 for c in chunks)
    assert found == {"prompt_tokens": 12, "completion_tokens": 1}
    assert (splice.text, splice.tokens) == (" w1 w2", 2)
    # Before any usage: the router's estimate for the first attempt and for each
    # continuation that died unreported, plus the text it was given.
    splice.begin()
    assert splice.prompt_tokens(estimate=4) == 4 + (4 + 2)
    # The first attempt's prompt: the reporting continuation's less the tokens it was given.
    add_usage(splice, found)
    assert splice.prompt_tokens(estimate=4) == (12 - 2) + 12
    splice.begin()
    assert splice.prompt_tokens(estimate=4) == 10 + 12 + (10 + 2)


def test_a_continuation_that_reported_its_usage_counts_as_it_reported() -> None:
    splice = read_back(chat_event(" w1") + chat_event(" w2"), chat=True)
    assert splice is not None
    assert splice.completion_tokens() == 2
    # The first continuation breaks after two chunks, unreported: they are counted.
    splice.begin()
    splice.tokens += 2
    assert splice.completion_tokens() == 4
    # The second sends three chunks but reports four tokens (two came in one chunk).
    splice.begin()
    splice.tokens += 3
    assert splice.completion_tokens() == 7
    add_usage(splice, {"prompt_tokens": 20, "completion_tokens": 4})
    assert splice.completion_tokens() == 2 + 2 + 4


def test_continuation_settings_per_model_and_engines_that_continue() -> None:
    config = ContinuationConfig(models={"noisy": False})
    assert config.enabled_for("m") and not config.enabled_for("noisy")
    assert not ContinuationConfig(enabled=False, models={"m": True}).enabled_for("other")
    assert "/v1/chat/completions" in continues_of("vllm")
    assert "/v1/chat/completions" in continues_of("sglang")
    assert continues_of("llamacpp") == frozenset({"/v1/completions"})
    assert continues_of("") == frozenset()


def test_bad_continuation_settings_name_the_field_and_file(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.yaml"
    path.write_text("router:\n  continuation:\n    max_attempts: 0\n    models: {a: maybe}\n")
    with pytest.raises(ConfigError) as info:
        load_server_config(path, {})
    message = str(info.value)
    assert str(path) in message
    assert "router.continuation.max_attempts" in message
    assert "router.continuation.models.a" in message
