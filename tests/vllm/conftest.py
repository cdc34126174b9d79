"""The real-vLLM tests' shared fleet (`vllm_fleet`, one vLLM for the session) and
`llmgw up --vllm` (`vllm_up`): see `tests/vllm_fleet.py`. Both are started in the
background as soon as the session's tests are collected (`tests/warm.py`)."""

from collections.abc import Iterator

import pytest
from vllm_fleet import Fleet, UpAnswered
from warm import warmed


@pytest.fixture(scope="session")
def vllm_fleet(request: pytest.FixtureRequest) -> Iterator[Fleet]:
    yield from warmed(request, "vllm_fleet")


@pytest.fixture(scope="session")
def vllm_up(request: pytest.FixtureRequest) -> Iterator[UpAnswered]:
    yield from warmed(request, "vllm_up")
