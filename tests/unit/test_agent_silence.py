"""A server that accepts and never answers costs the agent one dial timeout, not one per dial.

The connection loop runs against real gRPC servers on loopback (the harness of
test_agent_connection.py: injected sleep, the Ceiling RNG); `SilentServers`
alone runs on an injected clock.
"""

from __future__ import annotations

from pathlib import Path

import test_agent_connection
from test_agent_connection import Servers, connection, run_until_stopped

from llmgw.agent.silence import SilentServers

servers = test_agent_connection.servers  # the fixture


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_silent_addresses_go_last_until_they_answer_or_are_forgotten() -> None:
    clock = Clock()
    silent = SilentServers(clock=clock, remember_for=60.0)
    addresses = ["a:1", "b:2", "c:3"]
    assert silent.order(addresses) == addresses
    silent.timed_out("a:1")
    silent.timed_out("b:2")
    assert silent.order(addresses) == ["c:3", "a:1", "b:2"]
    silent.answered("b:2")
    assert silent.order(addresses) == ["b:2", "c:3", "a:1"]
    clock.now += 61.0
    assert silent.order(addresses) == addresses
    assert not silent.is_silent("a:1")


async def test_a_silent_first_server_is_dialled_once_then_after_the_others(
    servers: Servers, tmp_path: Path
) -> None:
    quiet, _ = await servers.add("quiet", lambda n: "silent")
    # Registers three times (each stream ends at once), then refuses.
    good, _ = await servers.add("good", lambda n: "register" if n <= 3 else "refuse")
    shared = SilentServers()
    conn = connection([quiet, good], servers.events, tmp_path, sleeps=1, silent=shared)

    await run_until_stopped(conn)

    # The first pass waits on the silent server once. After each stream the next
    # pass would start with it again (the address after the one that served):
    # it goes after the others instead, and is dialled only when they fail.
    assert servers.events == [
        "quiet:silent", "good:register", "good:register", "good:register",
        "good:refuse", "quiet:silent", "sleep 0.5",
    ]  # fmt: skip
    assert shared.is_silent(quiet) and not shared.is_silent(good)


async def test_a_server_that_timed_out_while_joining_is_dialled_last_by_the_connection(
    servers: Servers, tmp_path: Path
) -> None:
    quiet, _ = await servers.add("quiet", lambda n: "silent")
    good, _ = await servers.add("good", lambda n: "register" if n == 1 else "refuse")
    shared = SilentServers()
    shared.timed_out(quiet)  # what joining records when its handshake timed out
    conn = connection([quiet, good], servers.events, tmp_path, sleeps=1, silent=shared)

    await run_until_stopped(conn)

    assert servers.events == ["good:register", "good:refuse", "quiet:silent", "sleep 0.5"]


def test_the_dial_timeouts_agree() -> None:
    from llmgw.agent.enroll import DIAL_TIMEOUT_SECONDS
    from llmgw.agent.settings import ConnectionSettings
    from llmgw.cli.agent import DEFAULT_DIAL_TIMEOUT, DEFAULT_REGISTER_TIMEOUT

    default = ConnectionSettings()
    assert DEFAULT_DIAL_TIMEOUT == DIAL_TIMEOUT_SECONDS == default.connect_timeout_seconds
    assert default.register_timeout_seconds == DEFAULT_REGISTER_TIMEOUT
