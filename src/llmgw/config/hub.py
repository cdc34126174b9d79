"""Hub references in a model's `weights`: `org/name` or `org/name@revision`.

A `weights` value is a hub reference when it has exactly this shape and is not a
path (`/`, `.` or `~` first); anything else is a local path (or `none`). The
catalog resolves a reference's revision to a commit SHA when the model is added,
and the agent downloads that commit; both read the reference here.

Not guaranteed: that the repo exists (only the hub can say).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PART = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
_REF = re.compile(rf"^({_PART})/({_PART})(?:@([A-Za-z0-9][A-Za-z0-9._/-]{{0,199}}))?$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True, slots=True)
class HubRef:
    """A hub repo and a revision (a branch, tag or commit; "main" when none was given)."""

    repo: str
    revision: str

    @property
    def pinned(self) -> bool:
        """Whether the revision is a full commit SHA (the same bytes everywhere)."""
        return COMMIT.match(self.revision) is not None

    def __str__(self) -> str:
        return f"{self.repo}@{self.revision}"

    def short(self) -> str:
        """`org/name@abc1234` (a commit shortened to 7 characters)."""
        revision = self.revision[:7] if self.pinned else self.revision
        return f"{self.repo}@{revision}"


def hub_ref(weights: str) -> HubRef | None:
    """The hub reference `weights` names, or None for a local path / `none`."""
    if weights.endswith((".gguf", ".bin", ".safetensors")):
        return None
    match = _REF.match(weights)
    if match is None or ".." in weights:
        return None
    return HubRef(repo=f"{match[1]}/{match[2]}", revision=match[3] or "main")
