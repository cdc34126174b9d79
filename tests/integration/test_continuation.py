"""Mid-stream continuation through a real `llmgw server` and real `llmgw sim` replicas.

The sims count (`--text sequence`: ` w1 w2 ...`, continuing from the `wN` a continued
text ends with), so a spliced stream shows any gap or repeated token. Faults break
streams after N tokens (`break_after_tokens`), the process exits mid-stream
(`exit_after_tokens`) or is killed with SIGKILL by the test. Every wait is on an
event (a chunk read, a record written), never a sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from procs import Proc, Server, Sim, free_port, free_port_block, llmgw, wait_for
from streams import MESSAGES, Streamed, events_of, records, sim_pids, stream, words


def write_config(
    path: Path, sims: dict[str, str], *, engine: str | None, extra: str = "", fields: str = ""
) -> Path:
    """Endpoints of model m1 (`fields`: more of each endpoint's, e.g. its `apis`)."""
    lines = ["endpoints:"]
    for name, url in sims.items():
        declared = f", engine: {engine}" if engine else ""
        lines.append(f"  - {{id: {name}, url: '{url}', models: [m1]{declared}{fields}}}")
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Server, dict[str, Sim]]]:
    """Three counting sims (a real inter-token time, so streams last a while) behind one
    server that knows them as `sim` engines."""
    sims = {name: Sim("--text", "sequence", "--itl", "0.02", model="m1") for name in "abc"}
    config = write_config(
        tmp_path / "llmgw.yaml", {n: s.url for n, s in sims.items()}, engine="sim"
    )
    server = Server("--config", str(config))
    yield server, sims
    server.proc.stop()
    for sim in sims.values():
        sim.proc.stop()


@pytest.mark.timeout(300)
def test_a_sigkilled_replica_s_streams_finish_on_the_others(
    fleet: tuple[Server, dict[str, Sim]],
) -> None:
    server, sims = fleet
    body = {
        "model": "m1",
        "messages": MESSAGES,
        "max_tokens": 60,
        "stream_options": {"include_usage": True},
    }
    on_victim = threading.Event()

    def seen(streamed: Streamed) -> None:
        if streamed.replica == "a":
            on_victim.set()

    with ThreadPoolExecutor(max_workers=24) as pool:
        futures = [pool.submit(stream, server, body, on_tokens=seen) for _ in range(24)]
        # Kill sim `a` once a client has three tokens of a stream it serves.
        wait_for(on_victim.is_set, "a client reading a stream of sim a", within=200)
        sims["a"].proc.signal(signal.SIGKILL)
        results = [f.result(timeout=240) for f in futures]

    for result in results:
        assert result.status == 200
        assert result.errors == []
        assert result.text.split() == words(60), result.text
        assert len(result.ids) == 1
        assert result.roles == 1
        assert result.done == 1
        assert len(result.usage) == 1 and result.usage[0]["completion_tokens"] == 60

    def all_recorded() -> dict[str, tuple[int, int, int, int]] | None:
        found = records(server.data_dir)
        return found if len(found) >= len(results) else None

    recorded = wait_for(all_recorded, "a usage record per request", within=60)
    assert {r.request_id for r in results} <= set(recorded)
    # Every stream that began on `a` was continued once; the others never were.
    on_a = [r for r in results if r.replica == "a"]
    assert on_a
    for result in results:
        status, prompt, completion, times = recorded[result.request_id]
        assert (status, completion) == (200, 60)
        assert result.usage[0]["prompt_tokens"] == prompt
        assert times == (1 if result.replica == "a" else 0)
    assert 'llmgw_continuations_total{cause="disconnect",model="m1"}' in server.metrics()


@pytest.fixture(scope="module")
def breaking(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, list[Sim]]]:
    """Three zero-delay counting sims that all break every generation after 4 tokens."""
    sims = [
        Sim("--text", "sequence", "--zero-delay", "--break-after-tokens", "4", model="m1")
        for _ in range(3)
    ]
    tmp = tmp_path_factory.mktemp("breaking")
    config = write_config(
        tmp / "llmgw.yaml", {f"s{i}": s.url for i, s in enumerate(sims)}, engine="sim"
    )
    server = Server("--config", str(config))
    yield server, sims
    server.proc.stop()
    for sim in sims:
        sim.proc.stop()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_each_break_is_continued_up_to_max_attempts(
    breaking: tuple[Server, list[Sim]], path: str
) -> None:
    server, _ = breaking
    chat = path == "/v1/chat/completions"
    body: dict[str, Any] = {"model": "m1", "max_tokens": 12}
    body.update({"messages": MESSAGES} if chat else {"prompt": "Count:"})
    # 4 tokens, then two continuations of 4 (the last one is the answer's end).
    whole = stream(server, {**body, "stream_options": {"include_usage": True}}, path=path)
    assert (whole.status, whole.errors, whole.done) == (200, [], 1)
    assert whole.text.split() == words(12)
    assert len(whole.ids) == 1 and len(whole.usage) == 1
    assert whole.usage[0]["completion_tokens"] == 12
    # Without include_usage the client gets no usage chunk, continued or not.
    quiet = stream(server, body, path=path)
    assert quiet.text.split() == words(12) and quiet.usage == []
    # 16 tokens need a third continuation: max_attempts (2) ends the stream with the error.
    cut = stream(server, {**body, "max_tokens": 16}, path=path)
    assert cut.text.split() == words(12)
    assert cut.done == 0
    [error] = cut.errors
    assert "router.continuation.max_attempts: 2" in error["error"]["message"]

    def recorded() -> tuple[int, int, int, int] | None:
        return records(server.data_dir).get(cut.request_id)

    status, _, completion, continued = wait_for(recorded, "the cut stream's usage record")
    assert (status, completion, continued) == (200, 12, 2)
    assert records(server.data_dir)[whole.request_id][2:] == (12, 2)


def test_a_translated_messages_stream_is_continued(breaking: tuple[Server, list[Sim]]) -> None:
    server, _ = breaking
    with (
        anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0) as client,
        client.messages.stream(model="m1", max_tokens=12, messages=MESSAGES) as events,
    ):
        kinds = []
        text = ""
        for event in events:
            kinds.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                text += event.delta.text
        final = events.get_final_message()
    assert text.split() == words(12)
    assert kinds[0] == "message_start" and kinds.count("message_start") == 1
    assert kinds[-1] == "message_stop"
    assert final.usage.output_tokens == 12


def test_requests_that_are_never_continued_end_with_the_error_event(
    breaking: tuple[Server, list[Sim]],
) -> None:
    server, _ = breaking
    base = {"model": "m1", "messages": MESSAGES, "max_tokens": 12}
    for extra in ({"n": 2}, {"logprobs": True}):
        result = stream(server, {**base, **extra})
        assert result.text.split() == words(4)
        [error] = result.errors
        assert error["error"]["code"] == "engine_unreachable"
        assert result.done == 0


def test_non_streaming_requests_broken_mid_answer_are_retried_whole(tmp_path: Path) -> None:
    # Two of three replicas cut every answer short; the third one answers.
    sims = [
        Sim("--text", "sequence", "--zero-delay", "--break-after-tokens", "4", model="m1"),
        Sim("--text", "sequence", "--zero-delay", "--break-after-tokens", "4", model="m1"),
        Sim("--text", "sequence", "--zero-delay", model="m1"),
    ]
    config = write_config(
        tmp_path / "llmgw.yaml", {f"s{i}": s.url for i, s in enumerate(sims)}, engine="sim"
    )
    server = Server("--config", str(config))
    try:
        for _ in range(6):
            resp = httpx.post(
                server.url + "/v1/chat/completions",
                json={"model": "m1", "messages": MESSAGES, "max_tokens": 12},
                timeout=60,
            )
            assert resp.status_code == 200, resp.text
            assert resp.json()["choices"][0]["message"]["content"].split() == words(12)
            assert resp.headers["x-llmgw-replica"] == "s2"
    finally:
        server.proc.stop()
        for sim in sims:
            sim.proc.stop()


def test_an_engine_that_cannot_continue_ends_the_stream_with_the_error_event(
    tmp_path: Path,
) -> None:
    # Endpoints whose engine is not declared: llmgw does not guess that they continue.
    sims = [
        Sim("--text", "sequence", "--zero-delay", "--break-after-tokens", "4", model="m1")
        for _ in range(2)
    ]
    config = write_config(
        tmp_path / "llmgw.yaml", {f"s{i}": s.url for i, s in enumerate(sims)}, engine=None
    )
    server = Server("--config", str(config))
    try:
        result = stream(server, {"model": "m1", "messages": MESSAGES, "max_tokens": 12})
        assert result.text.split() == words(4)
        [error] = result.errors
        assert error["error"]["code"] == "engine_unreachable"
        assert "failed mid-stream" in error["error"]["message"]
    finally:
        server.proc.stop()
        for sim in sims:
            sim.proc.stop()


TOOLS = [{"type": "function", "function": {"name": "count", "parameters": {"type": "object"}}}]


@pytest.mark.timeout(300)
def test_a_tool_call_is_continued_in_its_parser_s_markup(tmp_path: Path) -> None:
    # The profile names the hermes tool parser: the call so far goes back as
    # <tool_call>{"name": ..., "arguments": ...; the rest the engine writes as text is
    # relayed as the same call's arguments.
    body = {"model": "m1", "messages": MESSAGES, "max_tokens": 30, "tools": TOOLS}
    args = ", --tool-call-parser, hermes"
    result, record = killed_mid_stream(tmp_path, body, after=6, args=args)
    assert result.errors == [] and result.done == 1, result.errors
    assert result.text == "" and list(result.calls) == [0], result.calls
    call = result.calls[0]
    assert len(call["ids"]) == 1 and call["name"] == "count", call
    assert json.loads(call["arguments"]) == {"n": " ".join(["", *words(30)])}, call
    assert result.finishes == ["tool_calls"], result.finishes
    assert len(result.ids) == 1 and result.roles == 1
    assert record[2:] == (30, 1)


def test_a_thought_or_call_whose_markup_llmgw_cannot_rebuild_ends_with_the_error_event(
    tmp_path: Path,
) -> None:
    # Static endpoints name their engine but not its parsers: a thought or a tool call
    # broken off cannot be written back in markup llmgw knows the engine reads.
    # m1's sims think (and would call after the thought); m2's only call.
    flags = {
        "m1": ("--reasoning-parser", "deepseek_r1", "--reasoning-words", "8"),
        "m2": (),
    }
    sims = {
        (model, i): Sim(
            "--text", "sequence", "--zero-delay", "--break-after-tokens", "4",
            "--tool-call-parser", "hermes", *flags[model], model=model,
        )
        for model in flags
        for i in range(2)
    }  # fmt: skip
    lines = ["endpoints:"] + [
        f"  - {{id: {model}-{i}, url: '{sim.url}', models: [{model}], engine: sim}}"
        for (model, i), sim in sims.items()
    ]
    (tmp_path / "llmgw.yaml").write_text("\n".join(lines) + "\n")
    server = Server("--config", str(tmp_path / "llmgw.yaml"))
    try:
        result = stream(server, {"model": "m1", "messages": MESSAGES, "max_tokens": 12})
        assert result.reasoning.split() == words(4) and result.text == ""
        [error] = result.errors
        assert error["error"]["code"] == "engine_unreachable"
        assert result.done == 0
        body = {"model": "m2", "messages": MESSAGES, "max_tokens": 12, "tools": TOOLS}
        called = stream(server, body)
        assert called.argument_chunks == 4 and called.calls[0]["name"] == "count"
        [error] = called.errors
        assert error["error"]["code"] == "engine_unreachable"
        assert called.done == 0
    finally:
        server.proc.stop()
        for sim in sims.values():
            sim.proc.stop()


def test_a_continuation_waits_for_a_replica_with_keepalive_comments(tmp_path: Path) -> None:
    # Replica a exits after 4 tokens; replica b is not running yet when it does.
    first = Sim("--text", "sequence", "--zero-delay", "--exit-after-tokens", "4", model="m1")
    later_port = free_port()
    later_url = f"http://127.0.0.1:{later_port}"
    config = write_config(
        tmp_path / "llmgw.yaml",
        {"a": first.url, "b": later_url},
        engine="sim",
        extra="router: {health: {interval: 0.2}}\ncontrol: {activation_keepalive: 0.2}\n",
    )
    server = Server("--config", str(config))
    later: Proc | None = None
    try:

        def b_is_down() -> bool:
            return any(e["id"] == "b" and not e["healthy"] for e in server.endpoints())

        wait_for(b_is_down, "the router to see replica b down")
        commented = threading.Event()
        results: list[Streamed] = []
        body = {"model": "m1", "messages": MESSAGES, "max_tokens": 9}

        def run() -> None:
            results.append(stream(server, body, commented=commented))

        # The client's stream, read in a thread; b starts once a keep-alive comment came.
        reader = threading.Thread(target=run)
        reader.start()
        wait_for(commented.is_set, "a keep-alive comment while no replica can continue")
        later = Proc(
            llmgw(
                "sim",
                "--host",
                "127.0.0.1",
                "--port",
                str(later_port),
                "--model",
                "m1",
                "--text",
                "sequence",
                "--zero-delay",
            )
        )
        reader.join(timeout=300)
        [result] = results
        assert result.errors == []
        assert result.text.split() == words(9)
        assert any("llmgw continuing on another replica" in c for c in result.comments)
    finally:
        server.proc.stop()
        first.proc.stop()
        if later is not None:
            later.stop()


def test_a_translated_responses_stream_is_continued(breaking: tuple[Server, list[Sim]]) -> None:
    server, _ = breaking
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        events = list(
            client.responses.create(model="m1", input="Count.", max_output_tokens=12, stream=True)
        )
    kinds = [e.type for e in events]
    # It ends as a whole answer would: at max_output_tokens, "incomplete", never an error.
    assert kinds.count("response.created") == 1 and kinds[-1] == "response.incomplete"
    assert "error" not in kinds
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text.split() == words(12)


def test_a_stream_past_its_idle_deadline_is_continued(tmp_path: Path) -> None:
    # Replica s0 stalls after 4 tokens; the idle deadline moves its streams on.
    sims = [
        Sim("--text", "sequence", "--zero-delay", "--stall-after-tokens", "4", model="m1"),
        Sim("--text", "sequence", "--zero-delay", model="m1"),
    ]
    config = write_config(
        tmp_path / "llmgw.yaml",
        {f"s{i}": s.url for i, s in enumerate(sims)},
        engine="sim",
        extra="router: {timeouts: {idle: 1.0}}\n",
    )
    server = Server("--config", str(config))
    try:
        served: set[str] = set()
        body = {"model": "m1", "messages": MESSAGES, "max_tokens": 10}
        # Until a stream began on the stalling replica (each lands on either).
        while "s0" not in served:
            result = stream(server, body)
            assert result.errors == [] and result.done == 1
            assert result.text.split() == words(10)
            served.add(result.replica)
        assert 'llmgw_continuations_total{cause="timeout_idle",model="m1"}' in server.metrics()
    finally:
        server.proc.stop()
        for sim in sims:
            sim.proc.stop()


FLEET_CONFIG = """
control:
  heartbeat_interval: 0.3
  reconcile_interval: 0.5
  activation_keepalive: 0.3
router: {health: {interval: 0.5}}
models:
  - name: m1
    weights: none
    min_replicas: 2
    max_replicas: 2
    keep_alive: -1
    profiles:
      - {name: sim, engine: sim, gpus: 1, engine_args: [--text, sequence, --itl, "0.05"ARGS]}
"""


def killed_mid_stream(
    tmp_path: Path, body: dict[str, Any], *, after: int, args: str = ""
) -> tuple[Streamed, tuple[int, int, int, int]]:
    """Two placed replicas of m1 (profile engine arguments `args` added); the engine
    serving a stream is killed with SIGKILL once the client has `after` words. The
    stream as the client read it, and its usage record."""
    (tmp_path / "llmgw.yaml").write_text(FLEET_CONFIG.replace("ARGS", args))
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(tmp_path / "llmgw.yaml"),
        data_dir=tmp_path / "data",
    )  # fmt: skip
    agents: list[Proc] = []
    lows: list[int] = []
    try:
        for node in ("node-a", "node-b"):
            low = free_port_block(10)
            lows.append(low)
            argv = llmgw(
                "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", node,
                "--gpus", "1x24GiB", "--weights-dir", str(tmp_path / node / "w"),
                "--state-dir", str(tmp_path / node / "s"), "--port-range", f"{low}-{low + 9}",
            )  # fmt: skip
            agents.append(Proc(argv))

        def two_routed() -> list[dict[str, object]] | None:
            found = [e for e in server.endpoints() if e["healthy"] and e["engine"] == "sim"]
            return found if len(found) == 2 else None

        endpoints = wait_for(two_routed, "two ready replicas in the router", within=240)
        urls = {str(e["id"]): str(e["url"]) for e in endpoints}
        victim: list[str] = []

        def kill(streamed: Streamed) -> None:
            # SIGKILL the engine serving this stream, found by its port.
            port = urls[streamed.replica].rsplit(":", 1)[1]
            for pid in sim_pids(port):
                os.kill(pid, signal.SIGKILL)
            victim.append(streamed.replica)

        result = stream(server, body, on_tokens=kill, after=after)
        assert victim == [result.replica]

        def recorded() -> tuple[int, int, int, int] | None:
            return records(tmp_path / "data").get(result.request_id)

        return result, wait_for(recorded, "the stream's usage record")
    except BaseException:
        print(server.proc.output())
        for proc in agents:
            print(f"--- agent\n{proc.output()}")
        raise
    finally:
        for proc in agents:
            proc.stop()
        # Engines outlive their agents: stop those the agents started.
        for low in lows:
            for port in range(low, low + 10):
                for pid in sim_pids(str(port)):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        server.proc.stop()


@pytest.mark.timeout(300)
def test_a_placed_replica_killed_mid_stream_is_continued_on_the_other(tmp_path: Path) -> None:
    body = {"model": "m1", "messages": MESSAGES, "max_tokens": 40}
    result, record = killed_mid_stream(tmp_path, body, after=5)
    assert result.errors == [] and result.done == 1
    assert result.text.split() == words(40)
    assert record[2:] == (40, 1)


THINKING = ', --reasoning-parser, deepseek_r1, --reasoning-words, "12"'


@pytest.mark.timeout(300)
@pytest.mark.parametrize("after", [5, 16], ids=["mid-thought", "after-the-thought"])
def test_a_thought_is_continued_in_its_parser_s_markup(tmp_path: Path, after: int) -> None:
    # The profile names a reasoning parser that writes <think>...</think>: the thought
    # so far goes back in that markup, and the client sees one thought and one answer.
    body = {"model": "m1", "messages": MESSAGES, "max_tokens": 30}
    result, record = killed_mid_stream(tmp_path, body, after=after, args=THINKING)
    assert result.errors == [] and result.done == 1, result.errors
    assert result.reasoning.split() == words(12), result.reasoning
    assert result.text.split() == words(30)[12:], result.text
    assert len(result.ids) == 1 and result.roles == 1
    assert record[2:] == (30, 1)


def calls_of(total: int, thought: int, per_call: int) -> list[dict[str, str]]:
    """The arguments of the sim's calls in a `total`-word answer whose first `thought`
    words are the thought and whose calls hold `per_call` words each."""
    numbers = [f"w{n}" for n in range(thought + 1, total + 1)]
    return [
        {"n": " ".join(["", *numbers[start : start + per_call]])}
        for start in range(0, len(numbers), per_call)
    ]


def assert_calls(result: Streamed, expected: list[dict[str, str]]) -> None:
    """One stream of `expected` calls, each opened once with its own id, in index order."""
    assert sorted(result.calls) == list(range(len(expected))), result.calls
    ids = [result.calls[i]["ids"] for i in range(len(expected))]
    assert all(len(sent) == 1 for sent in ids) and len({i[0] for i in ids}) == len(ids), ids
    for index, arguments in enumerate(expected):
        call = result.calls[index]
        assert call["name"] == "count" and json.loads(call["arguments"]) == arguments, call
    assert result.finishes == ["tool_calls"], result.finishes
    assert len(result.ids) == 1 and result.roles == 1


@pytest.mark.parametrize("cut", [2, 5, 6], ids=["mid-thought", "mid-call", "between-calls"])
def test_parallel_calls_after_a_thought_are_continued_on_static_endpoints(
    tmp_path: Path, cut: int
) -> None:
    # Static endpoints that name their engine's parsers; every generation breaks after
    # `cut` tokens: in the thought, inside a call, or between two calls.
    flags = (
        "--reasoning-parser", "deepseek_r1", "--reasoning-words", "3",
        "--tool-call-parser", "hermes", "--tool-call-words", "3",
    )  # fmt: skip
    sims = [
        Sim("--text", "sequence", "--zero-delay", "--break-after-tokens", str(cut), *flags,
            model="m1")
        for _ in range(2)
    ]  # fmt: skip
    config = write_config(
        tmp_path / "llmgw.yaml",
        {f"s{i}": s.url for i, s in enumerate(sims)},
        engine="sim",
        fields=", reasoning_parser: deepseek_r1, tool_call_parser: hermes",
        extra="router: {continuation: {max_attempts: 6}}\n",
    )
    server = Server("--config", str(config))
    try:
        body = {
            "model": "m1", "messages": MESSAGES, "max_tokens": 12, "tools": TOOLS,
            "stream_options": {"include_usage": True},
        }  # fmt: skip
        result = stream(server, body)
        assert result.errors == [] and result.done == 1, result.errors
        assert result.reasoning.split() == words(3) and result.text == ""
        # Calls 0 (w4-w6), 1 (w7-w9), 2 (w10-w12).
        assert_calls(result, calls_of(12, 3, 3))
        [usage] = result.usage
        assert usage["completion_tokens"] == 12

        def recorded() -> tuple[int, int, int, int] | None:
            return records(server.data_dir).get(result.request_id)

        status, prompt, completion, continued = wait_for(recorded, "the stream's usage record")
        assert (status, completion, continued) == (200, 12, -(-12 // cut) - 1)
        assert usage["prompt_tokens"] == prompt
    finally:
        server.proc.stop()
        for sim in sims:
            sim.proc.stop()


@pytest.fixture
def thinking_callers(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Server]:
    """Two static sims that think (w1-w3) and then call (3 words a call), breaking every
    generation after 5 tokens (mid-call); their endpoints name the parsers. With the
    param True they serve Messages and Responses natively."""
    native = getattr(request, "param", False)
    flags = (
        "--text", "sequence", "--zero-delay", "--break-after-tokens", "5",
        "--reasoning-parser", "deepseek_r1", "--reasoning-words", "3",
        "--tool-call-parser", "hermes", "--tool-call-words", "3",
    )  # fmt: skip
    if native:
        flags += ("--native-apis", "messages,responses")
    sims = [Sim(*flags, model="m1") for _ in range(2)]
    config = write_config(
        tmp_path / "llmgw.yaml",
        {f"s{i}": s.url for i, s in enumerate(sims)},
        engine="sim",
        fields=", reasoning_parser: deepseek_r1, tool_call_parser: hermes"
        + (", apis: {messages: native, responses: native}" if native else ""),
    )
    server = Server("--config", str(config))
    yield server
    server.proc.stop()
    for sim in sims:
        sim.proc.stop()


MESSAGES_TOOL = {"name": "count", "input_schema": {"type": "object", "properties": {}}}
RESPONSES_TOOL = {"type": "function", "name": "count", "parameters": {"type": "object"}}


def assert_message_blocks(events: list[dict[str, Any]]) -> None:
    """A Messages stream of a 12-word answer: a thought (w1-w3), then 3 calls of 3
    words, in one message whose blocks are numbered without a gap."""
    kinds = [e["type"] for e in events]
    assert "error" not in kinds and kinds.count("message_start") == 1, kinds
    assert kinds[-2:] == ["message_delta", "message_stop"], kinds
    starts = [e for e in events if e["type"] == "content_block_start"]
    # One thinking block, then one tool_use block per call, numbered without a gap.
    assert [e["index"] for e in starts] == [0, 1, 2, 3]
    assert [e["content_block"]["type"] for e in starts] == ["thinking", *["tool_use"] * 3]
    assert len({e["content_block"]["id"] for e in starts[1:]}) == 3
    stops = [e["index"] for e in events if e["type"] == "content_block_stop"]
    assert stops == [0, 1, 2, 3]
    deltas = [e for e in events if e["type"] == "content_block_delta"]
    thinking = "".join(e["delta"]["thinking"] for e in deltas if e["index"] == 0)
    assert thinking.split() == words(3)
    inputs = [
        json.loads("".join(e["delta"]["partial_json"] for e in deltas if e["index"] == block))
        for block in (1, 2, 3)
    ]
    assert inputs == calls_of(12, 3, 3)
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    assert events[-2]["usage"]["output_tokens"] == 12


def assert_response_items(events: list[dict[str, Any]]) -> None:
    """A Responses stream of a 12-word answer: a reasoning item (w1-w3), then 3
    function calls of 3 words, numbered without a gap."""
    kinds = [e["type"] for e in events]
    assert "error" not in kinds and kinds.count("response.created") == 1, kinds
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert [i["type"] for i in added] == ["reasoning", *["function_call"] * 3]
    assert len({i["id"] for i in added}) == 4 and len({i["call_id"] for i in added[1:]}) == 3
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed" and final["status"] == "completed"
    [reasoning, *calls] = final["output"]
    assert reasoning["content"][0]["text"].split() == words(3)
    assert [json.loads(c["arguments"]) for c in calls] == calls_of(12, 3, 3)
    assert [c["id"] for c in calls] == [i["id"] for i in added[1:]]
    assert final["usage"]["output_tokens"] == 12


@pytest.mark.parametrize(
    "thinking_callers", [False, True], ids=["translated", "native"], indirect=True
)
def test_a_messages_stream_with_thinking_and_tool_use_is_continued(
    thinking_callers: Server,
) -> None:
    # Natively served, the first answer's events are read back by the Messages API and
    # the rest comes through its translation; either way the blocks go on as one.
    server = thinking_callers
    body = {"model": "m1", "max_tokens": 12, "messages": MESSAGES, "tools": [MESSAGES_TOOL]}
    request_id, events = events_of(server, "/v1/messages", body)
    assert_message_blocks(events)

    def recorded() -> tuple[int, int, int, int] | None:
        return records(server.data_dir).get(request_id)

    assert wait_for(recorded, "the stream's usage record")[2:] == (12, 2)


@pytest.mark.parametrize(
    "thinking_callers", [False, True], ids=["translated", "native"], indirect=True
)
def test_a_responses_stream_with_reasoning_and_function_calls_is_continued(
    thinking_callers: Server,
) -> None:
    server = thinking_callers
    body = {"model": "m1", "input": "Count.", "max_output_tokens": 12, "tools": [RESPONSES_TOOL]}
    request_id, events = events_of(server, "/v1/responses", body)
    assert_response_items(events)

    def recorded() -> tuple[int, int, int, int] | None:
        return records(server.data_dir).get(request_id)

    assert wait_for(recorded, "the stream's usage record")[2:] == (12, 2)


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses"])
def test_a_native_stream_with_calls_survives_its_sigkilled_engine(
    tmp_path: Path, path: str
) -> None:
    # Two sims serve both APIs natively; the one serving the stream is SIGKILLed once
    # the client has the thought and part of the first call. The other continues it.
    flags = (
        "--text", "sequence", "--itl", "0.05", "--native-apis", "messages,responses",
        "--reasoning-parser", "deepseek_r1", "--reasoning-words", "3",
        "--tool-call-parser", "hermes", "--tool-call-words", "3",
    )  # fmt: skip
    sims = {f"s{i}": Sim(*flags, model="m1") for i in range(2)}
    config = write_config(
        tmp_path / "llmgw.yaml",
        {name: s.url for name, s in sims.items()},
        engine="sim",
        fields=", reasoning_parser: deepseek_r1, tool_call_parser: hermes"
        ", apis: {messages: native, responses: native}",
    )
    server = Server("--config", str(config))
    serving: list[str] = []
    deltas: list[str] = []

    def head(resp: httpx.Response) -> None:
        serving.append(resp.headers["x-llmgw-replica"])

    def each(event: dict[str, Any]) -> None:
        if event["type"].endswith("delta"):
            deltas.append(event["type"])
            if len(deltas) == 5:
                os.kill(sims[serving[0]].proc.popen.pid, signal.SIGKILL)

    try:
        if path == "/v1/messages":
            body = {"model": "m1", "max_tokens": 12, "messages": MESSAGES}
            body["tools"] = [MESSAGES_TOOL]
        else:
            body = {"model": "m1", "input": "Count.", "max_output_tokens": 12}
            body["tools"] = [RESPONSES_TOOL]
        request_id, events = events_of(server, path, body, head=head, each=each)
        assert len(deltas) >= 5 and sims[serving[0]].proc.popen.poll() is not None
        if path == "/v1/messages":
            assert_message_blocks(events)
        else:
            assert_response_items(events)

        def recorded() -> tuple[int, int, int, int] | None:
            return records(server.data_dir).get(request_id)

        assert wait_for(recorded, "the stream's usage record")[2:] == (12, 1)
    finally:
        server.proc.stop()
        for sim in sims.values():
            sim.proc.stop()


PARALLEL = (
    ', --reasoning-parser, deepseek_r1, --reasoning-words, "3"'
    ', --tool-call-parser, hermes, --tool-call-words, "4"'
)


@pytest.mark.timeout(300)
def test_parallel_calls_after_a_thought_survive_a_sigkilled_engine(tmp_path: Path) -> None:
    # A placed replica's engine is SIGKILLed with the thought done, one call written and
    # the second under way: the client gets one thought and seven calls, in order.
    body = {"model": "m1", "messages": MESSAGES, "max_tokens": 30, "tools": TOOLS}
    result, record = killed_mid_stream(tmp_path, body, after=9, args=PARALLEL)
    assert result.errors == [] and result.done == 1, result.errors
    assert result.reasoning.split() == words(3) and result.text == ""
    assert_calls(result, calls_of(30, 3, 4))
    assert record[2:] == (30, 1)


@pytest.fixture(scope="module")
def native_breaking(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Three counting sims serving Messages and Responses natively, all breaking every
    generation after 4 tokens."""
    flags = ("--zero-delay", "--break-after-tokens", "4", "--native-apis", "messages,responses")
    sims = [Sim("--text", "sequence", *flags, model="m1") for _ in range(3)]
    tmp = tmp_path_factory.mktemp("native")
    config = write_config(
        tmp / "llmgw.yaml",
        {f"n{i}": s.url for i, s in enumerate(sims)},
        engine="sim",
        fields=", apis: {messages: native, responses: native}",
    )
    server = Server("--config", str(config))
    yield server
    server.proc.stop()
    for sim in sims:
        sim.proc.stop()


def test_a_native_messages_stream_is_continued_in_its_own_events(native_breaking: Server) -> None:
    server = native_breaking
    body = {"model": "m1", "max_tokens": 12, "messages": MESSAGES}
    request_id, events = events_of(server, "/v1/messages", body)
    kinds = [e["type"] for e in events]
    # One message, one text block: the continuations go on in block 0 of the same message.
    assert kinds[0] == "message_start" and kinds.count("message_start") == 1, kinds
    assert kinds.count("content_block_start") == 1 and kinds.count("content_block_stop") == 1
    assert kinds[-2:] == ["message_delta", "message_stop"], kinds
    assert "error" not in kinds
    deltas = [e for e in events if e["type"] == "content_block_delta"]
    assert {e["index"] for e in deltas} == {0}
    assert "".join(e["delta"]["text"] for e in deltas).split() == words(12)
    end = events[-2]
    assert end["delta"]["stop_reason"] == "max_tokens"
    assert end["usage"]["output_tokens"] == 12

    def recorded() -> tuple[int, int, int, int] | None:
        return records(server.data_dir).get(request_id)

    status, prompt, completion, continued = wait_for(recorded, "the stream's usage record")
    assert (status, completion, continued) == (200, 12, 2)
    assert end["usage"]["input_tokens"] == prompt


def test_a_native_messages_stream_read_by_the_anthropic_sdk(native_breaking: Server) -> None:
    with (
        anthropic.Anthropic(base_url=native_breaking.url, api_key="x", max_retries=0) as client,
        client.messages.stream(model="m1", max_tokens=12, messages=MESSAGES) as events,
    ):
        text = "".join(events.text_stream)
        final = events.get_final_message()
    assert text.split() == words(12)
    [block] = final.content
    assert block.type == "text" and block.text.split() == words(12)
    assert (final.stop_reason, final.usage.output_tokens) == ("max_tokens", 12)


def test_a_native_responses_stream_is_continued_in_its_own_events(
    native_breaking: Server,
) -> None:
    server = native_breaking
    body = {"model": "m1", "input": "Count.", "max_output_tokens": 12}
    request_id, events = events_of(server, "/v1/responses", body)
    kinds = [e["type"] for e in events]
    assert kinds.count("response.created") == 1 and kinds[-1] == "response.incomplete", kinds
    assert "error" not in kinds
    # The event numbering goes on without a gap or a repeat, in one message item.
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert kinds.count("response.output_item.added") == 1
    assert kinds.count("response.content_part.added") == 1
    [item_id] = {e["item_id"] for e in events if "item_id" in e}
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text.split() == words(12)
    final = events[-1]["response"]
    assert final["id"] == events[0]["response"]["id"]
    [message] = final["output"]
    assert message["id"] == item_id
    assert message["content"][0]["text"].split() == words(12)
    assert final["usage"]["output_tokens"] == 12

    def recorded() -> tuple[int, int, int, int] | None:
        return records(server.data_dir).get(request_id)

    status, prompt, completion, continued = wait_for(recorded, "the stream's usage record")
    assert (status, completion, continued) == (200, 12, 2)
    assert final["usage"]["input_tokens"] == prompt


def test_a_native_responses_stream_read_by_the_openai_sdk(native_breaking: Server) -> None:
    with openai.OpenAI(base_url=native_breaking.url + "/v1", api_key="x", max_retries=0) as client:
        events = list(
            client.responses.create(model="m1", input="Count.", max_output_tokens=12, stream=True)
        )
    final = events[-1]
    assert final.type == "response.incomplete"
    assert final.response.output_text.split() == words(12)


def test_a_native_stream_with_a_tool_call_ends_with_the_api_s_error_event(
    native_breaking: Server,
) -> None:
    # A half-written tool call is not continued: the stream ends as before, in the
    # API's own error event.
    tool = {"name": "count", "input_schema": {"type": "object", "properties": {}}}
    body = {
        "model": "m1",
        "max_tokens": 12,
        "messages": MESSAGES,
        "tools": [tool],
        "tool_choice": {"type": "tool", "name": "count"},
    }
    request_id, events = events_of(native_breaking, "/v1/messages", body)
    kinds = [e["type"] for e in events]
    assert kinds == ["message_start", "content_block_start", "error"], kinds
    assert events[-1]["error"]["type"] == "api_error"
    assert "failed mid-stream" in events[-1]["error"]["message"]

    def recorded() -> tuple[int, int, int, int] | None:
        return records(native_breaking.data_dir).get(request_id)

    assert wait_for(recorded, "the stream's usage record")[3] == 0
