"""A base model whose profile has `adapters`, end to end: a real `llmgw server` and
agent start the sim with its LoRA flags, and the running engine loads adapters made
here through vLLM's runtime API, within the profile's slots and rank limit.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from lora_adapters import sim_adapter
from test_control_plane import fleet, wait_for

MODELS = (
    "  - name: base\n    weights: none\n    min_replicas: 1\n"
    "    profiles: [{name: sim, engine: sim, gpus: 1,\n"
    "                adapters: {max_loaded: 2, max_rank: 8}}]\n"
)


def test_the_profiles_adapter_slots_reach_the_running_engine(tmp_path: Path) -> None:
    with fleet(tmp_path, MODELS, nodes=1) as f:
        [replica] = wait_for(lambda: f.ready_replicas("base"), "base's replica")
        assert replica["engine_args"] == [
            "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
        ]  # fmt: skip
        engine = str(replica["endpoint_url"])
        tone = sim_adapter(tmp_path / "adapters", "tone", rank=8)
        loaded = httpx.post(
            engine + "/v1/load_lora_adapter",
            json={"lora_name": "tone", "lora_path": str(tone)},
            timeout=30,
        )
        assert loaded.status_code == 200, loaded.text
        models = httpx.get(engine + "/v1/models", timeout=30).json()["data"]
        assert {"id": "tone", "parent": "base"}.items() <= models[-1].items()
        # The rank limit is the profile's: an adapter of rank 16 is refused in vLLM's words.
        wide = sim_adapter(tmp_path / "adapters", "wide", rank=16)
        refused = httpx.post(
            engine + "/v1/load_lora_adapter",
            json={"lora_name": "wide", "lora_path": str(wide)},
            timeout=30,
        )
        assert refused.status_code == 500
        assert (
            "'LoRA rank 16 is greater than max_lora_rank 8.'" in refused.json()["error"]["message"]
        )
        answer = httpx.post(
            engine + "/v1/completions",
            json={"model": "tone", "prompt": "Hello", "max_tokens": 3},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == "tone"
        stats = httpx.get(engine + "/sim/stats", timeout=30).json()["lora"]
        assert stats["max_loras"] == 2
