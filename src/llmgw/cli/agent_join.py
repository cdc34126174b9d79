"""The agent's node certificate from the cluster CA: join with a token once, then reuse it.

`stored_credentials` reads `<state-dir>/tls/` at flag time (the node id comes
from the certificate). `obtain` returns the credentials the agent dials with:
the stored ones while their certificate is valid (a `--token` given again is
ignored, with an info line), otherwise a fresh Join with the token, trying each
server address (one that just timed out last: `silent`, shared with the
connection loop) and retrying transient failures with backoff; a refusal a person
must act on (the token is expired, revoked or used up, the server is not the
token's cluster, the node id is another node's) raises `EnrollError` for the
command to print as its `error:` line. A revoked token fails in the TLS
handshake, which a token too new for that server does too: that refusal is
retried for a few seconds (`TOKEN_REFUSED_PASSES`) before it is final. A node
whose certificate expired joins again with its existing key, so the node id
stays bound to it.

Not guaranteed: that a Join interrupted after the server issued the certificate
is not counted as a use of the token.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from llmgw.agent.backoff import Backoff
from llmgw.agent.enroll import EnrollError, NodeCredentials, TlsStore, describe_expiry, join
from llmgw.agent.silence import SilentServers
from llmgw.pki.cluster import JoinToken

log = logging.getLogger("llmgw.agent")

# Passes in a row in which the servers refused the token's certificate in the
# handshake before the agent gives up, at least REFUSED_RETRY_SECONDS apart:
# together longer than a server takes to learn a token made on another (2 s).
TOKEN_REFUSED_PASSES = 4
REFUSED_RETRY_SECONDS = 1.0


def stored_credentials(state_dir: Path) -> NodeCredentials | None:
    """The node's stored credentials, or None when it has not joined."""
    return TlsStore(state_dir).load()


async def obtain(
    *,
    state_dir: Path,
    addresses: Sequence[str],
    token: JoinToken | None,
    node_id: str,
    silent: SilentServers,
    dial_seconds: float,
) -> NodeCredentials:
    """Valid credentials for this node: the stored ones, or new ones from a Join."""
    store = TlsStore(state_dir)
    stored = await asyncio.to_thread(store.load)
    now = datetime.now(UTC)
    if stored is not None and stored.not_after > now:
        if token is not None:
            log.info(
                "ignoring --token: this node joined as %s and its certificate in %s is valid "
                "until %s (it renews itself)",
                stored.node_id,
                store.directory,
                describe_expiry(stored),
            )
        return stored
    if token is None:
        assert stored is not None
        raise EnrollError(
            f"this node's certificate in {store.directory} expired at "
            f"{describe_expiry(stored)}: join again with --token TOKEN (`llmgw nodes token "
            "create` on the server makes one)",
            final=True,
        )
    key = await asyncio.to_thread(store.load_key)
    backoff = Backoff(rng=random.Random())
    refused_passes = 0
    while True:
        failures = []
        refused: EnrollError | None = None
        for address in silent.order(addresses):
            try:
                creds = await join(
                    address,
                    token,
                    node_id=node_id,
                    now=datetime.now(UTC),
                    key=key,
                    dial_seconds=dial_seconds,
                )
            except EnrollError as exc:
                if exc.final:
                    raise
                if exc.timed_out:
                    silent.timed_out(address)
                else:
                    silent.answered(address)
                failures.append(str(exc))
                if exc.token_refused:
                    refused = exc
                continue
            silent.answered(address)
            await asyncio.to_thread(store.save, creds)
            log.info(
                "joined the cluster through %s as node %s; certificate valid until %s, kept in %s",
                address,
                creds.node_id,
                describe_expiry(creds),
                store.directory,
            )
            return creds
        # Every server that answered refused the token in the handshake, pass after
        # pass: past the few seconds a new token takes to reach every server, that
        # is a revoked (or long expired) token, and a person must make a new one.
        refused_passes = refused_passes + 1 if refused is not None else 0
        if refused is not None and refused_passes >= TOKEN_REFUSED_PASSES:
            raise EnrollError(str(refused), final=True)
        delay = max(backoff.next_delay(), REFUSED_RETRY_SECONDS if refused is not None else 0.0)
        log.warning("cannot join yet (%s); retrying in %.1fs", "; ".join(failures), delay)
        await asyncio.sleep(delay)
