"""Whether a node's report of a shard may be believed: a pure function of the report,
the placement record and where the node is.

`vet(node_id, report, placement, where)` answers a `Verdict`:

- No record of that shard on *that* node: refused, "node X reported shard S of
  model M that was never placed there; not served". The inventory never sees
  it, and the node is told to stop it. A report that says nothing runs
  (stopped or failed) is dropped without a word: its record went when the
  shard ended, and agents repeat their last statuses when they register.
- A record for another model: refused the same way, naming both models.
- A recorded shard whose `endpoint_url` is not where the node is: refused,
  naming the URL and why; the inventory gets it as *failed* (so the reconciler
  backs off and places it again) and the node is told to stop it. An endpoint
  is where the node is when its scheme is http or https, it has no
  credentials, path, query or fragment, its host is the node's advertised
  address (the address its stream comes from, for an agent that advertises
  none) or, for a shard of a multi-node replica, one of the node's management
  addresses (the rendezvous address of rank 0, an address on one of its
  interfaces), that host is not an unspecified, multicast or link-local
  address, nor a loopback address unless the node runs on the server's own
  host (else the servers would dial themselves), and its port is the port the
  shard was placed on and inside the node's port range.
- Otherwise believed, with the model and the spec taken from the record: what
  a node says about its engine's command line, GPUs, rank or port does not
  reach placement or routing.

Not guaranteed: that the advertised address is honest. An agent chooses it
(`--advertise-host`); a node's certificate can still make the routers dial an
address of its choosing, on a port the leader gave it in the port range the
node declared. Link-local addresses (cloud metadata services) are refused, and
so is loopback from a node on another host. An engine started before its
agent's advertised address changed (the agent now reaches the servers over
another network) keeps its old URL: it is refused and placed again.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Literal

from llmgw.control.inventory.model import (
    TERMINAL_SHARD_STATES,
    NetInterface,
    ShardReport,
    is_loopback,
)
from llmgw.control.placements.model import Placement

RefusalKind = Literal["unplaced", "model", "endpoint"]


@dataclass(frozen=True, slots=True)
class NodeAddress:
    """Where a node is, as its Register said and its stream shows."""

    advertise_host: str
    seen_from: str
    port_range: tuple[int, int]
    interfaces: tuple[NetInterface, ...] = ()
    # The node runs on this server's host (its stream comes from loopback or from
    # one of this host's addresses): its engines may be on loopback.
    same_host: bool = False

    @property
    def host(self) -> str:
        """The host its engine URLs must name: the advertised one, else the stream's."""
        return _bare(self.advertise_host or self.seen_from)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with one report: `report` goes to the inventory (None: nothing does);
    `refused` says why it was not believed (None: it was); `stop`: tell the node to
    stop the shard."""

    report: ShardReport | None
    refused: str | None = None
    kind: RefusalKind | None = None
    stop: bool = False


def vet(
    node_id: str, report: ShardReport, placement: Placement | None, where: NodeAddress
) -> Verdict:
    """The verdict on `report` from `node_id`; see the module docstring."""
    running = report.state not in TERMINAL_SHARD_STATES
    model = report.model or (placement.model if placement is not None else "")
    if (placement is None or placement.node_id != node_id) and not running:
        # Nothing runs: a shard whose record went when it ended, reported once more
        # (an agent repeats its last statuses when it registers again). Nothing to do.
        return Verdict(None)
    if placement is None or placement.node_id != node_id:
        return Verdict(
            None,
            f"node {node_id} reported shard {report.shard_id} of model {model or '(none)'} "
            "that was never placed there; not served",
            "unplaced",
            stop=running,
        )
    if report.model and report.model != placement.model:
        return Verdict(
            None,
            f"node {node_id} reported shard {report.shard_id} of model {report.model}, but it "
            f"was placed there for model {placement.model}; not served",
            "model",
            stop=running,
        )
    believed = replace(report, model=placement.model, spec=placement.spec)
    if not running or not report.endpoint_url:
        return Verdict(believed)
    problem = endpoint_problem(report.endpoint_url, placement, where)
    if problem is None:
        return Verdict(believed)
    reason = (
        f"node {node_id} reported shard {report.shard_id} of model {placement.model} at "
        f"{report.endpoint_url}, which is not where the node is: {problem}; not served"
    )
    failed = replace(believed, state="failed", message=reason, endpoint_url="", exit_code=None)
    return Verdict(failed, reason, "endpoint", stop=True)


def endpoint_problem(url: str, placement: Placement, where: NodeAddress) -> str | None:
    """Why `url` is not an engine of `placement` on the node at `where`, or None."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return "it is not a URL with a valid port"
    if parts.scheme not in ("http", "https"):
        return "its scheme is not http or https"
    if parts.username is not None or parts.password is not None:
        return "it carries credentials"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "it carries a path, query or fragment"
    host = _bare(parts.hostname or "")
    allowed = _allowed_hosts(placement, where)
    if host not in allowed:
        return f"its host {host or '(none)'} is not the node's address ({where.host or 'none'})"
    if _special(host):
        return f"its host {host} is an unspecified, multicast or link-local address"
    if is_loopback(host) and not where.same_host:
        return (
            f"its host {host} is a loopback address but the node connects from "
            f"{where.seen_from or 'another host'}, so the servers would dial themselves "
            "(start its agent without --advertise-host, or with an address the servers can "
            "dial)"
        )
    if port is None or port != placement.port:
        return f"its port {port} is not the port the shard was placed on ({placement.port})"
    low, high = where.port_range
    if not low <= port <= high:
        return f"its port {port} is outside the node's port range {low}-{high}"
    return None


def _allowed_hosts(placement: Placement, where: NodeAddress) -> Collection[str]:
    allowed = {where.host} if where.host else set()
    spec = placement.spec
    if spec.nodes > 1:
        # The ranks of a multi-node replica talk over the management network.
        if spec.node_rank == 0 and spec.master_addr:
            allowed.add(_bare(spec.master_addr))
        allowed.update(
            _bare(cidr.split("/", 1)[0]) for i in where.interfaces for cidr in i.addresses
        )
    return allowed


def _bare(host: str) -> str:
    """A host as compared: lower case, without IPv6 brackets, a zone or a final dot."""
    bare = host.strip().strip("[]").rstrip(".").lower()
    try:
        return str(ipaddress.ip_address(bare.split("%", 1)[0]))
    except ValueError:
        return bare


def _special(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_unspecified or address.is_multicast or address.is_link_local
