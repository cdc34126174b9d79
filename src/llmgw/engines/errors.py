"""The engines package's exception tree: why a shard's spec cannot be launched.

```
EngineError                 base of everything this package raises on purpose
└── ProfileError            a spec the engine would refuse (also a ValueError);
    │                       `field` names the EngineSpec field, `message` says what to do
    └── UnknownEngine       field "engine": no adapter has that name
```

All of them are permanent: the same spec fails the same way until an operator
changes the profile, so callers should report them (field and message) rather
than retry. Nothing else is raised on purpose; metrics parsing never raises.

Not guaranteed: that a spec which validates also starts. Validation catches what
can be known without running the engine (argument conflicts, GPU counts, file
names), not missing weights, too little GPU memory or an engine that is not
installed.
"""

from __future__ import annotations

from llmgw.engines.spec import KNOWN_ENGINES


class EngineError(Exception):
    """Base of the errors raised by `llmgw.engines`."""


class ProfileError(EngineError, ValueError):
    """A spec the engine would refuse, or that llmgw could not run as given.

    `field` is the `EngineSpec` field at fault ("engine_args", "gpu_indices", ...),
    `message` says what is wrong and what to do; `str(exc)` is "field: message".
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self) -> tuple[type[ProfileError], tuple[object, ...]]:
        # Exception pickles by re-calling the class with `args` (the joined
        # string), which this signature does not accept.
        return (type(self), (self.field, self.message))


class UnknownEngine(ProfileError):
    """No adapter has this engine name; the message lists the known ones."""

    def __init__(self, engine: str, known: tuple[str, ...] = KNOWN_ENGINES) -> None:
        super().__init__(
            "engine",
            f"unknown engine {engine!r}; known engines: {', '.join(known)}",
        )
        self.engine = engine
        self.known = known

    def __reduce__(self) -> tuple[type[ProfileError], tuple[object, ...]]:
        return (type(self), (self.engine, self.known))
