"""Slow session set-ups, started in the background as soon as the tests are collected.

A set-up here takes a minute or more (a plain `pip install` of the project, real
vLLM's loads): each runs in one daemon thread, one after the other (never two heavy
set-ups at once), and only when a collected test uses the fixture of its name; that
fixture waits for it in `warmed`. So the set-ups overlap the tests that come before
their first user instead of adding to the suite. They run in the order their users
come: the plain install (tests/integration/test_install.py) before vLLM (tests/vllm,
the last directory).

Not guaranteed: that a set-up is done when its first user comes (the user waits for
it, at most its timeout).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from plain_install import PIP_TIMEOUT, build_plain_install
from procs import Background, run_in_background
from vllm_fleet import LOAD_TIMEOUT, start_fleet, start_up

Setup = Callable[[contextlib.ExitStack[bool | None]], Any]

# Name of the fixture that uses it → the set-up and how long its user waits for it.
SETUPS: dict[str, tuple[Setup, float]] = {
    "fresh_install": (build_plain_install, 2 * PIP_TIMEOUT),
    "vllm_fleet": (start_fleet, 2 * LOAD_TIMEOUT),
    "vllm_up": (start_up, 2 * LOAD_TIMEOUT),
}
WARM = pytest.StashKey[dict[str, Background[Any]]]()


def warm_up(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Start, in one background thread, the set-ups the collected tests will use."""
    used = {name for item in items for name in getattr(item, "fixturenames", ())}
    jobs = {name: Background(name, setup) for name, (setup, _) in SETUPS.items() if name in used}
    config.stash[WARM] = jobs
    if jobs:
        run_in_background("warm-up", list(jobs.values()))


def close_warm(config: pytest.Config) -> None:
    for job in config.stash.get(WARM, {}).values():
        job.close()


def warmed(request: pytest.FixtureRequest, name: str) -> Iterator[Any]:
    """The set-up `name`'s result, for its session fixture; closed after the session."""
    setup, timeout = SETUPS[name]
    job = request.config.stash.get(WARM, {}).get(name)
    if job is None:  # not collected up front (e.g. started from a plugin): set up now
        job = Background(name, setup)
        job.run()
    try:
        yield job.result(timeout=timeout)
    finally:
        job.close()
