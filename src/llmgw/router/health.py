"""Active health probes of every endpoint.

Each round probes all endpoints concurrently with `GET <url><health_path>`;
a 2xx answer within the probe timeout is healthy, anything else is not, except
a timeout while the endpoint has requests in flight (a busy engine is not a
dead one). Passive
ejection (request failures) lives on `Endpoint`; a passing probe does not
lift an ejection early, since a probe is cheaper than a real request.
Not guaranteed: probes are spread over the interval only by their start time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from llmgw.router.endpoints import Endpoint, EndpointPool
from llmgw.router.upstream import Upstream, UpstreamError

log = logging.getLogger("llmgw.router.health")


class HealthProber:
    def __init__(
        self,
        *,
        pool: EndpointPool,
        upstream: Upstream,
        interval: float,
        timeout: float,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._pool = pool
        self._upstream = upstream
        self._interval = interval
        self._timeout = timeout
        self._sleep = sleep
        self.rounds = 0

    async def run(self) -> None:
        """Probe forever; the first round starts at once."""
        while True:
            await self.probe_all()
            await self._sleep(self._interval)

    async def probe_all(self) -> None:
        endpoints = self._pool.endpoints()
        if endpoints:
            await asyncio.gather(*(self._probe(ep) for ep in endpoints))
        self.rounds += 1

    async def _probe(self, endpoint: Endpoint) -> None:
        error, timed_out = await self._check(endpoint.url, endpoint.health_path)
        if timed_out and endpoint.in_flight > 0:
            # Busy, not dead: llama.cpp's server answers /v1/models only between
            # generations. Requests in flight fail on their own if it is dead.
            log.debug("endpoint %s probe timed out while serving; not counted", endpoint.id)
            return
        ok = error is None
        if ok != endpoint.probe_ok:
            if ok:
                log.info("endpoint %s is healthy again", endpoint.id)
            else:
                log.warning(
                    "endpoint %s at %s failed its health probe: %s",
                    endpoint.id,
                    endpoint.url,
                    error,
                )
        endpoint.probe_ok = ok
        if error is not None:
            endpoint.last_error = f"probe: {error}"

    async def _check(self, base_url: str, path: str) -> tuple[str | None, bool]:
        """(error or None, whether it timed out). The error names the path, not the
        address: it becomes the endpoint's `last_error`, which clients may read in a
        503 (the admin API shows the URL beside it)."""
        url = "GET " + path
        try:
            async with asyncio.timeout(self._timeout):
                resp = await self._upstream.request(b"GET", base_url, path)
                try:
                    await resp.read()
                finally:
                    resp.release()
        except TimeoutError:
            return f"{url} timed out after {self._timeout:g}s", True
        except UpstreamError as exc:
            return f"{url} failed: {exc}", False
        if 200 <= resp.status < 300:
            return None, False
        return f"{url} answered {resp.status}", False
