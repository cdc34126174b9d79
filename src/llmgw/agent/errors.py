"""The node agent's exception tree.

```
AgentError
├── FlagError            a command-line value that cannot be used (names the flag)
├── CommandError         a command from the control plane was refused or failed;
│   │                    its message is what goes into CommandResult.error
│   ├── SpecError        a StartShard spec refused before anything was launched (names the field)
│   ├── ShardConflictError  the shard id or its port is taken by another running shard
│   ├── WeightsPathError a RemoveWeights path outside the weights directory, or in use
│   ├── LaunchError      the engine process could not be spawned at all
│   │   └── hub.DownloadError  its hub weights could not be downloaded (the hub's reason)
│   └── AgentClosingError the agent is shutting down and starts nothing new
└── ConnectError         one control-plane address could not be registered with
                         (refused, stream refused, no answer in time): try the next
```

Foreign errors (grpc, OSError, engine `ProfileError`) are translated into these at
the boundary with `raise ... from exc`; nothing here is retried by itself.
"""

from __future__ import annotations


class AgentError(Exception):
    """Base of every error the node agent raises on purpose."""


class FlagError(AgentError, ValueError):
    """A command-line value that cannot be used; `flag` names the option."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag
        self.message = message


class CommandError(AgentError):
    """A command that was refused or failed; str(exc) is sent back as the error."""


class SpecError(CommandError, ValueError):
    """A shard spec refused before launch; `field` names the ShardSpec field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class ShardConflictError(CommandError):
    """The shard id (with another spec) or its port is held by a running shard."""


class WeightsPathError(CommandError, ValueError):
    """A weights path that may not be removed (outside the weights dir, or in use)."""


class LaunchError(CommandError):
    """The engine process could not be spawned (missing executable, fork failure)."""


class SleepError(CommandError):
    """A sleep or wake the shard cannot take (wrong state, no sleep mode) or the
    engine refused."""


class AdapterError(CommandError):
    """A LoRA adapter load or unload the shard cannot take (not ready, an engine without
    runtime adapters) or the engine refused; the message carries the engine's words."""


class AgentClosingError(CommandError):
    """The agent is shutting down; it starts nothing new."""


class ConnectError(AgentError):
    """One control-plane address failed before registration; the loop tries the next.

    `notable`: the failure needs an operator (TLS on one side only, a refused
    certificate or node id) or is a standby's refusal, and is logged as a
    warning of its own; `message` then replaces the plain "address: reason".
    `timed_out`: the address answered nothing within the connect timeout.
    """

    def __init__(
        self,
        address: str,
        reason: str,
        *,
        message: str | None = None,
        notable: bool = False,
        timed_out: bool = False,
    ) -> None:
        super().__init__(message or f"{address}: {reason}")
        self.address = address
        self.reason = reason
        self.notable = notable
        self.timed_out = timed_out
