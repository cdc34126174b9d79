"""End to end: the quickstart's first curl, a chat request, answered by a real model.

`llmgw up` (as `make run` starts it) serves SmolLM2-135M-Instruct as
`smollm2-135m-instruct` (alias `smollm2`) on the real llama.cpp engine, which
applies the chat template the GGUF carries. The test sends the body of the first
curl `up` prints, as printed, and reads the answer.

Checked before writing the asserts (llama-cpp-python 0.3.36, temperature 0, five
runs in a row): "What is the capital of France?" is answered with the same 29
tokens every time, "L'Étoile, la Marseillaise. Paris is the capital of France
and a major city in Europe's capital of France.", finish_reason "stop". So the
test asserts non-empty content that names Paris and a natural stop, not the
exact words.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from upproc import Up, running_up

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]

FIRST_CURL = re.compile(r"^  curl -s (\S+) .*\\\n    -d '(.*)'$", re.MULTILINE)
# The first request waits while the agent starts the engine and it loads the model.
FIRST_REQUEST_TIMEOUT = 180.0
READY_TIMEOUT = 120.0


def required_file(name: str) -> str:
    raw = os.environ.get(name)
    if not raw or not Path(raw).is_file():
        pytest.fail(
            f"{name}={raw!r} is not set or is no file: this test needs the real llama.cpp "
            f"engine and SmolLM2-135M-Instruct. Run `make test`, which builds both and sets "
            f"{name}.",
            pytrace=False,
        )
    return raw


@pytest.fixture
def quickstart(tmp_path: Path) -> Iterator[Up]:
    """`llmgw up` with the chat model and the real engine, its local agent registered."""
    python = required_file("LLMGW_ENGINE_PYTHON")
    chat_model = required_file("LLMGW_CHAT_MODEL_FILE")
    with running_up(
        tmp_path,
        "--engine-python", python,
        "--chat-model-file", chat_model,
        # Gemma is not needed here: only the chat model is loaded.
        env={"LLMGW_MODEL_FILE": ""},
        ready_timeout=READY_TIMEOUT,
    ) as up:  # fmt: skip
        yield up


def first_curl(output: str) -> tuple[str, dict[str, Any]]:
    """The URL and JSON body of the first curl `up` printed."""
    match = FIRST_CURL.search(output)
    assert match, f"no curl printed:\n{output}"
    body: dict[str, Any] = json.loads(match.group(2))
    return match.group(1), body


def test_the_quickstarts_first_curl_is_a_chat_that_a_real_model_answers(
    quickstart: Up,
) -> None:
    out = quickstart.proc.output()
    assert "smollm2-135m-instruct (alias smollm2)" in out, out
    assert "smollm2-135m-instruct is not served" not in out, out
    url, body = first_curl(out)
    assert url == f"{quickstart.url}/v1/chat/completions", out
    assert body["model"] == "smollm2", body
    assert body["temperature"] == 0, body
    assert body["messages"] == [{"role": "user", "content": "What is the capital of France?"}]

    headers = {"Authorization": f"Bearer {quickstart.key}"}
    resp = httpx.post(url, json=body, headers=headers, timeout=FIRST_REQUEST_TIMEOUT)
    assert resp.status_code == 200, f"{resp.text}\n{quickstart.proc.output()}"
    data = resp.json()
    choice = data["choices"][0]
    content = choice["message"]["content"]
    assert content.strip(), data
    assert "Paris" in content, data
    assert choice["finish_reason"] == "stop", data
    assert data["usage"]["completion_tokens"] > 0, data
    assert resp.headers.get("x-llmgw-replica"), dict(resp.headers)

    # The same chat streamed: the engine's chat template applies to streams too.
    pieces: list[str] = []
    finish: list[str] = []
    with httpx.stream(
        "POST", url, json={**body, "stream": True}, headers=headers, timeout=60
    ) as stream:
        assert stream.status_code == 200, stream.read().decode(errors="replace")
        for line in stream.iter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            for event_choice in json.loads(line.removeprefix("data:"))["choices"]:
                pieces.append(event_choice["delta"].get("content") or "")
                if event_choice.get("finish_reason"):
                    finish.append(event_choice["finish_reason"])
    streamed = "".join(pieces)
    assert "Paris" in streamed, streamed
    assert finish == ["stop"], finish
