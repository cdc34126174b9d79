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

Not guaranteed: that the commit is still downloadable later (a force-pushed
branch can drop it), or that the repo holds weights an engine can load.
Models in the config file are not resolved (the server may start without
the hub): their nodes download the revision as written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from llmgw.config.hub import HubRef


class HubRefused(Exception):
    """The hub answered: no such repo, revision, or no access. `reason` is its words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class HubUnreachable(Exception):
    """The hub did not answer (connection refused, DNS, timeout)."""


class RevisionResolver(Protocol):
    """Turns a hub reference into the commit SHA its revision names now."""

    async def commit(self, ref: HubRef) -> str: ...


@dataclass(frozen=True, slots=True)
class HubRevisions:
    """`RevisionResolver` over the hub API (`GET /api/models/{repo}/revision/{rev}`)."""

    environ: Mapping[str, str]

    @property
    def endpoint(self) -> str:
        return self.environ.get("HF_ENDPOINT") or "https://huggingface.co"

    async def commit(self, ref: HubRef) -> str:
        return await asyncio.to_thread(self._commit, ref)

    def _commit(self, ref: HubRef) -> str:
        import httpx2
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError

        api = HfApi(endpoint=self.endpoint, token=self.environ.get("HF_TOKEN") or False)
        try:
            info = api.model_info(ref.repo, revision=ref.revision)
        except HfHubHTTPError as exc:
            said = exc.response.headers.get("X-Error-Message", "") if exc.response else ""
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise HubRefused(f"{said} ({first})" if said else first) from exc
        except (OSError, httpx2.TransportError) as exc:
            raise HubUnreachable(f"cannot reach the hub at {self.endpoint}: {exc}") from exc
        if not info.sha:
            raise HubRefused(f"the hub at {self.endpoint} gave no commit for {ref}")
        return info.sha
