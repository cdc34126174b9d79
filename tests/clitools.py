"""Running the real `llmgw` CLI from tests, as an operator would, the Redis they share, and
a sim behind key-checking routers with keys the CLI made."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from procs import Server, Sim, llmgw

REDIS_URL = "redis://127.0.0.1:6379/0"


def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run `llmgw ARGS` without the test run's LLMGW_* settings; its result, whatever it is."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    return subprocess.run(
        llmgw(*args), input=stdin, capture_output=True, text=True, timeout=60, check=False, env=env
    )


def made(*args: str, stdin: str = "") -> str:
    """Run `llmgw ARGS`, which must succeed; its standard output."""
    result = cli(*args, stdin=stdin)
    assert result.returncode == 0, result.stderr
    return result.stdout


@dataclass
class KeyedSim:
    """One `llmgw sim` model behind routers that check keys; the keys made with the CLI."""

    store: list[str]  # the CLI's store flags: `--data-dir D` or `--store URL`
    model: str
    sim: Sim
    secrets: dict[str, str]  # key name → secret
    ids: dict[str, str]  # key name → key id (and any other names the test records)
    tmp: Path

    def router(self, *, redis: bool = True) -> Server:
        """A router on the shared store; its limits in Redis unless `redis` is False."""
        args = ["--endpoint", f"s={self.sim.url}={self.model}", *self.store]
        if redis:
            config = self.tmp / f"router-{secrets.token_hex(4)}.yaml"
            config.write_text(f"limits: {{redis_url: '{REDIS_URL}'}}\n")
            args += ["--config", str(config)]
        return Server(*args, auth=True)

    def ask(self, server: Server, key: str, user: object = None, **extra: Any) -> httpx.Response:
        """A short chat completion with key `key`, naming end user `user` if given."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            **extra,
        }
        if user is not None:
            body["user"] = user
        return httpx.post(
            server.url + "/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {self.secrets[key]}"},
            timeout=60,
        )


def keyed_sim(
    store: list[str], tmp: Path, model: str, keys: Iterable[tuple[str, list[str]]]
) -> Iterator[KeyedSim]:
    """Make each (name, `keys create` flags) key with the CLI, start a sim serving `model`,
    and stop the sim afterwards."""
    secrets_: dict[str, str] = {}
    ids: dict[str, str] = {}
    for name, flags in keys:
        created = json.loads(made("keys", "create", "--name", name, "--json", *flags, *store))
        secrets_[name], ids[name] = created["secret"], created["id"]
    sim = Sim(model=model)
    try:
        yield KeyedSim(store=store, model=model, sim=sim, secrets=secrets_, ids=ids, tmp=tmp)
    finally:
        sim.proc.stop()


def error_of(answer: httpx.Response) -> dict[str, Any]:
    """The OpenAI-style error object of a refused request."""
    error: dict[str, Any] = answer.json()["error"]
    return error
