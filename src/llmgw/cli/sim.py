"""`llmgw sim`: the simulated engine's options, served with uvicorn.

The wiring lives in `llmgw.cli.sim_wiring`, imported only when the command runs.

Not guaranteed: a graceful drain beyond `--shutdown-grace`. On SIGTERM uvicorn
gives open connections that long (1 s by default: stalled streams never finish
on their own) and then closes them.
"""

import math
from pathlib import Path
from typing import Annotated

import typer

from llmgw.cli.logopts import LogFormat, setup_logging


def sim(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            help="Served model name; repeat for several. The first is the default. "
            "[default: sim-model]",
            show_default=False,
        ),
    ] = None,
    load_time: Annotated[
        float, typer.Option(min=0.0, help="Seconds before /health turns 200 (503 before).")
    ] = 0.0,
    sleep_time: Annotated[
        float, typer.Option(min=0.0, help="Seconds POST /sleep takes (vLLM's sleep mode).")
    ] = 0.1,
    wake_time: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Seconds POST /wake_up takes after a level-1 sleep (a level-2 wake adds "
            "--load-time: the weights are reloaded).",
        ),
    ] = 0.3,
    weights_bytes: Annotated[
        int,
        typer.Option(
            min=0,
            help="Simulated weights size: GPU memory while awake, host memory in a level-1 sleep.",
        ),
    ] = 1 << 30,
    prefill_per_token: Annotated[
        float, typer.Option(min=0.0, help="Prefill seconds per prompt token not in the cache.")
    ] = 0.0002,
    itl: Annotated[float, typer.Option(min=0.0, help="Base inter-token latency, seconds.")] = 0.01,
    itl_per_running: Annotated[
        float, typer.Option(min=0.0, help="Extra inter-token seconds per running sequence.")
    ] = 0.0005,
    prefill_interference: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Fraction of other requests' prefill time a decoding sequence's next "
            "token waits (1: the batch stalls for the whole prefill; 0: no stall).",
        ),
    ] = 1.0,
    prefill_slots: Annotated[
        int,
        typer.Option(
            min=0,
            help="Prefills computed at once per replica, the others wait their turn "
            "(1: serial, as on a GPU; 0: no limit).",
        ),
    ] = 0,
    max_running: Annotated[
        int, typer.Option(min=1, help="Sequences running at once; more queue FIFO.")
    ] = 64,
    block_size: Annotated[int, typer.Option(min=1, help="Tokens per prefix-cache block.")] = 16,
    cache_blocks: Annotated[
        int, typer.Option(min=0, help="Prefix-cache capacity in blocks (0: no cache).")
    ] = 4096,
    output_tokens: Annotated[
        int, typer.Option(min=1, help="Completion length when a request sets no max_tokens.")
    ] = 16,
    embedding_dim: Annotated[int, typer.Option(min=1, help="Embedding vector length.")] = 64,
    text: Annotated[
        str,
        typer.Option(
            help="What answers say: 'words' (vocabulary words picked by a hash of the "
            "prompt) or 'sequence' (' w1 w2 ...', continuing from the 'wN' a continued "
            "text ends with: for testing spliced streams)."
        ),
    ] = "words",
    seed: Annotated[int, typer.Option(help="Seed of the generated text and error draws.")] = 0,
    reasoning_parser: Annotated[
        str,
        typer.Option(
            help="Act as vLLM with this reasoning parser (deepseek_r1 or qwen3: a thought "
            "in <think>...</think>), for --reasoning-words [default: none]."
        ),
    ] = "",
    tool_call_parser: Annotated[
        str,
        typer.Option(
            help="Act as vLLM with this tool parser (hermes): with --text sequence, a stream "
            "that offers tools gets a call of its first tool, arguments "
            '{"n": " w1 w2 ..."} [default: none].'
        ),
    ] = "",
    tool_call_words: Annotated[
        int,
        typer.Option(
            min=0,
            help="With --tool-call-parser: each call holds this many words and an answer "
            "makes as many calls as its words fill (parallel calls); 0: one call.",
        ),
    ] = 0,
    reasoning_words: Annotated[
        int,
        typer.Option(
            min=0,
            help="With --text sequence and --reasoning-parser: the words w1..wK are the "
            "thought (streamed as 'reasoning' deltas), the rest the answer.",
        ),
    ] = 0,
    zero_delay: Annotated[
        bool,
        typer.Option(
            "--zero-delay", help="No timing model at all: no sleeps, no queue (benchmarks)."
        ),
    ] = False,
    error_rate: Annotated[
        float,
        typer.Option(
            min=0.0, max=1.0, help="Fraction of inference requests answered with an error."
        ),
    ] = 0.0,
    error_status: Annotated[
        int, typer.Option(min=400, max=599, help="HTTP status of injected errors.")
    ] = 500,
    crash_after: Annotated[
        int | None,
        typer.Option(min=0, help="Exit abruptly when inference request N+1 arrives."),
    ] = None,
    stall_after_tokens: Annotated[
        int | None,
        typer.Option(min=0, help="Generations stop sending after N tokens, connection kept open."),
    ] = None,
    break_after_tokens: Annotated[
        int | None,
        typer.Option(
            min=0, help="Close a generation's connection after N tokens, answer unfinished."
        ),
    ] = None,
    exit_after_tokens: Annotated[
        int | None,
        typer.Option(min=0, help="Exit abruptly once a generation has produced N tokens."),
    ] = None,
    slow_start: Annotated[
        float,
        typer.Option(min=0.0, help="Seconds every inference request waits before answering."),
    ] = 0.0,
    nnodes: Annotated[
        int,
        typer.Option(
            min=1, help="Nodes of a multi-node replica this process is one rank of (1: alone)."
        ),
    ] = 1,
    node_rank: Annotated[
        int, typer.Option(min=0, help="This process's rank; only rank 0 serves HTTP.")
    ] = 0,
    master_addr: Annotated[
        str | None,
        typer.Option(
            help="Rank 0's rendezvous address (it listens there; the others dial); needed "
            "with --nnodes above 1.",
            show_default=False,
        ),
    ] = None,
    master_port: Annotated[
        int, typer.Option(min=0, max=65535, help="Rank 0's rendezvous port.")
    ] = 0,
    native_apis: Annotated[
        str | None,
        typer.Option(
            help="Client APIs to serve natively besides OpenAI's, comma-separated: "
            "'messages' (Anthropic, /v1/messages), 'responses' (OpenAI, /v1/responses); "
            "none by default (those paths are 404, as on llama.cpp's server).",
            show_default=False,
        ),
    ] = None,
    enable_lora: Annotated[
        bool,
        typer.Option(
            "--enable-lora",
            help="Serve vLLM's runtime LoRA API (POST /v1/load_lora_adapter, "
            "/v1/unload_lora_adapter) and requests for the loaded adapters.",
        ),
    ] = False,
    max_loras: Annotated[
        int,
        typer.Option(
            min=1,
            help="Adapters resident at once, as vLLM's --max-loras; a request for another "
            "loaded one waits --lora-load-time while it is swapped in.",
        ),
    ] = 1,
    max_lora_rank: Annotated[
        int, typer.Option(min=1, help="Highest adapter rank a load accepts (vLLM's default).")
    ] = 16,
    lora_load_time: Annotated[
        float, typer.Option(min=0.0, help="Seconds an adapter load or swap-in takes.")
    ] = 0.2,
    shutdown_grace: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Seconds in-flight requests get to finish after SIGTERM (real engines "
            "finish them; 1 s keeps tests with stalled streams quick).",
        ),
    ] = 1.0,
    weights: Annotated[
        str | None,
        typer.Option(
            help="A model directory to serve, as a real engine would (it must hold a "
            "config.json); the sim reads nothing else from it. Unset: no weights.",
            show_default=False,
        ),
    ] = None,
    log_format: LogFormat = "human",
) -> None:
    """Run a simulated OpenAI-compatible engine, or one rank of a multi-node one."""
    setup_logging("warning", log_format)
    import uvicorn
    from prometheus_client import CollectorRegistry

    from llmgw.cli.sim_wiring import build_app, gang_settings, run_follower, run_rank0
    from llmgw.engines.apis import parse_apis
    from llmgw.sim.faults import FaultSettings
    from llmgw.sim.settings import SimSettings

    if weights is not None and not (Path(weights) / "config.json").is_file():
        raise typer.BadParameter(
            f"{weights} is not a model directory (no config.json in it)", param_hint="--weights"
        )
    gang = gang_settings(nnodes, node_rank, master_addr or "", master_port)
    if gang is not None and gang.node_rank > 0:
        run_follower(gang)
        return

    try:
        apis = parse_apis(native_apis or "")
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--native-apis") from None
    if text not in ("words", "sequence"):
        raise typer.BadParameter(
            f"{text!r} is not a text mode: use 'words' or 'sequence'", param_hint="--text"
        )
    if reasoning_parser not in ("", "deepseek_r1", "qwen3"):
        raise typer.BadParameter(
            f"{reasoning_parser!r} is not a reasoning parser the sim acts as: use "
            "'deepseek_r1' or 'qwen3'",
            param_hint="--reasoning-parser",
        )
    if reasoning_words and (not reasoning_parser or text != "sequence"):
        raise typer.BadParameter(
            "a thought needs --reasoning-parser and --text sequence",
            param_hint="--reasoning-words",
        )
    if tool_call_parser not in ("", "hermes"):
        raise typer.BadParameter(
            f"{tool_call_parser!r} is not a tool parser the sim acts as: use 'hermes'",
            param_hint="--tool-call-parser",
        )
    if tool_call_words and not tool_call_parser:
        raise typer.BadParameter(
            "parallel calls need --tool-call-parser", param_hint="--tool-call-words"
        )
    settings = SimSettings(
        tool_call_parser=tool_call_parser,  # type: ignore[arg-type]
        tool_call_words=tool_call_words,
        text="sequence" if text == "sequence" else "words",
        reasoning_parser=reasoning_parser,  # type: ignore[arg-type]
        reasoning_words=reasoning_words,
        native_apis=apis,
        models=tuple(model) if model else ("sim-model",),
        load_time=load_time,
        sleep_time=sleep_time,
        wake_time=wake_time,
        weights_bytes=weights_bytes,
        prefill_per_token=prefill_per_token,
        itl=itl,
        itl_per_running=itl_per_running,
        prefill_interference=prefill_interference,
        prefill_slots=prefill_slots,
        max_running=max_running,
        block_size=block_size,
        cache_blocks=cache_blocks,
        output_tokens=output_tokens,
        embedding_dim=embedding_dim,
        seed=seed,
        zero_delay=zero_delay,
        enable_lora=enable_lora,
        max_loras=max_loras,
        max_lora_rank=max_lora_rank,
        lora_load_time=lora_load_time,
    )
    faults = FaultSettings(
        error_rate=error_rate,
        error_status=error_status,
        crash_after=crash_after,
        stall_after_tokens=stall_after_tokens,
        break_after_tokens=break_after_tokens,
        exit_after_tokens=exit_after_tokens,
        slow_start=slow_start,
    )
    app = build_app(settings, faults=faults, registry=CollectorRegistry(auto_describe=False))
    options = {
        "host": host,
        "port": port,
        "http": "httptools",
        "lifespan": "on",
        "log_level": "warning",
        "access_log": False,
        "timeout_graceful_shutdown": math.ceil(shutdown_grace),
    }
    if log_format.strip().lower() == "json":
        # uvicorn's own log config writes plain text: its records go to the root
        # logger (configured above) instead.
        options["log_config"] = None
    if gang is not None:
        run_rank0(app, gang, uvicorn.Config(app, loop="none", **options))  # type: ignore[arg-type]
        return
    uvicorn.run(app, loop="uvloop", **options)  # type: ignore[arg-type]
