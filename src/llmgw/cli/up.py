"""`llmgw up`: the one-command quickstart on one machine.

Starts the gateway with the SQLite store in the data dir, a local agent (a child
process in a session of its own, its output in `<data-dir>/agent.log`) and a
catalog of models that start on their first request: `sim-small` (the simulated
engine) and, when their GGUF files are given and the engine interpreter has
llama-cpp-python, two real models on llama.cpp: `smollm2-135m-instruct` (alias
`smollm2`), instruction-tuned, for chat, and `gemma-3-270m`, a base model, for
completions. With `--vllm` and `--vllm-model` (`make run ENGINE=vllm`) the chat
model is served by real vLLM instead (its CPU backend, from a safetensors
checkpoint converted from the same GGUF). Before serving it prints the API URL,
a fresh secret for the key named `quickstart` (rotated on every start, so the
previous one stops working) and `curl` commands to try: the first is a chat request.

Every listener is on loopback by default. The agent listener uses mTLS with the
cluster CA, as `llmgw server` does: the first start makes the CA and a one-use
join token (handed to the agent in its environment), and later starts reuse the
agent's certificate in `<data-dir>/agent/tls`. Bad flags, busy ports and an agent that
dies are one `error:` line and exit code 2 (bad input) or 1 (failure).

The agent is stopped (SIGTERM to its process group, SIGKILL after a grace) however
this process ends, and it stops its engines (`--stop-engines-on-exit`). If this
process is SIGKILLed, the kernel kills the agent (PR_SET_PDEATHSIG, Linux only);
its engines keep running and the next `llmgw up` adopts them (its agent state is
in `<data-dir>/agent`).

Not guaranteed: a graceful stop of the engines after a SIGKILL; and that a request
sent before the agent has registered (the `ready:` line) finds a node to start
its model on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmgw.cli.logopts import LogFormat, setup_logging
from llmgw.telemetry.logs import log_format as log_format_of

if TYPE_CHECKING:
    from llmgw.cli.serving import BoundListener
    from llmgw.config import ServerConfig
    from llmgw.control.catalog.reload import ConfigSource

log = logging.getLogger("llmgw.up")

GEMMA = "gemma-3-270m"
CHAT = "smollm2-135m-instruct"
CHAT_ALIAS = "smollm2"
SIM = "sim-small"
KEY_NAME = "quickstart"
KEEP_ALIVE_SECONDS = 600
# Longer than the agent's own shutdown grace for its engines (10 s), so that a
# clean stop is never cut short.
AGENT_STOP_GRACE = 20.0
AGENT_WATCH_INTERVAL = 0.5
# The agent imports gRPC and probes the hardware first: a second or two, more on a
# cold, busy machine.
REGISTER_TIMEOUT = 60.0
READY_POLL_INTERVAL = 0.2
TAIL_LINES = 30
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
GEMMA_PROMPT = "The capital of France is the city of"
CHAT_PROMPT = "What is the capital of France?"
HOW_TO_GET_GEMMA = (
    "`make run` builds the llama.cpp engine and the model and passes them; or give "
    "--model-file FILE.gguf and --engine-python PYTHON (with llama-cpp-python[server])"
)
HOW_TO_GET_CHAT = (
    "`make run` fetches it and passes it; or run `python scripts/fetch_chat_model.py "
    "FILE.gguf` and give --chat-model-file FILE.gguf and --engine-python PYTHON (with "
    "llama-cpp-python[server])"
)

VLLM_CPU_ARGS = (
    "--dtype",
    "float32",
    "--max-model-len",
    "2048",
    "--enable-prefix-caching",
    "--enforce-eager",
)
VLLM_NOTE = (
    f"{CHAT} runs on vLLM: its first request waits while vLLM loads on this machine's "
    "CPUs (about 1 to 2 minutes, 4 GB of memory)."
)


class UpError(Exception):
    """`llmgw up` cannot go on; the message says why and what to do."""

    def __init__(self, message: str, code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code


class _Interrupted(BaseException):
    """SIGTERM or SIGINT before the gateway took over the signals."""


@dataclass(frozen=True, slots=True)
class _Plan:
    """The parsed flags: plain values only."""

    listen: dict[str, Any]
    admin_listen: dict[str, Any]
    agent_listen: dict[str, Any]
    data_dir: Path
    model_file: Path | None
    chat_model_file: Path | None
    notes: tuple[str, ...]  # why a real model is not in the catalog, when it is not
    engine_python: str
    vllm: str | None  # the vllm executable; the chat model runs on it when set
    vllm_model: Path | None  # SmolLM2-135M-Instruct as a checkpoint directory for vLLM
    node_id: str
    port_range: str
    log_level: str
    log_format: str


def up(
    listen: Annotated[
        str,
        typer.Option(
            help="API listener HOST:PORT. Loopback by default, as suits a quickstart; "
            "give 0.0.0.0:8080 to let other machines in (every request needs the key)."
        ),
    ] = "127.0.0.1:8080",
    admin_listen: Annotated[
        str, typer.Option(help="Admin listener HOST:PORT (dashboard, admin API, /metrics).")
    ] = "127.0.0.1:9090",
    agent_listen: Annotated[
        str,
        typer.Option(
            help="gRPC listener the local agent dials, HOST:PORT (mTLS with the cluster CA; "
            "the local agent joins with a token made at start-up)."
        ),
    ] = "127.0.0.1:9443",
    data_dir: Annotated[
        str,
        typer.Option(
            envvar="LLMGW_DATA_DIR",
            help="Directory of the SQLite store, the agent's log and its weights dir.",
        ),
    ] = "~/.local/share/llmgw",
    model_file: Annotated[
        str | None,
        typer.Option(
            envvar="LLMGW_MODEL_FILE",
            help="Gemma 3 270M as a GGUF file, served as gemma-3-270m on llama.cpp. Without "
            "it (or when it is missing) only the simulated model sim-small is served.",
            show_default=False,
        ),
    ] = None,
    chat_model_file: Annotated[
        str | None,
        typer.Option(
            envvar="LLMGW_CHAT_MODEL_FILE",
            help=f"SmolLM2-135M-Instruct as a GGUF file, served as {CHAT} (alias "
            f"{CHAT_ALIAS}) on llama.cpp with the chat template the file carries: the "
            "model that answers chat requests. Without it (or when it is missing) chat "
            "goes to the simulated model only.",
            show_default=False,
        ),
    ] = None,
    engine_python: Annotated[
        str | None,
        typer.Option(
            envvar="LLMGW_ENGINE_PYTHON",
            help="Python interpreter with llama-cpp-python and its server extra "
            "(default: this interpreter).",
            show_default=False,
        ),
    ] = None,
    vllm: Annotated[
        str | None,
        typer.Option(
            envvar="LLMGW_VLLM",
            help=f"The vllm program. With --vllm-model, {CHAT} is served by vLLM (on this "
            "machine's CPUs) instead of llama.cpp.",
            show_default=False,
        ),
    ] = None,
    vllm_model: Annotated[
        str | None,
        typer.Option(
            envvar="LLMGW_VLLM_MODEL",
            help="SmolLM2-135M-Instruct as a Hugging Face checkpoint directory (config.json, "
            "safetensors, tokenizer) for vLLM; `make run ENGINE=vllm` converts it from the GGUF.",
            show_default=False,
        ),
    ] = None,
    node_id: Annotated[str, typer.Option(help="The local agent's node id.")] = "local",
    port_range: Annotated[
        str, typer.Option(help="Ports the local engines may listen on, START-END.")
    ] = "20000-20099",
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    log_format: LogFormat = "human",
) -> None:
    """Start everything on this machine: the gateway, a local agent and the quickstart's models."""
    try:
        plan = _plan(
            listen=listen,
            admin_listen=admin_listen,
            agent_listen=agent_listen,
            data_dir=data_dir,
            model_file=model_file,
            chat_model_file=chat_model_file,
            engine_python=engine_python,
            vllm=vllm,
            vllm_model=vllm_model,
            node_id=node_id,
            port_range=port_range,
            log_level=log_level,
            log_format=log_format,
        )
        setup_logging(plan.log_level, plan.log_format)
        if plan.log_level != "debug":
            # Migration chatter would bury the key and the curls this command prints.
            logging.getLogger("alembic").setLevel(logging.WARNING)
        _run(plan)
    except UpError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=exc.code) from None


def _plan(
    *,
    listen: str,
    admin_listen: str,
    agent_listen: str,
    data_dir: str,
    model_file: str | None,
    chat_model_file: str | None,
    engine_python: str | None,
    node_id: str,
    port_range: str,
    log_level: str,
    vllm: str | None = None,
    vllm_model: str | None = None,
    log_format: str = "human",
) -> _Plan:
    """Check every flag; UpError naming the flag for the first bad one."""
    from llmgw.agent.errors import FlagError
    from llmgw.agent.flags import parse_port_range
    from llmgw.config import ConfigError, parse_listen

    if not isinstance(getattr(logging, log_level.upper(), None), int):
        raise UpError(f"--log-level {log_level!r}: use debug, info, warning or error")
    try:
        chosen_format = log_format_of(log_format, source="--log-format (or LLMGW_LOG_FORMAT)")
    except ValueError as exc:
        raise UpError(str(exc)) from None
    try:
        addresses = [
            parse_listen(flag, value)
            for flag, value in (
                ("--listen", listen),
                ("--admin-listen", admin_listen),
                ("--agent-listen", agent_listen),
            )
        ]
        parse_port_range(port_range)
    except (ConfigError, FlagError) as exc:
        raise UpError(str(exc)) from None
    if addresses[2]["port"] == 0:
        raise UpError(
            f"--agent-listen {agent_listen!r}: give a fixed port; the local agent must know it"
        )
    if not node_id.strip() or any(c.isspace() for c in node_id):
        raise UpError(f"--node-id {node_id!r}: give a non-empty word such as 'local'")
    python = _engine_python(engine_python)
    gguf, note = _model_file(model_file, "--model-file", GEMMA, HOW_TO_GET_GEMMA)
    chat, chat_note = _model_file(chat_model_file, "--chat-model-file", CHAT, HOW_TO_GET_CHAT)
    vllm_program, vllm_dir = _vllm(vllm, vllm_model)
    if vllm_dir is not None:
        chat, chat_note = None, None  # vLLM serves the chat model; llama.cpp does not
    if (gguf is not None or chat is not None) and not _has_llama_cpp(python):
        missing = f"is not served: {python} has no llama-cpp-python."
        if gguf is not None:
            gguf, note = None, f"{GEMMA} {missing} {HOW_TO_GET_GEMMA}"
        if chat is not None:
            chat, chat_note = None, f"{CHAT} {missing} {HOW_TO_GET_CHAT}"
    return _Plan(
        listen=addresses[0],
        admin_listen=addresses[1],
        agent_listen=addresses[2],
        data_dir=_data_dir(data_dir),
        model_file=gguf,
        chat_model_file=chat,
        notes=tuple(
            n
            for n in (
                chat_note,
                note,
                VLLM_NOTE if vllm_dir is not None else None,
            )
            if n is not None
        ),
        engine_python=python,
        vllm=vllm_program,
        vllm_model=vllm_dir,
        node_id=node_id,
        port_range=port_range,
        log_level=log_level.lower(),
        log_format=chosen_format,
    )


def _engine_python(value: str | None) -> str:
    if value is None or not value.strip():
        return sys.executable
    if not (os.path.isfile(value) and os.access(value, os.X_OK)):
        raise UpError(
            f"--engine-python {value!r} is not an executable file (it may come from "
            "LLMGW_ENGINE_PYTHON); give the python of a venv with llama-cpp-python[server]"
        )
    return os.path.abspath(value)


def _model_file(
    value: str | None, flag: str, model: str, how: str
) -> tuple[Path | None, str | None]:
    """The GGUF file to serve as `model`, or None and the line that says why not."""
    if value is None or not value.strip():
        return None, f"{model} is not served: no {flag} given. To add it: {how}"
    path = Path(value).expanduser().absolute()
    if not path.is_file():
        return None, f"{model} is not served: {flag} {value} does not exist. {how}"
    if path.suffix.lower() != ".gguf":
        raise UpError(f"{flag} {value!r}: llama.cpp loads a .gguf file; give the {model} GGUF")
    return path, None


def _vllm(program: str | None, model: str | None) -> tuple[str | None, Path | None]:
    """The vllm program and the chat model's checkpoint directory, both or neither."""
    program = program.strip() if program else None
    model = model.strip() if model else None
    if program is None and model is None:
        return None, None
    if program is None or model is None:
        given, missing = ("--vllm", "--vllm-model") if program else ("--vllm-model", "--vllm")
        raise UpError(
            f"{given} is given but {missing} is not: serving the chat model on vLLM needs "
            "both (`make run ENGINE=vllm` builds and passes them)"
        )
    found = shutil.which(program)
    if found is None:
        raise UpError(
            f"--vllm {program!r} is not an executable program (it may come from LLMGW_VLLM); "
            "give the vllm of a venv with vLLM installed"
        )
    directory = Path(model).expanduser().absolute()
    if not (directory / "config.json").is_file():
        raise UpError(
            f"--vllm-model {model!r} is not a model checkpoint directory (no config.json; it "
            "may come from LLMGW_VLLM_MODEL); convert one with scripts/convert_vllm_model.py"
        )
    return os.path.abspath(found), directory


def _has_llama_cpp(python: str) -> bool:
    check = "import importlib.util, sys; sys.exit(importlib.util.find_spec('llama_cpp') is None)"
    try:
        found = subprocess.run(
            [python, "-c", check], check=False, capture_output=True, timeout=30
        ).returncode
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UpError(f"--engine-python {python!r} cannot be run: {exc}") from None
    return found == 0


def _data_dir(value: str) -> Path:
    path = Path(value).expanduser().absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UpError(f"--data-dir {value!r}: cannot create it: {exc.strerror or exc}") from None
    return path


def _catalog(plan: _Plan) -> list[dict[str, Any]]:
    """The models `up` serves; each starts on its first request and stops when idle."""
    models: list[dict[str, Any]] = []
    if plan.vllm_model is not None:
        models.append(_vllm_model(CHAT, plan.vllm_model, aliases=[CHAT_ALIAS]))
    elif plan.chat_model_file is not None:
        # No --chat_format: llama-cpp-python applies the chat template the GGUF carries.
        models.append(_llamacpp_model(CHAT, plan.chat_model_file, aliases=[CHAT_ALIAS]))
    if plan.model_file is not None:
        models.append(_llamacpp_model(GEMMA, plan.model_file, aliases=[]))
    models.append(
        {
            "name": SIM,
            "weights": "simulated",  # the sim engine loads nothing
            "profiles": [{"name": "sim", "engine": "sim", "gpus": 0}],
            "min_replicas": 0,
            "keep_alive": KEEP_ALIVE_SECONDS,
            "activation": True,
        }
    )
    return models


def _llamacpp_model(name: str, gguf: Path, *, aliases: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "aliases": aliases,
        "weights": str(gguf),
        # llmgw sets --model, --model_alias, --host, --port, --interrupt_requests.
        "profiles": [
            {
                "name": "cpu",
                "engine": "llamacpp",
                "engine_args": ["--n_ctx", "2048"],
                "gpus": 0,
            }
        ],
        "min_replicas": 0,
        "keep_alive": KEEP_ALIVE_SECONDS,
        "activation": True,
    }


def _vllm_model(name: str, checkpoint: Path, *, aliases: list[str]) -> dict[str, Any]:
    """The model on vLLM's CPU backend: no GPUs, float32 (the CPU kernels' safe choice
    for this checkpoint), 1 GiB of KV cache, and no graph capture (it would add minutes
    to every start on a CPU)."""
    return {
        "name": name,
        "aliases": aliases,
        "weights": str(checkpoint),
        # llmgw sets the model, --served-model-name, --host, --port and the parallel sizes.
        "profiles": [
            {
                "name": "cpu",
                "engine": "vllm",
                "gpus": 0,
                "engine_args": [*VLLM_CPU_ARGS],
                "env": {
                    "VLLM_CPU_KVCACHE_SPACE": "1",
                    "VLLM_CPU_OMP_THREADS_BIND": "auto",
                    "HF_HUB_OFFLINE": "1",
                },
            }
        ],
        "min_replicas": 0,
        "keep_alive": KEEP_ALIVE_SECONDS,
        "activation": True,
    }


def _config(plan: _Plan) -> ServerConfig:
    from pydantic import ValidationError

    from llmgw.config import ServerConfig
    from llmgw.config.loading import describe_validation_error

    data = {
        "listen": plan.listen,
        "admin_listen": plan.admin_listen,
        "agent_listen": plan.agent_listen,
        "data_dir": str(plan.data_dir),
        "models": _catalog(plan),
    }
    try:
        return ServerConfig.model_validate(data)
    except ValidationError as exc:
        raise UpError(describe_validation_error("llmgw up", exc)) from None


def _reload_source(plan: _Plan) -> ConfigSource:
    """What `llmgw models reload` (or SIGHUP) reads again: the catalog `up` builds."""
    from llmgw.config import ConfigError
    from llmgw.control.catalog.reload import ConfigSource

    def read() -> ServerConfig:
        try:
            return _config(plan)
        except UpError as exc:
            raise ConfigError(str(exc)) from exc

    return ConfigSource("llmgw up's catalog", read)


def _run(plan: _Plan) -> None:
    cfg = _config(plan)
    listeners = _bind(cfg)
    from llmgw.cli.gateway import StartupError, run_gateway

    secret, rotated = _key(plan.data_dir)
    token = _join_token(cfg, plan)
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    agent = LocalAgent(
        argv=_agent_argv(plan),
        log_path=plan.data_dir / "agent.log",
        # In the environment, not the argv: other users can read a process's arguments.
        env={} if token is None else {"LLMGW_JOIN_TOKEN": token},
    )
    try:
        agent.start()
        typer.echo(_banner(plan, listeners, secret, rotated, agent.log_path))
        admin_url = listeners[1].url(plan.admin_listen["host"])
        threading.Thread(
            target=_announce_ready,
            kwargs={"admin_url": admin_url, "node_id": plan.node_id, "agent": agent},
            name="ready-notice",
            daemon=True,
        ).start()
        run_gateway(cfg, listeners, reload_source=_reload_source(plan))
    except _Interrupted as exc:
        log.info("%s before the gateway started; stopping", exc)
    except StartupError as exc:
        raise UpError(str(exc), EXIT_FAILED) from None
    finally:
        # A second Ctrl-C must not cut the agent's stop short and orphan its engines.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        agent.stop()
        for listener in listeners:
            listener.sock.close()
    if agent.died is not None:
        raise UpError(agent.died, EXIT_FAILED)


def _announce_ready(*, admin_url: str, node_id: str, agent: LocalAgent) -> None:
    """Print one line once the local agent has registered: from then on, requests work.

    A request that comes earlier finds no node to start its model on.
    """
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + REGISTER_TIMEOUT
    while not agent.stopping:
        try:
            # urllib, not httpx: httpx logs every request at INFO.
            with urllib.request.urlopen(f"{admin_url}/admin/api/nodes", timeout=2.0) as resp:
                nodes = json.loads(resp.read())["nodes"]
        except (OSError, urllib.error.URLError, ValueError, KeyError, TypeError):
            nodes = []  # not serving yet: the listener is bound, the app not started
        # Until this server leads, it shows the nodes as the last leader wrote them
        # (marked `leader_view_at`): on a restart that is the previous run's agent.
        if any(
            n.get("id") == node_id and n.get("state") == "ready" and "leader_view_at" not in n
            for n in nodes
        ):
            typer.echo(
                f"ready: the local agent registered as node {node_id!r}; try the curls above"
            )
            return
        if time.monotonic() > deadline:
            log.warning(
                "the local agent has not registered within %.0f s; its log: %s",
                REGISTER_TIMEOUT,
                agent.log_path,
            )
            return
        time.sleep(READY_POLL_INTERVAL)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise _Interrupted(signal.Signals(signum).name)


def _bind(cfg: ServerConfig) -> list[BoundListener]:
    """Bind the HTTP listeners, and check the agent's port is free before anything starts."""
    from llmgw.cli.serving import ListenError, bind

    listeners: list[BoundListener] = []
    try:
        listeners.append(bind("API", "--listen", cfg.listen))
        listeners.append(bind("admin", "--admin-listen", cfg.admin_listen))
        assert cfg.agent_listen is not None
        # The gateway binds it itself; this only turns "in use" into a clear error now.
        bind("agent", "--agent-listen", cfg.agent_listen).sock.close()
    except ListenError as exc:
        for listener in listeners:
            listener.sock.close()
        raise UpError(str(exc)) from None
    return listeners


def _key(data_dir: Path) -> tuple[str, bool]:
    """A fresh secret for the key named `quickstart`, and whether it was rotated."""
    import asyncio

    from llmgw.store import StoreError, store_url

    try:
        return asyncio.run(_quickstart_key(store_url(data_dir, None)))
    except StoreError as exc:
        raise UpError(f"cannot make the API key in {data_dir}: {exc}", EXIT_FAILED) from None


async def _quickstart_key(url: str) -> tuple[str, bool]:
    from llmgw.auth import KeyService
    from llmgw.store import open_store, utc_now

    store = await open_store(url)
    try:
        await store.upgrade()
        service = KeyService(keys=store.keys, wall_clock=utc_now)
        now = utc_now()
        for key in await service.list():
            if key.name != KEY_NAME:
                continue
            if key.expires_at is None or key.expires_at > now:
                _, secret = await service.rotate(key.id)
                return secret, True
            await service.revoke(key.id)  # expired: a rotated secret would not work
        _, secret = await service.create(name=KEY_NAME)
        return secret, False
    finally:
        await store.close()


def _join_token(cfg: ServerConfig, plan: _Plan) -> str | None:
    """A one-use join token for the local agent (None once it has its certificate)."""
    import asyncio

    from llmgw.cli.cluster_wiring import ClusterSetupError, local_join_token
    from llmgw.store import StoreError, open_store, store_url

    async def make() -> str | None:
        store = await open_store(store_url(plan.data_dir, None))
        try:
            return await local_join_token(
                cfg, store, data_dir=str(plan.data_dir), state_dir=plan.data_dir / "agent"
            )
        finally:
            await store.close()

    try:
        return asyncio.run(make())
    except (ClusterSetupError, StoreError) as exc:
        raise UpError(
            f"cannot set up the cluster CA in {plan.data_dir}: {exc}", EXIT_FAILED
        ) from None


def _agent_argv(plan: _Plan) -> list[str]:
    host, port = plan.agent_listen["host"], plan.agent_listen["port"]
    server = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if host in ("0.0.0.0", "::", ""):
        server = f"127.0.0.1:{port}"
    return [
        sys.executable, "-m", "llmgw", "agent",
        "--server", server,
        "--node-id", plan.node_id,
        "--port-range", plan.port_range,
        "--weights-dir", str(plan.data_dir / "weights"),
        "--engine-python", plan.engine_python,
        *(["--engine", f"vllm={plan.vllm}"] if plan.vllm is not None else []),
        "--state-dir", str(plan.data_dir / "agent"),
        # Ctrl-C on `llmgw up` stops everything it started, engines included.
        "--stop-engines-on-exit",
        "--log-level", plan.log_level,
        "--log-format", plan.log_format,
    ]  # fmt: skip


class LocalAgent:
    """The `llmgw agent` child: its own session, output to a log file, watched while it runs.

    If it exits while it should be running, the watcher records why (with the tail
    of its log) and sends this process SIGTERM, which stops the gateway.
    """

    def __init__(
        self, *, argv: list[str], log_path: Path, env: dict[str, str] | None = None
    ) -> None:
        self.argv = argv
        self.log_path = log_path
        self.env = env or {}
        self.died: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()

    def start(self) -> None:
        # Armed with PR_SET_PDEATHSIG in a fresh interpreter before exec (see the agent's
        # _deathsig_exec.py: preexec_fn is unsafe once threads exist), so a SIGKILLed
        # `llmgw up` takes its agent with it; its engines keep running, and the next
        # `llmgw up` adopts them (or stops those its catalog does not want).
        import llmgw.agent

        deathsig_exec = str(Path(llmgw.agent.__file__).with_name("_deathsig_exec.py"))
        argv = [sys.executable, "-I", "-S", deathsig_exec, str(os.getpid()), "--", *self.argv]
        try:
            with self.log_path.open("wb") as log_file:
                self._proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env={**os.environ, **self.env},
                )
        except OSError as exc:
            raise UpError(f"cannot start the local agent: {exc}", EXIT_FAILED) from None
        log.info("local agent started (pid %d), its log: %s", self._proc.pid, self.log_path)
        threading.Thread(target=self._watch, name="agent-watcher", daemon=True).start()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _watch(self) -> None:
        proc = self._proc
        assert proc is not None
        while not self._stopping.wait(AGENT_WATCH_INTERVAL):
            status = proc.poll()
            if status is None:
                continue
            if self._stopping.is_set():
                return
            how = (
                f"was killed by {_signal_name(-status)}"
                if status < 0
                else f"exited with status {status}"
            )
            self.died = (
                f"the local agent {how}; nothing can run models without it. "
                f"Command: {shlex.join(self.argv)}\n"
                f"Last lines of its log ({self.log_path}):\n{self.tail()}"
            )
            log.error("the local agent %s; stopping", how)
            os.kill(os.getpid(), signal.SIGTERM)
            return

    def tail(self) -> str:
        """The last lines of its log, indented so they read as part of one message."""
        try:
            with self.log_path.open(errors="replace") as f:
                lines = deque(f, maxlen=TAIL_LINES)
        except OSError as exc:
            return f"  (cannot read it: {exc.strerror})"
        return "\n".join(f"  {line.rstrip()}" for line in lines) or "  (empty)"

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after the grace; also if it already exited."""
        self._stopping.set()
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            log.info("stopping the local agent (pid %d)", proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=AGENT_STOP_GRACE)
        except subprocess.TimeoutExpired:
            log.warning("the local agent did not stop within %.0f s; killing it", AGENT_STOP_GRACE)
        # Whatever is left in its group goes too (start_new_session made it the leader).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _llmgw_command() -> str:
    """How the user runs this llmgw: `llmgw` when it is on PATH, else the venv's script."""
    script = Path(sys.executable).parent / "llmgw"
    found = shutil.which("llmgw")
    if found is not None and script.exists() and Path(found).resolve() == script.resolve():
        return "llmgw"
    if script.exists():
        with contextlib.suppress(ValueError):
            return str(script.relative_to(Path.cwd()))
        return str(script)
    return f"{sys.executable} -m llmgw"


def _banner(
    plan: _Plan, listeners: list[BoundListener], secret: str, rotated: bool, agent_log: Path
) -> str:
    """What `up` prints once the listeners are bound: URL, key, curls and hints."""
    api, admin = listeners[0], listeners[1]
    base = api.url(plan.listen["host"])
    admin_url = admin.url(plan.admin_listen["host"])
    header = f"-H 'Content-Type: application/json' -H 'Authorization: Bearer {secret}'"
    serves_chat = plan.chat_model_file is not None or plan.vllm_model is not None
    on_vllm = ", on vLLM" if plan.vllm_model is not None else ""
    if serves_chat:
        chat_body: dict[str, Any] = {
            "model": CHAT_ALIAS,
            "messages": [{"role": "user", "content": CHAT_PROMPT}],
            "temperature": 0,
        }
    else:
        chat_body = {"model": SIM, "messages": [{"role": "user", "content": "Hello!"}]}
    gemma_body = {"model": GEMMA, "prompt": GEMMA_PROMPT, "max_tokens": 16, "temperature": 0}
    models = [
        *([f"{CHAT} (alias {CHAT_ALIAS}{on_vllm})"] if serves_chat else []),
        *([GEMMA] if plan.model_file is not None else []),
        SIM,
    ]
    fresh = "rotated: a new secret on every start" if rotated else "created"
    cli = _llmgw_command()
    admin_flag = "" if admin_url == "http://127.0.0.1:9090" else f" --admin {admin_url}"
    lines = [
        "",
        f"llmgw is up: {base}  (admin and dashboard: {admin_url})",
        "",
        f"API key ('{KEY_NAME}', {fresh}; the previous one stops working):",
        f"  {secret}",
        "",
        f"Models: {', '.join(models)}. Each starts on its first request (that request waits "
        f"while it loads) and stops after {KEEP_ALIVE_SECONDS // 60} minutes idle.",
    ]
    lines += plan.notes
    lines += [
        "",
        "Try:",
        f"  curl -s {base}/v1/chat/completions {header} \\",
        f"    -d '{json.dumps(chat_body)}'",
        "",
    ]
    if plan.model_file is not None:
        lines += [
            f"  curl -s {base}/v1/completions {header} \\",
            f"    -d '{json.dumps(gemma_body)}'",
            "",
        ]
    lines += [
        f"See what runs: {cli} models list{admin_flag}",
        f"               {cli} nodes list{admin_flag}",
        f"Data: {plan.data_dir}   agent log: {agent_log}",
        "Press Ctrl-C to stop (the agent and its engines stop too).",
        "",
    ]
    return "\n".join(lines)
