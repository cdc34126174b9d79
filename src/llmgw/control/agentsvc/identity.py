"""Who may register as a node: one key per node id, one live stream per node.

The servicer asks `IdentityGate.claim`, then `live_stream`, after the Register
is read and before the node touches the inventory, and gets a `Refused` (the
stream ends with that status and message) or lets it in; `claim` also answers
the id's `NodeBinding`, whose labels (its join token's) bind: `bind_labels`
gives the node those whatever its agent declares, adding only new keys.

- With a client certificate, the node id is claimed for the certificate's key
  (`NodeIdentities.claim`, the store): a revoked key is refused
  (PERMISSION_DENIED), an id that belongs to another key too (ALREADY_EXISTS);
  the node that owns the id stays connected, and an event is recorded.
- With or without one, a node id whose stream is alive is refused
  (ALREADY_EXISTS, naming the peer of the live stream) unless the Register
  comes with the key that owns the id: that is the node reconnecting, and the
  servicer closes the old stream, unless that key's streams keep replacing
  each other (two machines with one certificate: past `REPLACE_LIMIT` in
  `REPLACE_WINDOW_SECONDS` the live stream keeps the node). A live stream
  silent for `silent_after` seconds (several heartbeats) counts as dead, so a
  node whose old connection was never closed (its host rebooted) gets back in
  without waiting for keepalive to notice.

Every refusal tells the agent to set `--node-id`. Events for refusals are
recorded once per node id and refused party per `EVENT_REPEAT_SECONDS`, so an
agent retrying with backoff for hours does not flood the event list.

Not guaranteed: identity on a plaintext listener. Without a certificate
nothing proves who an agent is; the first stream for an id holds it while it
lives, and any client may take an id that is not connected.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import grpc

from llmgw.control.agentsvc.session import NodeSession
from llmgw.control.inventory.model import NodeRegistration
from llmgw.pki import PkiError
from llmgw.pki.keyhash import certificate_key_hash
from llmgw.store import Claim, InvalidValue, NodeBinding, StoreError

log = logging.getLogger("llmgw.control.agentsvc")

EVENT_REPEAT_SECONDS = 600.0
REPLACE_LIMIT = 3
REPLACE_WINDOW_SECONDS = 30.0
_MAX_NOTED = 1000  # refused parties remembered for event rate-limiting
_NODE_ID_HINT = (
    "two agents cannot share a node id: if this is another machine, start its agent with "
    "--node-id NAME (a name of its own)"
)


class NodeIdentities(Protocol):
    """Which key owns a node id; the store's `NodeIdentityRepository` satisfies it."""

    async def claim(self, node_id: str, key_hash: str, *, now: datetime) -> Claim: ...


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a Register is refused: the status, the message for the agent, the metric outcome."""

    code: grpc.StatusCode
    message: str
    outcome: str


def peer_key_hash(auth_context: Mapping[str, Iterable[bytes]]) -> str | None:
    """The key hash of the peer's verified client certificate; None on a plaintext stream."""
    pems = list(auth_context.get("x509_pem_cert", ()))
    if not pems:
        return None
    try:
        return certificate_key_hash(pems[0])
    except PkiError:
        # gRPC verified this certificate in the handshake; an unparsable one here
        # is a gRPC change, not an attacker. Fail the stream rather than treat it
        # as plaintext (the handler's error ends it with UNKNOWN).
        log.error("could not read the client certificate gRPC verified: %r", pems[0][:120])
        raise


def reserved_name_refusal(node_id: str, server_names: Collection[str]) -> str | None:
    """Why `node_id` may not name a node (it is one of the server's certificate names,
    compared as DNS names are: case-insensitively, without a final dot), or None."""
    if node_id.rstrip(".").lower() not in server_names:
        return None
    return (
        f"node id {node_id!r} is one of this server's own certificate names (agents identify "
        "the server by them, so no node may carry one): start the agent with --node-id NAME, "
        "a name of its own"
    )


def certificate_refusal(
    node_id: str, auth_context: Mapping[str, Iterable[bytes]], peer: str
) -> Refused | None:
    """Why a Register as `node_id` is refused when identity is required: the peer has no
    verified client certificate, or `node_id` is not one of its names; None when it is."""
    common = [v.decode(errors="replace") for v in auth_context.get("x509_common_name", ())]
    alternative = [
        v.decode(errors="replace") for v in auth_context.get("x509_subject_alternative_name", ())
    ]
    names = list(dict.fromkeys(common + alternative))
    if not names:
        # Only reachable when identity is required on a listener without
        # client certificates: a wiring mistake, not an attacker.
        log.warning(
            "refused node %r from %s: it presented no client certificate, and node "
            "identity is required",
            node_id,
            peer,
        )
        return Refused(
            grpc.StatusCode.UNAUTHENTICATED,
            "this server requires a client certificate naming the node; start the agent "
            "with --tls-ca/--tls-cert/--tls-key (certificates from `llmgw certs issue --node`)",
            "invalid",
        )
    if node_id in names:
        return None
    shown = names[0]
    log.warning(
        "refused an agent from %s: its certificate is for node %r (names: %s) but it "
        "registered as %r",
        peer,
        shown,
        ", ".join(names),
        node_id,
    )
    return Refused(
        grpc.StatusCode.PERMISSION_DENIED,
        f"certificate is for node {shown!r} but the agent registered as {node_id!r}; "
        f"a node registers under its certificate's name: start the agent with "
        f"--node-id {shown} (or without --node-id), or give it a certificate for "
        f"{node_id!r} (`llmgw certs issue --node {node_id}`)",
        "invalid",
    )


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _short(key_hash: str) -> str:
    return f"sha256:{key_hash[:16]}"


class IdentityGate:
    """Decides whether a Register may take its node id; see the module docstring."""

    def __init__(
        self,
        *,
        identities: NodeIdentities | None,
        silent_after: float,
        clock: Callable[[], float],
        wall_clock: Callable[[], datetime],
        record_event: Callable[[str, str], None] | None,
    ) -> None:
        self._identities = identities
        self._silent_after = silent_after
        self._clock = clock
        self._wall_clock = wall_clock
        self._record_event = record_event
        self._noted: dict[tuple[str, str], float] = {}
        self._replaced: dict[str, list[float]] = {}  # when each node's stream was replaced

    async def claim(
        self, node_id: str, key_hash: str | None, peer: str
    ) -> Refused | NodeBinding | None:
        """Claim `node_id` for the certificate's key in the store (awaits the store): a
        refusal, or the binding (with the labels it holds), or None without a key."""
        if key_hash is None or self._identities is None:
            return None
        try:
            claim = await self._identities.claim(node_id, key_hash, now=self._wall_clock())
        except InvalidValue as exc:
            return Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc), "invalid")
        except StoreError as exc:
            log.warning("could not check node %s's identity (from %s): %s", node_id, peer, exc)
            return Refused(
                grpc.StatusCode.UNAVAILABLE,
                f"the server could not check node {node_id!r}'s certificate against its store "
                f"({exc}); the agent retries",
                "unavailable",
            )
        if claim.outcome == "bound":
            log.info("node id %s now belongs to key %s", node_id, _short(key_hash))
        if claim.outcome == "revoked" and claim.revocation is not None:
            revoked = claim.revocation
            log.warning(
                "refused node %s from %s: its certificate's key %s was revoked at %s (%s)",
                node_id,
                peer,
                _short(key_hash),
                _when(revoked.revoked_at),
                revoked.reason,
            )
            return Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"node {node_id}'s certificate was revoked (llmgw nodes remove) at "
                f"{_when(revoked.revoked_at)}: {revoked.reason}; join again with a new token "
                "(`llmgw nodes token create`, then `llmgw agent --token TOKEN`)",
                "revoked",
            )
        if claim.outcome == "taken" and claim.binding is not None:
            owner = claim.binding
            message = (
                f"node id {node_id!r} belongs to another certificate "
                f"(key {_short(owner.key_hash)}, first seen {_when(owner.bound_at)}, "
                f"last seen {_when(owner.last_seen_at)}); "
                f"this agent's certificate (key {_short(key_hash)}) cannot take it. "
                f"{_NODE_ID_HINT}; if it is this node with a new certificate, remove the old "
                f"one first: llmgw nodes remove {node_id}"
            )
            log.warning("refused an agent from %s: %s", peer, message)
            self._note(
                node_id,
                key_hash,
                f"refused an agent from {peer} registering as {node_id}: the id belongs to "
                f"another certificate (key {_short(owner.key_hash)}, since "
                f"{_when(owner.bound_at)}); the node keeps its id",
            )
            return Refused(grpc.StatusCode.ALREADY_EXISTS, message, "taken")
        return claim.binding

    def bind_labels(
        self, registration: NodeRegistration, binding: NodeBinding | None, peer: str
    ) -> NodeRegistration:
        """`registration` with the labels and fabric labels its binding holds: the agent's
        own may add keys, never change these (a change is logged, and noted as an event)."""
        if binding is None or (binding.labels is None and binding.fabric is None):
            return registration
        bound_labels, bound_fabric = binding.labels or {}, binding.fabric or {}
        changed = [
            f"{kind} {key}={declared[key]} (its join token fixes {key}={value})"
            for kind, declared, bound in (
                ("label", registration.labels, bound_labels),
                ("fabric label", registration.fabric, bound_fabric),
            )
            for key, value in sorted(bound.items())
            if key in declared and declared[key] != value
        ]
        if changed:
            message = (
                f"node {registration.node_id} (from {peer}) declared {'; '.join(changed)}: "
                "it keeps its token's values"
            )
            log.warning("%s", message)
            self._note(registration.node_id, "labels", message)
        return dataclasses.replace(
            registration,
            labels={**registration.labels, **bound_labels},
            fabric={**registration.fabric, **bound_fabric},
        )

    def live_stream(
        self, node_id: str, key_hash: str | None, peer: str, live: NodeSession | None
    ) -> Refused | None:
        """Refuse a Register for a node whose stream is alive, unless it is that node.

        Synchronous: the servicer opens the session right after, with no await
        in between, so two Registers cannot both pass.
        """
        if live is None:
            return None
        silent = self._clock() - live.last_heard
        # Its agent was told a longer interval in a big fleet: it is silent for longer.
        silent_after = self._silent_after * live.beat_factor
        if key_hash is not None and (self._identities is not None or live.key_hash == key_hash):
            # The node reconnecting (the servicer closes the old stream): its key
            # is the live stream's, or the store just said the id is this key's
            # (after a renewal with a new key, the old stream has the old one).
            return self._reconnect(node_id, peer, live, silent)
        if silent >= silent_after:
            log.warning(
                "node %s registered from %s while its stream from %s was open but silent "
                "for %.0f s; treating the old stream as dead",
                node_id,
                peer,
                live.peer,
                silent,
            )
            return None
        message = (
            f"node id {node_id!r} is in use: an agent is connected under it from {live.peer} "
            f"(its last message {silent:.0f} s ago). {_NODE_ID_HINT}; if it is this node "
            f"restarting, it gets in once the old stream closes (at most {silent_after:g} s)"
        )
        log.warning("refused an agent from %s: %s", peer, message)
        self._note(
            node_id,
            _host(peer) if key_hash is None else key_hash,
            f"refused an agent from {peer} registering as {node_id}: the node is connected "
            f"from {live.peer} and keeps its stream",
        )
        return Refused(grpc.StatusCode.ALREADY_EXISTS, message, "in_use")

    def _reconnect(
        self, node_id: str, peer: str, live: NodeSession, silent: float
    ) -> Refused | None:
        """Let the node's key replace its live stream, unless two agents hold that key.

        Two machines with one certificate (a copied state directory) would each
        replace the other's stream at once, forever; a node that really
        reconnects does so a few times at most. Past `REPLACE_LIMIT` replacements
        in `REPLACE_WINDOW_SECONDS`, a live, talking stream keeps the node.
        """
        now = self._clock()
        recent = [t for t in self._replaced.get(node_id, ()) if now - t < REPLACE_WINDOW_SECONDS]
        if len(recent) < REPLACE_LIMIT or silent >= self._silent_after * live.beat_factor:
            self._replaced[node_id] = [*recent, now]
            return None
        self._replaced[node_id] = recent
        message = (
            f"node {node_id!r} is connected with this certificate from {live.peer} (its last "
            f"message {silent:.0f} s ago), and its streams replaced each other {len(recent)} "
            f"times within {REPLACE_WINDOW_SECONDS:g} s: two agents share this node's "
            "certificate (a copied state directory?). Give each machine its own: join the "
            "other with a new token and --node-id NAME"
        )
        log.warning("refused an agent from %s: %s", peer, message)
        self._note(
            node_id,
            _host(peer),
            f"refused an agent from {peer} registering as {node_id} with the node's own "
            f"certificate: the node's streams keep replacing each other (connected from "
            f"{live.peer}); two machines share its certificate",
        )
        return Refused(grpc.StatusCode.ALREADY_EXISTS, message, "in_use")

    def _note(self, node_id: str, who: str, message: str) -> None:
        """Record an event, once per node id and refused party per EVENT_REPEAT_SECONDS."""
        if self._record_event is None:
            return
        now = self._clock()
        noted = self._noted.get((node_id, who))
        if noted is not None and now - noted < EVENT_REPEAT_SECONDS:
            return
        if len(self._noted) >= _MAX_NOTED:
            self._noted = {k: t for k, t in self._noted.items() if now - t < EVENT_REPEAT_SECONDS}
        self._noted[(node_id, who)] = now
        self._record_event(node_id, message)


def _host(peer: str) -> str:
    """The address of a gRPC peer ("ipv4:10.0.0.5:51234") without its port."""
    return peer.rpartition(":")[0] or peer
