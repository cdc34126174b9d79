"""Why an activation did not produce a ready replica.

    ActivationRefused          the model cannot be served now; `retry_after` says when to try again
    ├── NotInCatalog           no model (or alias) of that name
    ├── ActivationDisabled     the model is not running and is not started on request
    ├── Unplaceable            no node can take a replica now (the placement reasons included)
    ├── ReplicaFailed          its replica failed to start (reason and engine output included)
    ├── AdapterRefused         the engine refused to load the LoRA adapter (its words included)
    └── ActivationTimeout      no replica became ready within the activation timeout

Every one is retryable only later, never at once: the type carries the delay
(`retry_after`, whole seconds) and a stable `code` for error bodies. `message`
is the operator's (`llmgw models activate`, the admin API); `public` is what an
API client whose request waited is told: the same, except that a failed
replica's reason and engine output (which may name addresses, paths or
arguments) stay with the operator.
"""

from __future__ import annotations


class ActivationRefused(Exception):
    """A request's model has no ready replica and none will be ready in time."""

    code = "model_unavailable"

    def __init__(self, message: str, *, retry_after: int, public: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.public = message if public is None else public
        self.retry_after = max(1, retry_after)


class NotInCatalog(ActivationRefused):
    code = "model_not_found"


class ActivationDisabled(ActivationRefused):
    code = "model_not_running"


class Unplaceable(ActivationRefused):
    code = "model_unplaceable"


class ReplicaFailed(ActivationRefused):
    code = "model_failed"


class AdapterRefused(ActivationRefused):
    """The engine refused to load a LoRA adapter (bad files, rank over the limit); the
    message carries its words. Permanent for the same adapter: the client's request,
    not a replica, is what cannot be served."""

    code = "adapter_refused"


class ActivationTimeout(ActivationRefused):
    code = "activation_timeout"
