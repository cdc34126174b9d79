"""Failure injection: error responses, crashes, stalled and broken streams, slow starts.

`Faults` holds the current `FaultSettings` and replaces them whole on every update, so
a request reads one consistent set. Crashing is done through an injected
`exit_process` (the CLI passes `os._exit`: no cleanup, no response, like a segfaulting
engine), so tests can check the decision without dying.

Not guaranteed: `error_rate` is a probability per request, drawn from a seeded RNG, so
the exact requests that fail depend on arrival order. `crash_after` counts inference
requests from the moment it was set (process start for the CLI option).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import NoReturn

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class FaultSettings(BaseModel):
    """What to break. The defaults break nothing."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    error_rate: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Fraction of inference requests answered with `error_status`. 0 by "
        "default: a simulated engine is healthy unless a test says otherwise.",
    )
    error_status: int = Field(
        default=500,
        ge=400,
        le=599,
        description="HTTP status of injected errors; 500 is what a crashing engine "
        "handler returns, pick 429 or 503 to exercise retry paths.",
    )
    crash_after: int | None = Field(
        default=None,
        ge=0,
        description="Exit the process abruptly when inference request N+1 arrives, before "
        "answering it. None (default) never crashes; 0 crashes on the next request.",
    )
    stall_after_tokens: int | None = Field(
        default=None,
        ge=0,
        description="After this many tokens a generation stops but keeps the connection "
        "open until the client goes away: a stream sends N token chunks and then nothing, "
        "a non-streaming request longer than N tokens never answers. None (default) never "
        "stalls.",
    )
    break_after_tokens: int | None = Field(
        default=None,
        ge=0,
        description="After this many tokens a generation's connection is closed without "
        "the rest of the answer, as when a proxy or the network drops it: a stream ends "
        "mid-body (no final chunk, no [DONE]; natively served Messages and Responses "
        "streams too), a non-streaming chat or completion answer longer than N tokens "
        "is cut short after its headers. None (default) never breaks.",
    )
    exit_after_tokens: int | None = Field(
        default=None,
        ge=0,
        description="Exit the process abruptly once a generation has produced this many "
        "tokens (a stream has sent them), as an engine that crashes mid-generation. None "
        "(default) never exits.",
    )
    slow_start: float = Field(
        default=0.0,
        ge=0.0,
        description="Seconds every inference request waits before its first token or its "
        "response (errors included), to trigger first-byte deadlines. 0 by default.",
    )


class FaultsError(ValueError):
    """A fault update was rejected; the message names the field and the rule."""


class Faults:
    """The current fault settings, the crash countdown and the error RNG."""

    def __init__(
        self,
        *,
        settings: FaultSettings,
        rng: random.Random,
        exit_process: Callable[[int], NoReturn],
    ) -> None:
        self.settings = settings
        self._rng = rng
        self._exit_process = exit_process
        self._seen_since_crash_set = 0

    def update(self, patch: Mapping[str, object]) -> FaultSettings:
        """Apply the given fields on top of the current settings; the rest stay as they are."""
        merged = {**self.settings.model_dump(), **patch}
        try:
            settings = FaultSettings.model_validate(merged)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
                for error in exc.errors()
            )
            raise FaultsError(f"invalid fault settings: {problems}") from exc
        if "crash_after" in patch:
            self._seen_since_crash_set = 0
        self.settings = settings
        return settings

    def on_inference_request(self) -> None:
        """Count an arriving inference request; exits the process if it is the fatal one."""
        crash_after = self.settings.crash_after
        if crash_after is not None and self._seen_since_crash_set >= crash_after:
            self._exit_process(1)
        self._seen_since_crash_set += 1

    def exit_now(self) -> NoReturn:
        """End the process at once (an injected crash mid-generation)."""
        self._exit_process(1)

    def should_fail(self) -> bool:
        rate = self.settings.error_rate
        if rate <= 0.0:
            return False
        return rate >= 1.0 or self._rng.random() < rate
