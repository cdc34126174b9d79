"""Running the real `llmgw` CLI from tests, as an operator would, the Redis they share, and
a sim behind key-checking routers with keys the CLI made."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
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


# Commands run one after the other in one Python process, each through the CLI's own
# main() with its argv and stdin, as `llmgw` runs it: a set-up of many commands pays
# the interpreter's start and llmgw's imports (a second or more each on a loaded
# machine) once. Each command's exit status, stdout and stderr come back as JSON.
_MANY = """
import contextlib, io, json, sys, traceback
from llmgw.cli.main import main

answers = []
for args, stdin in json.load(sys.stdin):
    sys.argv = ["llmgw", *args]
    sys.stdin = io.StringIO(stdin)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except Exception:
            code = 1
            traceback.print_exc()
    answers.append([code, out.getvalue(), err.getvalue()])
json.dump(answers, sys.__stdout__)
"""


def made_all(commands: Sequence[tuple[Sequence[str], str]]) -> list[str]:
    """Run each (`llmgw` ARGS, stdin) in order in one process (see `_MANY`); each must
    succeed. Their standard outputs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    ran = subprocess.run(
        [sys.executable, "-c", _MANY],
        input=json.dumps([[list(args), stdin] for args, stdin in commands]),
        capture_output=True, text=True, timeout=60 + 10 * len(commands), check=False, env=env,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    outputs: list[str] = []
    for (args, _), (code, out, err) in zip(commands, json.loads(ran.stdout), strict=True):
        assert code == 0, f"llmgw {' '.join(args)} exited {code}:\n{out}{err}"
        outputs.append(out)
    return outputs


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
    """Make each (name, `keys create` flags) key with the CLI (in one process: `made_all`),
    start a sim serving `model`, and stop the sim afterwards."""
    secrets_: dict[str, str] = {}
    ids: dict[str, str] = {}
    keys = list(keys)
    outputs = made_all(
        [(["keys", "create", "--name", name, "--json", *flags, *store], "") for name, flags in keys]
    )
    for (name, _), output in zip(keys, outputs, strict=True):
        created = json.loads(output)
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
