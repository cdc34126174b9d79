"""Which control-plane servers just let a dial time out, so the agent tries them last.

A server that accepts TCP and then answers nothing (a frozen process, a host
behind a black-holing firewall, a half-dead VM) costs a whole dial timeout
each time it is dialled, where a dead one refuses at once. The agent dials in
three places: joining (`agent_join.obtain`), the connection loop, and
certificate renewal. They share one `SilentServers`, built in the composition
root, so a server that timed out in one is dialled last by the others: an
agent whose list starts with a silent server waits one dial timeout on it, not
one per step (it used to wait on it to join, then again to connect).

A silent server is remembered for `remember_for` seconds after its last time
out, or until it answers; meanwhile it keeps its place among the other silent
ones and is still dialled when everything before it failed, so a list of
nothing but silent servers is dialled as before.

Not guaranteed: anything across agent restarts (the memory is in the process);
a time out is counted as silence whatever its cause (a server busy for longer
than the dial timeout is demoted too, for a while).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

log = logging.getLogger("llmgw.agent")

REMEMBER_SECONDS = 300.0


class SilentServers:
    """Addresses whose last dial timed out, and when."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        remember_for: float = REMEMBER_SECONDS,
    ) -> None:
        self._clock = clock
        self._remember_for = remember_for
        self._since: dict[str, float] = {}

    def timed_out(self, address: str) -> None:
        """A dial to `address` got no answer within its timeout."""
        if address not in self._since:
            log.info(
                "the control plane at %s accepted the connection but did not answer: "
                "trying it after the other servers for the next %gs",
                address,
                self._remember_for,
            )
        self._since[address] = self._clock()

    def answered(self, address: str) -> None:
        """`address` answered (whatever the answer): it is not silent."""
        self._since.pop(address, None)

    def is_silent(self, address: str) -> bool:
        since = self._since.get(address)
        if since is None:
            return False
        if self._clock() - since > self._remember_for:
            del self._since[address]
            return False
        return True

    def order(self, addresses: Sequence[str]) -> list[str]:
        """`addresses` in the same order, silent ones moved to the end."""
        return sorted(addresses, key=self.is_silent)
