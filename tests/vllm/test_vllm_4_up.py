"""`make run ENGINE=vllm`: `llmgw up --vllm --vllm-model` answers the README's chat curl
from real vLLM, started by that request through the local agent.

`llmgw up` and the curl run in the background from the start of the session, after
the shared fleet's vLLM has loaded (see `tests/vllm_fleet.py`); this test checks what
they printed and answered, and that `up` stops cleanly.
"""

from __future__ import annotations

import pytest
from upproc import stop_and_check_clean
from vllm_fleet import UpAnswered

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def test_up_serves_the_chat_model_on_vllm_for_the_readmes_curl(vllm_up: UpAnswered) -> None:
    up, out, answer = vllm_up.up, vllm_up.printed, vllm_up.answer
    assert "smollm2-135m-instruct (alias smollm2, on vLLM)" in out, out
    assert "runs on vLLM: its first request waits" in out, out
    # The README's chat curl, as printed.
    assert answer.status_code == 200, f"{answer.text}\n{up.proc.output()}"
    choice = answer.json()["choices"][0]
    assert choice["message"]["content"] == "The capital of France is Paris.", choice
    assert choice["finish_reason"] == "stop"
    assert answer.json()["system_fingerprint"].startswith("vllm-"), answer.json()
    stop_and_check_clean(up)
