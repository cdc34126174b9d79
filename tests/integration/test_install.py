"""The install the README makes, tested: `pip install .` alone, then the README's commands.

`make run` installs the project with its runtime dependencies only; the test suite
runs with the test extra on top, which hid a missing runtime dependency once
(`llmgw models list` ended in `ModuleNotFoundError: httpx` after `make run`). So
this module uses a fresh venv with a plain, non-editable `pip install` of a copy
of the working tree (tests/plain_install.py: built once per test session, in the
background from the session's start, as it takes a minute or more), starts `llmgw up`
from it, and runs every admin command the README shows against that running gateway:
each must exit 0, print no traceback, and show what it is for. `llmgw --help` (the
console script) and every command's `--help` (in one Python process) run in that
venv too.

The commands are read from README.md: each `llmgw GROUP SUB` it mentions (in code
blocks, inline code or the sample output) must have a run here (RUNS), and each
run here must be one the README mentions, so the test follows the README. Lines of
code blocks without placeholders (`llmgw keys create --name my-team`) are also run
exactly as written. Admin commands are those that act on a running gateway or its
store (models, nodes, keys, users, usage, status, events); `llmgw certs` writes files and
is covered by its own tests.

Not guaranteed: that the install works offline (see tests/plain_install.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from procs import descendants, free_port, free_port_block
from typer.core import TyperGroup
from warm import warmed

from llmgw.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ADMIN_GROUPS = ("models", "nodes", "keys", "users", "teams", "usage", "status", "events")
NODE = "local"
SIM = "sim-small"
KEY = "readme-key"
COMMAND_TIMEOUT = 180.0
READY_TIMEOUT = 120.0

pytestmark = pytest.mark.timeout(1200)


@dataclass(frozen=True)
class Run:
    """One admin command the README shows, made runnable, and what its output must hold."""

    form: str  # "GROUP SUB" as the README names it, or "GROUP" for a command without subs
    args: tuple[str, ...]
    shows: str
    stdin: str | None = None
    # A pattern whose first group in the output is kept, for "{kept}" in later runs' args.
    keep: str | None = None
    # Written to a file whose path replaces "{file}" in the args.
    file: str | None = None
    # The exit status it must end with: 2 for a refusal the README says the command gives.
    code: int = 0


ADD_MODEL = (
    "models", "add", "--name", "readme-sim", "--engine", "sim", "--weights", "simulated",
    "--gpus", "0", "--keep-alive", "5m",
)  # fmt: skip
# readme-sim with a canary (`versions:`), as `llmgw models add -f FILE --replace` reads it.
CANARY = """
name: readme-sim
weights: simulated
keep_alive: 5m
profiles: [{name: sim, engine: sim, gpus: 0}]
versions:
  - {name: stable, weight: 90}
  - {name: v2, weight: 10, profiles: [{name: sim, engine: sim, gpus: 0, engine_args: [--output-tokens, "8"]}]}
"""
ADD_CANARY = ("models", "add", "-f", "{file}", "--replace")
# In order: each may rely on what the ones before it did. The drain runs while
# nothing is running on the node (a single node has nowhere to move a replica to).
RUNS = (
    Run("status", ("status",), NODE),
    Run("nodes list", ("nodes", "list"), NODE),
    Run("nodes show", ("nodes", "show", NODE), NODE),
    Run("models list", ("models", "list"), SIM),
    Run("models add", ADD_MODEL, "readme-sim"),
    Run("models explain", ("models", "explain", SIM), NODE),
    Run("nodes drain", ("nodes", "drain", NODE, "--wait", "--timeout", "120"), NODE),
    Run("nodes undrain", ("nodes", "undrain", NODE), NODE),
    Run("models activate", ("models", "activate", SIM, "--timeout", "120"), "ready"),
    Run("models show", ("models", "show", SIM), SIM),
    Run("models pull", ("models", "pull", "readme-sim"), "there is nothing to pull", code=2),
    Run("events", ("events", "--model", SIM), f"  ready  {SIM}  {NODE}  replica "),
    Run("models reload", ("models", "reload"), "reloaded the models of llmgw up's catalog"),
    Run("models rollout status", ("models", "rollout", "status", "readme-sim"), "readme-sim"),
    Run("models add", ADD_CANARY, "readme-sim", file=CANARY),
    Run("models rollout abort", ("models", "rollout", "abort", "readme-sim"), "dropped"),
    Run("models add", ADD_CANARY, "readme-sim", file=CANARY),
    Run("models rollout promote", ("models", "rollout", "promote", "readme-sim"), "is its spec"),
    Run("models rollout undo", ("models", "rollout", "undo", "readme-sim"), "previous spec"),
    Run("nodes remove-weights", ("nodes", "remove-weights", NODE, "no-such-model.gguf"), NODE),
    Run("keys create", ("keys", "create", "--name", KEY), "sk-llmgw-"),
    Run("keys list", ("keys", "list"), KEY),
    Run("keys update", ("keys", "update", KEY, "--rpm", "100", "--no-budget"), "100"),
    Run("keys update", ("keys", "update", KEY, "--user-rpm", "20"), "user_rpm=20"),
    Run("keys rotate", ("keys", "rotate", KEY), "sk-llmgw-"),
    Run("keys revoke", ("keys", "revoke", KEY), KEY),
    Run("usage", ("usage", "--by", "day,key"), ""),
    Run("usage", ("usage", "--by", "key,end-user"), ""),
    Run(
        "users create",
        ("users", "create", "readme-admin", "--admin", "--password-stdin"),
        "readme-admin",
        stdin="a long enough password 123\n",
    ),
    Run("users role", ("users", "role", "readme-admin", "operator"), "operator"),
    Run("teams create", ("teams", "create", "readme-team", "--rpm", "600"), "readme-team"),
    Run("teams list", ("teams", "list"), "readme-team"),
    Run("teams update", ("teams", "update", "readme-team", "--rpm", "300"), "300"),
    Run(
        "teams members add",
        ("teams", "members", "add", "readme-team", "readme-admin", "--role", "team-admin"),
        "readme-admin",
    ),
    Run("teams show", ("teams", "show", "readme-team"), "readme-admin"),
    Run(
        "teams members remove",
        ("teams", "members", "remove", "readme-team", "readme-admin"),
        "readme-admin",
    ),
    Run("teams remove", ("teams", "remove", "readme-team"), "readme-team"),
    Run(
        "nodes token create",
        ("nodes", "token", "create", "--uses", "1", "--labels", "from=readme"),
        "llmgw agent --server",
        keep=r"join token (\S+) \(",
    ),
    Run("nodes token list", ("nodes", "token", "list"), "from=readme"),
    Run("nodes token revoke", ("nodes", "token", "revoke", "{kept}"), "revoked"),
    # Last: the node is gone for good afterwards (its key revoked, if it had one).
    Run("nodes remove", ("nodes", "remove", NODE, "--reason", "the install test"), "removed"),
)

# `llmgw nodes undrain` is not in the README; it puts the node back for the activation.
SETUP_ONLY = frozenset({"nodes undrain"})
_MENTION = re.compile(r"\bllmgw((?:\s+[a-z][a-z|-]*){1,3})")
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_VERBATIM = re.compile(r"(?:\S*/)?llmgw\s+(?:" + "|".join(ADMIN_GROUPS) + r")\b[^\n#]*")
_PLACEHOLDER = re.compile(r"[A-Z]{2,}|[|\[\]<>…]|\.\.\.")


def readme_forms(text: str) -> set[str]:
    """Every admin command the README mentions, as "GROUP [SUB...]" down to a command.

    Words are followed through the CLI's own groups ("nodes token create"); an
    alternative list such as "keys create|list" gives one form per command.
    """
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    forms: set[str] = set()
    for match in _MENTION.finditer(text):
        words = match.group(1).split()
        if words[0] not in ADMIN_GROUPS:
            continue  # `llmgw server`, `llmgw is up`, ...
        paths: list[tuple[list[str], Any]] = [([], root)]
        for word in words:
            deeper = []
            for path, command in paths:
                if not isinstance(command, TyperGroup):
                    continue
                deeper += [
                    ([*path, name], command.commands[name])
                    for name in word.split("|")
                    if name in command.commands
                ]
            if not deeper:
                break
            paths = deeper
        forms.update(
            " ".join(path) for path, command in paths if not isinstance(command, TyperGroup)
        )
    return forms


def readme_verbatim(text: str) -> list[list[str]]:
    """Admin command lines in the README's code blocks that can be run as written."""
    found: list[list[str]] = []
    for block in _FENCE.findall(text):
        for match in _VERBATIM.finditer(block):
            line = match.group(0).strip()
            if _PLACEHOLDER.search(line):
                continue
            words = shlex.split(line)
            found.append(["llmgw", *words[1:]])
    return found


def test_the_runs_here_are_the_admin_commands_the_readme_shows() -> None:
    shown = readme_forms(README.read_text(encoding="utf-8"))
    runs = {run.form for run in RUNS} - SETUP_ONLY
    assert shown - runs == set(), (
        f"README.md shows {sorted(shown - runs)}, which this test does not run: add each to RUNS"
    )
    assert runs - shown == set(), (
        f"RUNS has {sorted(runs - shown)}, which README.md no longer shows: remove them"
    )
    # What the parsing is meant to find, on today's README.
    assert {"models list", "nodes list", "status", "keys create"} <= shown


@pytest.fixture(scope="session")
def fresh_install(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A venv with `pip install <copy of this tree>` and nothing else; its bin directory.
    Built in the background from the start of the session (tests/plain_install.py)."""
    yield from warmed(request, "fresh_install")


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a new shell: no LLMGW_* settings from the test run, a fresh HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMGW_", "XDG_"))}
    env.pop("VIRTUAL_ENV", None)
    env.update(HOME=str(home), COLUMNS="200", **extra)
    return env


@dataclass(frozen=True)
class Gateway:
    admin: str
    data_dir: Path
    output: Path


@pytest.fixture
def gateway(fresh_install: Path, tmp_path: Path) -> Iterator[Gateway]:
    """`llmgw up` from the fresh venv, with its local agent registered."""
    home = tmp_path / "home"
    home.mkdir()
    data_dir = tmp_path / "data"
    port, admin_port, agent_port = free_port(), free_port(), free_port()
    low = free_port_block(10)
    argv = [
        str(fresh_install / "llmgw"), "up",
        "--listen", f"127.0.0.1:{port}",
        "--admin-listen", f"127.0.0.1:{admin_port}",
        "--agent-listen", f"127.0.0.1:{agent_port}",
        "--data-dir", str(data_dir),
        "--port-range", f"{low}-{low + 9}",
    ]  # fmt: skip
    output = tmp_path / "up.log"
    admin = f"http://127.0.0.1:{admin_port}"
    with output.open("wb") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=clean_env(home),
            start_new_session=True,
        )
    try:
        wait_for_node(proc, admin, output)
        yield Gateway(admin=admin, data_dir=data_dir, output=output)
    finally:
        # The agent and its engines run in sessions of their own: found through /proc.
        left = descendants(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
        for pid in [proc.pid, *left]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


def wait_for_node(proc: subprocess.Popen[bytes], admin: str, output: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        if proc.poll() is not None:
            pytest.fail(
                f"`llmgw up` exited {proc.returncode}:\n{output.read_text(errors='replace')}",
                pytrace=False,
            )
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            nodes = httpx.get(f"{admin}/admin/api/nodes", timeout=5).json()["nodes"]
            if any(n["id"] == NODE and n["state"] == "ready" for n in nodes):
                return
        if time.monotonic() > deadline:
            pytest.fail(
                f"node {NODE!r} not ready within {READY_TIMEOUT:.0f} s:\n"
                f"{output.read_text(errors='replace')}",
                pytrace=False,
            )
        time.sleep(0.2)


def run_llmgw(
    bin_dir: Path, args: list[str], env: dict[str, str], stdin: str | None = None, code: int = 0
) -> subprocess.CompletedProcess[str]:
    """One `llmgw` command from the fresh venv; fails the test on a traceback or an exit
    status other than `code`."""
    argv = [str(bin_dir / "llmgw"), *args]
    done = subprocess.run(
        argv,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )
    said = f"$ llmgw {shlex.join(args)}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stdout + done.stderr, said
    assert done.returncode == code, said
    return done


def test_every_admin_command_the_readme_shows_runs_from_a_plain_install(
    fresh_install: Path, gateway: Gateway, tmp_path: Path
) -> None:
    home = tmp_path / "cli-home"
    home.mkdir()
    env = clean_env(home, LLMGW_ADMIN_URL=gateway.admin, LLMGW_DATA_DIR=str(gateway.data_dir))
    for words in readme_verbatim(README.read_text(encoding="utf-8")):
        run_llmgw(fresh_install, words[1:], env)
    kept = ""
    for number, run in enumerate(RUNS):
        path = tmp_path / f"run-{number}.yaml"
        if run.file is not None:
            path.write_text(run.file)
        args = [arg.replace("{kept}", kept).replace("{file}", str(path)) for arg in run.args]
        done = run_llmgw(fresh_install, args, env, run.stdin, run.code)
        assert run.shows in done.stdout + done.stderr, (
            f"$ llmgw {shlex.join(args)} does not show {run.shows!r}:\n{done.stdout}\n{done.stderr}"
        )
        if run.keep is not None:
            match = re.search(run.keep, done.stdout)
            assert match is not None, (
                f"$ llmgw {shlex.join(args)}: no {run.keep!r} in\n{done.stdout}"
            )
            kept = match.group(1)
    # What the admin commands did is what the gateway now holds.
    models = httpx.get(f"{gateway.admin}/admin/api/models", timeout=10).json()
    names = {m["name"] for m in models["models"]}
    assert {SIM, "readme-sim"} <= names, models


# Every command's `--help` in one Python process of the fresh venv (a process for each
# of some sixty commands cost about 40 s): the console script's own `main()` with its
# argv, its output captured; what each printed, its exit status and any traceback come
# back as JSON.
HELP_SCRIPT = """
import contextlib, io, json, sys, traceback
from llmgw.cli.main import main

answers = []
for path in json.load(sys.stdin):
    sys.argv = ["llmgw", *path, "--help"]
    out = io.StringIO()
    code, crash = 0, ""
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except Exception:
            code, crash = 1, traceback.format_exc()
    answers.append({"path": path, "code": code, "output": out.getvalue(), "crash": crash})
json.dump(answers, sys.stdout)
"""


def stray_markup(help_text: str) -> list[str]:
    # A default written as "[default: X]" and read as markup is dropped, which once
    # left "HOST:PORT ." behind.
    return [line for line in help_text.splitlines() if re.search(r"\w \.(\s|$)", line)]


def test_help_of_every_command_from_a_plain_install(fresh_install: Path, tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    # The console script itself, as a user runs it.
    done = run_llmgw(fresh_install, ["--help"], env)
    assert "Usage: llmgw" in done.stdout, done.stdout
    assert not stray_markup(done.stdout), done.stdout
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    paths: list[list[str]] = [[]]
    for name, command in sorted(root.commands.items()):
        paths.append([name])
        if isinstance(command, TyperGroup):
            paths += [[name, sub] for sub in sorted(command.commands)]
    ran = subprocess.run(
        [str(fresh_install / "python"), "-c", HELP_SCRIPT],
        input=json.dumps(paths),
        capture_output=True,
        text=True,
        env=env,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )
    assert ran.returncode == 0, f"{ran.stdout}\n{ran.stderr}"
    answers = json.loads(ran.stdout)
    assert [answer["path"] for answer in answers] == paths
    for answer in answers:
        said = f"$ llmgw {' '.join(answer['path'])} --help\nexit {answer['code']}\n"
        said += answer["output"] + answer["crash"]
        assert answer["crash"] == "" and "Traceback" not in answer["output"], said
        assert answer["code"] == 0, said
        assert "Usage: llmgw" in answer["output"], said
        stray = stray_markup(answer["output"])
        assert not stray, f"llmgw {' '.join(answer['path'])} --help:\n" + "\n".join(stray)
