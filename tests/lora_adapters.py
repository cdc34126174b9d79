"""LoRA adapters made here for tests, never downloaded.

`make_peft_adapter` runs `peft` in the vLLM venv to write a real adapter for a
checkpoint: randomly initialised, rank 8 on the attention's q_proj and v_proj, which
vLLM started with `--max-lora-rank 8` accepts. `sim_adapter` writes only the
`adapter_config.json` that `llmgw sim` reads (its rank decides whether a load is
refused), for tests without vLLM.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

MAKE_ADAPTER = """
import sys
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM
base = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(sys.argv[1]))
config = LoraConfig(r=int(sys.argv[3]), lora_alpha=16, target_modules=["q_proj", "v_proj"],
                    init_lora_weights=False)
get_peft_model(base, config).save_pretrained(sys.argv[2])
"""


def make_peft_adapter(python: Path, checkpoint: Path, dest: Path, *, rank: int = 8) -> Path:
    """A peft LoRA adapter for `checkpoint` written to `dest` by the venv's `python`."""
    made = subprocess.run(
        [str(python), "-c", MAKE_ADAPTER, str(checkpoint), str(dest), str(rank)],
        capture_output=True, text=True, timeout=300, check=False,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    return dest


def sim_adapter(root: Path, name: str, *, rank: int = 8) -> Path:
    """A directory `root/name` holding the adapter_config.json of a rank-`rank` adapter."""
    path = root / name
    path.mkdir(parents=True)
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 16,
        "target_modules": ["q_proj", "v_proj"],
    }
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path
