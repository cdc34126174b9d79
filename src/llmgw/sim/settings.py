"""Settings of one `llmgw sim` process, as given on its command line.

Not guaranteed: that the timings resemble any particular GPU; the defaults are picked
so a short request takes tens of milliseconds and a batch visibly slows decoding.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SimSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    models: tuple[str, ...] = Field(
        default=("sim-model",),
        min_length=1,
        description="Served model names; the first answers requests that name no model.",
    )
    load_time: float = Field(
        default=0.0,
        ge=0.0,
        description="Seconds before /health turns 200, to exercise a gateway's wait for "
        "loading replicas. 0: ready at once.",
    )
    sleep_time: float = Field(
        default=0.1,
        ge=0.0,
        description="Seconds `POST /sleep` takes (vLLM offloads a small model's weights in "
        "well under a second).",
    )
    wake_time: float = Field(
        default=0.3,
        ge=0.0,
        description="Seconds `POST /wake_up` takes after a level-1 sleep (vLLM's published "
        "wakes take 0.3-3 s; a level-2 wake also takes `load_time`, to reload the weights).",
    )
    weights_bytes: int = Field(
        default=1 << 30,
        ge=0,
        description="Size of the simulated weights (1 GiB): on the GPU while awake, in host "
        "RAM during a level-1 sleep, nowhere during a level-2 sleep (`/sim/stats`).",
    )
    prefill_per_token: float = Field(
        default=0.0002,
        ge=0.0,
        description="Seconds of prefill per prompt token not in the prefix cache "
        "(0.2 ms: a 1,000-token prompt costs 0.2 s, enough to see cache hits pay off).",
    )
    itl: float = Field(
        default=0.01,
        ge=0.0,
        description="Base inter-token latency in seconds (10 ms: 100 tokens/s alone).",
    )
    itl_per_running: float = Field(
        default=0.0005,
        ge=0.0,
        description="Extra inter-token seconds per running sequence, so a full batch of "
        "64 decodes at about a quarter of the single-sequence speed.",
    )
    prefill_interference: float = Field(
        default=1.0,
        ge=0.0,
        description="How much other requests' prefill delays a decoding sequence's next "
        "token, as a fraction of the prefill time (1: the batch waits for the whole "
        "prefill, as on a GPU without chunked prefill; 0: prefill is free for others).",
    )
    prefill_slots: int = Field(
        default=0,
        ge=0,
        description="Prefills computed at once; the others wait their turn (1: one at a "
        "time, as a compute-bound GPU prefill does). 0 by default: prefills overlap "
        "freely, which keeps short tests independent of each other's prompts.",
    )
    max_running: int = Field(
        default=64,
        ge=1,
        description="Sequences decoded at once; later requests queue FIFO (vLLM's max_num_seqs "
        "is larger, but 64 makes queueing easy to reach in tests).",
    )
    block_size: int = Field(default=16, ge=1, description="Tokens per KV block (vLLM's default).")
    cache_blocks: int = Field(
        default=4096,
        ge=0,
        description="Prefix-cache capacity in blocks (64k tokens at 16 per block); 0 disables it.",
    )
    output_tokens: int = Field(
        default=16,
        ge=1,
        description="Completion length when a request sets no max_tokens: short, so tests "
        "and benchmarks are quick.",
    )
    text: Literal["words", "sequence"] = Field(
        default="words",
        description="What answers say: `words` picks vocabulary words by a hash of the "
        "prompt (the default: realistic-looking text); `sequence` counts ` w1 w2 ...`, "
        "continuing from the `wN` that a continued text ends with, so that a test can "
        "check a stream spliced from several answers for gaps and repeats.",
    )
    reasoning_parser: Literal["", "deepseek_r1", "qwen3"] = Field(
        default="",
        description="The reasoning parser the sim acts as, by vLLM's name (those that write "
        "a thought as `<think>...</think>`); none by default, so answers carry no thought.",
    )
    tool_call_parser: Literal["", "hermes"] = Field(
        default="",
        description="The tool parser the sim acts as, by vLLM's name (`hermes`: calls written "
        "as `<tool_call>{json}</tool_call>`); none by default, so answers call no tool.",
    )
    tool_call_words: int = Field(
        default=0,
        ge=0,
        description="With a tool parser: each call holds this many words of the sequence "
        "and an answer makes as many calls as its words fill (parallel calls, index 0, 1, "
        "...); 0 (the default): one call holding every word, as most answers have.",
    )
    reasoning_words: int = Field(
        default=0,
        ge=0,
        description="With `text: sequence` and a reasoning parser: the words `w1`..`wK` are "
        "the thought, streamed as `reasoning` deltas as vLLM does, the rest the answer; 0 "
        "(the default): no thought.",
    )
    embedding_dim: int = Field(default=64, ge=1, description="Length of embedding vectors.")
    seed: int = Field(default=0, description="Seeds the generated text and the error draws.")
    native_apis: frozenset[str] = Field(
        default=frozenset(),
        description="Client APIs served natively besides OpenAI's (`messages`: Anthropic "
        "Messages at /v1/messages; `responses`: OpenAI Responses at /v1/responses), as vLLM "
        "does; none by default, like llama.cpp, so a gateway's translation is tested too.",
    )
    enable_lora: bool = Field(
        default=False,
        description="Serve vLLM's runtime LoRA API (/v1/load_lora_adapter, "
        "/v1/unload_lora_adapter) and requests for loaded adapters; off by default, like "
        "vLLM without --enable-lora, where those paths are 404.",
    )
    max_loras: int = Field(
        default=1,
        ge=1,
        description="Adapters resident at once (vLLM's --max-loras, whose default is 1); a "
        "request for a registered adapter that is not resident waits for a swap.",
    )
    max_lora_rank: int = Field(
        default=16,
        ge=1,
        description="Highest adapter rank accepted (vLLM's --max-lora-rank default, 16).",
    )
    lora_load_time: float = Field(
        default=0.2,
        ge=0.0,
        description="Seconds a load or a swap-in of an adapter takes (200 ms: small "
        "adapters load in a fraction of a second on a GPU; long enough to see in a benchmark).",
    )
    zero_delay: bool = Field(
        default=False,
        description="No timing model at all (no sleeps, no queue) for router overhead "
        "benchmarks; injected faults still apply.",
    )
