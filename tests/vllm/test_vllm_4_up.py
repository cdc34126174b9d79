"""`make run ENGINE=vllm`: `llmgw up --vllm --vllm-model` answers the README's chat curl
from real vLLM, started by that request through the local agent.

It runs after the shared fleet's vLLM has stopped (modules run in number order), so
only one vLLM runs at a time.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from upproc import running_up, stop_and_check_clean
from vllm_fleet import required

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


def test_up_serves_the_chat_model_on_vllm_for_the_readmes_curl(tmp_path: Path) -> None:
    vllm = required("LLMGW_TEST_VLLM", "real vLLM")
    checkpoint = required("LLMGW_TEST_VLLM_MODEL", "SmolLM2-135M-Instruct converted for vLLM")
    with running_up(tmp_path, "--vllm", str(vllm), "--vllm-model", str(checkpoint)) as up:
        out = up.proc.output()
        assert "smollm2-135m-instruct (alias smollm2, on vLLM)" in out, out
        assert "runs on vLLM: its first request waits" in out, out
        # The README's chat curl, as printed.
        answer = httpx.post(
            f"{up.url}/v1/chat/completions",
            json={"model": "smollm2", "temperature": 0,
                  "messages": [{"role": "user", "content": "What is the capital of France?"}]},
            headers=up.auth(),
            timeout=400,
        )  # fmt: skip
        assert answer.status_code == 200, f"{answer.text}\n{up.proc.output()}"
        choice = answer.json()["choices"][0]
        assert choice["message"]["content"] == "The capital of France is Paris.", choice
        assert choice["finish_reason"] == "stop"
        assert answer.json()["system_fingerprint"].startswith("vllm-"), answer.json()
        stop_and_check_clean(up)
