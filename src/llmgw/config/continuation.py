"""Settings of mid-stream continuation: resuming a stream whose replica died.

These models only validate shape and ranges; see `llmgw.router.continuation` for
what the router does with them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ContinuationConfig(BaseModel):
    """Whether and how often a broken stream is continued on another replica."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        default=True,
        description=(
            "Continue a chat or completion stream whose engine failed after the client got "
            "its first bytes (connection lost, engine exit, idle deadline) on another replica, "
            "from the text already sent. On by default: the client sees one stream instead of "
            "an error and a whole retry that pays the prompt again."
        ),
    )
    max_attempts: int = Field(
        default=2,
        ge=1,
        le=10,
        description=(
            "Continuation requests per client request, over all its failures. 2 rides out a "
            "replica dying and the next one failing too, without chasing a fleet that is down."
        ),
    )
    models: dict[str, bool] = Field(
        default_factory=dict,
        description=(
            "Per model name (as clients send it): true or false, overriding `enabled`, e.g. "
            "to turn continuation off for a model whose sampling makes a spliced answer "
            "unwelcome. Empty by default."
        ),
    )

    def enabled_for(self, model: str) -> bool:
        return self.models.get(model, self.enabled)
