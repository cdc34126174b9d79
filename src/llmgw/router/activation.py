"""`Activator`: how the router asks for a model that has no ready replica.

The router never imports the control plane; the control plane implements this
Protocol (through an adapter in the composition root) and the proxy calls it.
In router-only mode there is no activator and unknown models are a 404.

Not guaranteed: that activation is fast. A caller waits for an engine to load;
the proxy keeps streaming clients alive with SSE comments meanwhile.
"""

from __future__ import annotations

from typing import Protocol


class Activator(Protocol):
    def knows(self, model: str) -> bool:
        """Whether `model` may be started on request (it is in the catalog)."""
        ...

    def engines(self, model: str) -> tuple[str, ...]:
        """The engines `model`'s profiles run (empty when it is not in the catalog), so
        a request for a route none of them serves is refused without starting one."""
        ...

    async def activate(self, model: str) -> None:
        """Return once `model` has a ready replica in the pool; raise
        `llmgw.router.errors.ModelUnavailable` (with the reason) otherwise."""
        ...

    def activity(self, model: str) -> str:
        """What a request waiting for `model` waits on, said in its keep-alive comments
        (`: llmgw ACTIVITY`): e.g. "is starting model M", "waking model M (replica R)"."""
        ...

    def request_started(self, model: str) -> None:
        """A request for `model` began (keeps the model from being scaled down)."""
        ...

    def request_finished(self, model: str) -> None:
        """A request for `model` ended; its idle time counts from now."""
        ...

    def saturated(self, model: str) -> None:
        """A request for `model` found every replica serving it full, so the control
        plane may add room (an adapter: load it on one more replica of its base).
        Returns at once; whatever it starts does not hold the request back."""
        ...
