"""Fixtures shared across test directories.

`netns` (tests/netns.py): network namespaces on a bridge, for tests that cross hosts.
Loaded here, before any test module imports it, so pytest rewrites its asserts.

Each test gets its own agent state directory (`LLMGW_AGENT_STATE_DIR`, read by
every `llmgw agent` a test starts): engines outlive their agents and a new agent
adopts what its state directory lists, so tests running side by side must never
share one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["netns"]


@pytest.fixture(autouse=True)
def _agent_state_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    path = tmp_path_factory.mktemp("agent-state")
    monkeypatch.setenv("LLMGW_AGENT_STATE_DIR", str(path))
    return path
