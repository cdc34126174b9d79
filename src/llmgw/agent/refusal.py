"""Why a control-plane address refused this agent, in words an operator can act on.

gRPC reports every failure to connect as UNAVAILABLE with a free-text detail.
`explain` recognises the ones that need a person (TLS on one side only, a
certificate the other side does not accept, a node id the server refuses or
that another agent holds) or that are routine in a cluster (a standby naming
its leader), and turns them into one sentence that says what happened and
what to do. The patterns are what grpcio 1.6x-1.8x reports; an unrecognised
failure keeps gRPC's own text.

Not guaranteed: the diagnosis. A plaintext agent and an agent whose
certificate the server rejects both see only "Socket closed"; the message
says "probably".
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import grpc

# Trailing metadata the control plane sends with an admission refusal (the
# server's agentsvc.servicer.REFUSED_METADATA_KEY; the two packages share no code).
REFUSED_METADATA_KEY = "llmgw-refused"
REFUSED_STANDBY = "standby"
# A leader pacing a registration storm: come back after this many milliseconds.
REFUSED_BUSY = "busy"
RETRY_AFTER_METADATA_KEY = "llmgw-retry-after-ms"
# The longest wait a server's answer is obeyed for (a bad value is not a day's sleep).
MAX_RETRY_AFTER_S = 300.0

_VERIFY = re.compile(r"CERTIFICATE_VERIFY_FAILED: ([^:]+)")
TLS_FLAGS = "--tls-ca/--tls-cert/--tls-key"
NODE_ID_HINT = "give this agent a node id of its own with --node-id NAME"


@dataclass(frozen=True, slots=True)
class Refusal:
    """`message` names the address; `notable` when it deserves a warning of its own."""

    message: str
    notable: bool


def is_standby(metadata: Iterable[tuple[str, object]] | None) -> bool:
    """Whether the trailing metadata marks an admission refusal (a standby)."""
    return any(
        key == REFUSED_METADATA_KEY and value in (REFUSED_STANDBY, REFUSED_STANDBY.encode())
        for key, value in metadata or ()
    )


def retry_after(metadata: Iterable[tuple[str, object]] | None) -> float | None:
    """Seconds a busy server told this agent to wait before registering again, or None
    when the refusal was not a busy server's (or its delay is unreadable)."""
    pairs = [(key, value) for key, value in metadata or ()]
    if not any(
        key == REFUSED_METADATA_KEY and value in (REFUSED_BUSY, REFUSED_BUSY.encode())
        for key, value in pairs
    ):
        return None
    for key, value in pairs:
        if key != RETRY_AFTER_METADATA_KEY:
            continue
        text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
        try:
            milliseconds = int(text)
        except ValueError:
            return None
        return min(max(milliseconds, 0) / 1000, MAX_RETRY_AFTER_S)
    return None


def explain(
    address: str, code: grpc.StatusCode, details: str, *, tls: bool, standby: bool
) -> Refusal:
    """One sentence for a failure before `Registered`; see the module docstring."""
    host = address.rpartition(":")[0].strip("[]")
    # Told by the metadata, not by the text: a transport error's text may name a
    # host called "standby-1" too.
    if standby:
        return Refusal(f"{address} is a standby: {details}", notable=True)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        # A busy leader (many nodes registering at once) said when to come back.
        return Refusal(f"the server at {address} is busy: {details}", notable=True)
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        return Refusal(f"the server at {address} refused this agent: {details}", notable=True)
    if code == grpc.StatusCode.ALREADY_EXISTS:
        # Another agent holds this node id; the connection loop backs off.
        hint = "" if "--node-id" in details else f"; {NODE_ID_HINT}"
        return Refusal(
            f"the server at {address} refused this agent's node id: {details}{hint}",
            notable=True,
        )
    if code != grpc.StatusCode.UNAVAILABLE:
        return Refusal(f"{address}: {code.name}: {details}" if details else code.name, False)
    if "Socket closed" in details or "Connection reset" in details:
        if not tls:
            return Refusal(
                f"the server at {address} refused the connection; it probably requires TLS: "
                "join this node with --token TOKEN (`llmgw nodes token create` on the server "
                "makes one; the server also prints one at start-up), or start the agent with "
                f"{TLS_FLAGS} and certificates of your own",
                notable=True,
            )
        return Refusal(
            f"the server at {address} closed the connection during the TLS handshake; it "
            "probably does not accept this agent's certificate (issued by another CA, or not a "
            "node certificate): use a certificate from `llmgw certs issue --node NAME` with the "
            "server's CA",
            notable=True,
        )
    if tls and "WRONG_VERSION_NUMBER" in details:
        return Refusal(
            f"the server at {address} does not speak TLS (its agent listener is plaintext): "
            f"configure agent_tls on the server, or start the agent without {TLS_FLAGS}",
            notable=True,
        )
    if tls and "Hostname Verification Check failed" in details:
        return Refusal(
            f"the certificate of the server at {address} is not valid for {host!r}: dial a "
            f"name it carries, or reissue it with `llmgw certs issue --server {host}`",
            notable=True,
        )
    if tls and (match := _VERIFY.search(details)):
        return Refusal(
            f"the server at {address} presented a certificate that --tls-ca does not accept "
            f"({match.group(1).strip()}): the server's agent_tls.cert must come from `llmgw "
            f"certs issue --server {host}` with the same CA as this agent's",
            notable=True,
        )
    return Refusal(f"{address}: {code.name}: {details}" if details else code.name, False)
