"""Pinning a model's hub weights to a commit when it is added.

A stored model whose `weights` is a hub reference (`org/name` or
`org/name@revision`, see `llmgw.config.hub`) gets `weights_commit`: the commit
SHA the hub says that revision is now. Every node then downloads and runs the
same bytes, even when the branch moves later. The model keeps both (`weights`
as written, `weights_commit` as resolved); replacing the model resolves again.

`HubRevisions` asks the hub with the real `huggingface_hub` client, honouring
`HF_ENDPOINT` and `HF_TOKEN` from the server's environment. A repo or revision
the hub refuses is an `InvalidModel` carrying the hub's reason; a hub that
cannot be reached is `HubUnavailable` (the operator may then give
`weights_commit` themselves, which is used as given, without asking the hub).

The resolver also reads the size of the files at that commit from the hub's
file list (`weights_bytes`), so placement knows how much a node must download.

`pin` is the one place a model gets pinned: the admin API's add and replace,
and the config file's models when the server starts and on every reload (a
repo or revision the hub refuses is then a config error naming the file and
field; a hub that cannot be reached leaves them unpinned with a warning, so the
server still starts without the hub, and their nodes download the revision as
written).

Not guaranteed: that the commit is still downloadable later (a force-pushed
branch can drop it), or that the repo holds weights an engine can load.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from llmgw.config.hub import HubRef, hub_ref
from llmgw.control.catalog.errors import HubUnavailable, InvalidModel
from llmgw.control.catalog.model import CatalogModel


class HubRefused(Exception):
    """The hub answered: no such repo, revision, or no access. `reason` is its words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class HubUnreachable(Exception):
    """The hub did not answer (connection refused, DNS, timeout)."""


@dataclass(frozen=True, slots=True)
class Resolved:
    """A revision as the hub names it now: its commit and the bytes of its files
    (None when the hub did not say)."""

    commit: str
    bytes: int | None


class RevisionResolver(Protocol):
    """Turns a hub reference into the commit SHA its revision names now."""

    async def commit(self, ref: HubRef) -> Resolved: ...


@dataclass(frozen=True, slots=True)
class HubRevisions:
    """`RevisionResolver` over the hub API (`GET /api/models/{repo}/revision/{rev}`)."""

    environ: Mapping[str, str]

    @property
    def endpoint(self) -> str:
        return self.environ.get("HF_ENDPOINT") or "https://huggingface.co"

    async def commit(self, ref: HubRef) -> Resolved:
        return await asyncio.to_thread(self._commit, ref)

    def _commit(self, ref: HubRef) -> Resolved:
        import httpx2
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError

        api = HfApi(endpoint=self.endpoint, token=self.environ.get("HF_TOKEN") or False)
        try:
            info = api.model_info(ref.repo, revision=ref.revision, files_metadata=True)
        except HfHubHTTPError as exc:
            said = exc.response.headers.get("X-Error-Message", "") if exc.response else ""
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise HubRefused(f"{said} ({first})" if said else first) from exc
        except (OSError, httpx2.TransportError) as exc:
            raise HubUnreachable(f"cannot reach the hub at {self.endpoint}: {exc}") from exc
        if not info.sha:
            raise HubRefused(f"the hub at {self.endpoint} gave no commit for {ref}")
        sizes = [s.size for s in info.siblings or ()]
        known = bool(sizes) and all(size is not None for size in sizes)
        return Resolved(info.sha, sum(s or 0 for s in sizes) if known else None)


async def pin(model: CatalogModel, revisions: RevisionResolver | None) -> CatalogModel:
    """`model` with `weights_commit` (and `weights_bytes`) from the hub, for hub
    weights not pinned yet.

    `InvalidModel` (field weights) when the hub refuses the repo or revision;
    `HubUnavailable` when it cannot be reached. A commit given (`weights_commit`, or
    a full SHA in `weights`) is used as given, never refused: its size is asked
    for, and left unknown when the hub cannot say."""
    ref = hub_ref(model.weights)
    if ref is None:
        return model
    given = model.weights_commit or (ref.revision if ref.pinned else None)
    if given is not None:
        model = dataclasses.replace(model, weights_commit=given)
        if revisions is None or model.weights_bytes is not None:
            return model
        try:
            found = await revisions.commit(HubRef(ref.repo, given))
        except (HubRefused, HubUnreachable):
            return model
        return dataclasses.replace(model, weights_bytes=found.bytes)
    if revisions is None:
        return model
    try:
        found = await revisions.commit(ref)
    except HubRefused as exc:
        raise InvalidModel(
            f"model {model.name!r}, field 'weights': the hub refused {ref.repo!r} at "
            f"revision {ref.revision!r}: {exc.reason}; give an existing repo and revision "
            "(and HF_TOKEN on the server for a private one)",
            "weights",
        ) from exc
    except HubUnreachable as exc:
        raise HubUnavailable(
            f"model {model.name!r}: cannot resolve {ref} to a commit: {exc}; set "
            "HF_ENDPOINT on the server to a reachable hub or mirror, or give "
            "weights_commit in the model"
        ) from exc
    return dataclasses.replace(model, weights_commit=found.commit, weights_bytes=found.bytes)
