"""vLLM's sleep mode, played by the sim: `POST /sleep?level=1|2`, `POST /wake_up`,
`GET /is_sleeping`.

Shapes follow vLLM's OpenAI server (with `--enable-sleep-mode` and
`VLLM_SERVER_DEV_MODE=1`): `/sleep` and `/wake_up` answer 200 with an empty body
once done (they block for the sleep or wake time), `/is_sleeping` answers
`{"is_sleeping": bool}`. While asleep, and while falling asleep or waking, routes
that need the model's weights answer 503 with an OpenAI error body saying the
model is sleeping; `/health`, `/v1/models`, `/tokenize`, `/detokenize` and
`/metrics` keep answering, as vLLM's do.

Memory, as vLLM moves it: level 1 copies the weights to host RAM and discards
the KV cache; level 2 discards both (a wake then reloads the weights, which
takes the load time on top of the wake time). `memory()` says where the
weights' bytes are, for `/sim/stats` and the sim's metrics.

Not guaranteed: vLLM's `tags` argument of `/wake_up` (partial wakes) is accepted
and ignored; a sleep while requests are running does not wait for them (the
control plane only puts idle replicas to sleep).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import parse_qs

from llmgw.sim.errors import SimError, bad_request


class Phase(enum.StrEnum):
    AWAKE = "awake"
    FALLING_ASLEEP = "falling_asleep"
    ASLEEP = "asleep"
    WAKING = "waking"


@dataclass(frozen=True, slots=True)
class SleepTimes:
    """Seconds each transition takes (on the sim's own clock, via `sleep`)."""

    sleep_time: float
    wake_time: float
    reload_time: float


@dataclass(frozen=True, slots=True)
class Memory:
    """Where the weights are: bytes on the GPU and bytes copied to host RAM."""

    gpu_bytes: int
    host_bytes: int


class SleepMode:
    """The sleep state of one sim and its three endpoints."""

    def __init__(
        self,
        *,
        times: SleepTimes,
        weights_bytes: int,
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self._times = times
        self._weights_bytes = weights_bytes
        self._sleep = sleep
        self._phase = Phase.AWAKE
        self._level = 0
        self._lock = asyncio.Lock()
        self.sleeps = 0
        self.wakes = 0

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def level(self) -> int:
        """The level of the current (or last) sleep; 0 before the first."""
        return self._level

    @property
    def serving(self) -> bool:
        return self._phase is Phase.AWAKE

    def memory(self) -> Memory:
        if self._phase is Phase.AWAKE:
            return Memory(gpu_bytes=self._weights_bytes, host_bytes=0)
        host = self._weights_bytes if self._level == 1 else 0
        return Memory(gpu_bytes=0, host_bytes=host)

    def refusal(self) -> SimError:
        return SimError(
            503,
            f"model is {'waking up' if self._phase is Phase.WAKING else 'sleeping'}: "
            "POST /wake_up first",
            code="sleeping",
        )

    async def put_to_sleep(self, query: bytes) -> None:
        """`POST /sleep?level=N` (1 by default); a sleeping engine stays as it is."""
        level = _level(query)
        async with self._lock:
            if self._phase is Phase.ASLEEP:
                return
            self._phase = Phase.FALLING_ASLEEP
            self._level = level
            await self._sleep(self._times.sleep_time)
            self._phase = Phase.ASLEEP
            self.sleeps += 1

    async def wake_up(self) -> None:
        """`POST /wake_up`: level 1 copies the weights back; level 2 reloads them."""
        async with self._lock:
            if self._phase is Phase.AWAKE:
                return
            self._phase = Phase.WAKING
            extra = self._times.reload_time if self._level == 2 else 0.0
            await self._sleep(self._times.wake_time + extra)
            self._phase = Phase.AWAKE
            self.wakes += 1


def _level(query: bytes) -> int:
    try:
        values = parse_qs(query.decode("latin-1"), strict_parsing=False).get("level")
    except ValueError as exc:
        raise bad_request(f"bad query string: {exc}") from exc
    if not values:
        return 1
    text = values[-1]
    if text not in ("1", "2"):
        raise bad_request(f"level must be 1 or 2, not {text!r}")
    return int(text)
