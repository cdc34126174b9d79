"""Fixtures shared across test directories.

`netns` (tests/netns.py): network namespaces on a bridge, for tests that cross hosts.
`hub`: a Hugging Face hub stand-in (tests/hub_standin.py) on a loopback port.
Loaded here, before any test module imports it, so pytest rewrites its asserts.

Engines outlive their agents, so every test gets its own agent state directory
(`LLMGW_AGENT_STATE_DIR`, read by every `llmgw agent` a test starts: a new
agent adopts what its state directory lists, and tests running side by side
must never share one), agents stop their engines on SIGTERM as before
(`LLMGW_AGENT_STOP_ENGINES_ON_EXIT=1`; a test of leaving them running sets it
to 0), and after the test every engine its state directory still lists is
killed (an agent SIGKILLed by the test leaves its engines running).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_standin import HubStandin, serve_hub
from warm import close_warm, warm_up

from llmgw.agent.state import read_identity

pytest_plugins = ["netns"]

# Fixtures wider than a test (a module's fleet) start their agents before the
# per-test fixture below has run: they get this session-wide state directory,
# never the user's ~/.local/share/llmgw/agent (CI runs on a machine that keeps
# its home directory between runs, and a stale state file there would be adopted).
_SESSION_STATE_DIR = Path(tempfile.mkdtemp(prefix="llmgw-agent-state-"))


def pytest_configure(config: pytest.Config) -> None:
    os.environ["LLMGW_AGENT_STATE_DIR"] = str(_SESSION_STATE_DIR)
    os.environ["LLMGW_AGENT_STOP_ENGINES_ON_EXIT"] = "1"


def pytest_collection_finish(session: pytest.Session) -> None:
    # The plain install and real vLLM's loads take minutes: start them now, behind
    # the other tests (tests/warm.py).
    if not session.config.option.collectonly:
        warm_up(session.config, session.items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    close_warm(session.config)


def pytest_unconfigure(config: pytest.Config) -> None:
    _kill_left_engines(_SESSION_STATE_DIR)


@pytest.fixture(autouse=True)
def _agent_state_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("agent-state")
    monkeypatch.setenv("LLMGW_AGENT_STATE_DIR", str(path))
    monkeypatch.setenv("LLMGW_AGENT_STOP_ENGINES_ON_EXIT", "1")
    yield path
    _kill_left_engines(path)


def _kill_left_engines(state_dir: Path) -> None:
    for state in state_dir.glob("engines/*/state.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            for engine in json.loads(state.read_text())["engines"]:
                identity = read_identity(int(engine["pid"]))
                if identity is not None and identity.start_ticks == engine["start_ticks"]:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(int(engine["pid"]), signal.SIGKILL)


PG_URL = os.environ.get("LLMGW_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


async def _pg_admin(sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(PG_URL)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture
def hub() -> Iterator[HubStandin]:
    """A hub stand-in for this test; point agents at it with `HF_ENDPOINT=hub.url`."""
    with serve_hub() as standin:
        yield standin


@pytest.fixture
def database() -> Iterator[str]:
    """A fresh PostgreSQL database (the URL), dropped after the test; fails if there is none."""
    import asyncio
    import secrets

    name = f"llmgw_t_{secrets.token_hex(4)}"
    try:
        asyncio.run(_pg_admin(f"CREATE DATABASE {name}"))
    except OSError as exc:
        pytest.fail(f"PostgreSQL is not running on 127.0.0.1:5432 ({exc}); this test needs it")
    yield f"{PG_URL.rsplit('/', 1)[0]}/{name}"
    asyncio.run(_pg_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
