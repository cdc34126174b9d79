"""Separate network stacks for tests: a Linux bridge and network namespaces, one per host.

`build_network(hosts=N)` makes, in the root namespace, a bridge with the address
10.A.B.1/24 (a /24 drawn at random in 10.77.0.0-10.99.255.0 that no interface of
this machine uses, so parallel runs do not collide), and N network namespaces,
each with loopback up and one veth (`eth0` inside) into the bridge at 10.A.B.2,
.3, ... Nothing is reachable through 127.0.0.1 across namespaces: a server in
the root namespace that agents must reach listens on `network.gateway`, and an
engine in a namespace is reached at that namespace's address.

`build_network(hosts, extra_networks=N)` adds N more bridges with /24s of
their own that every host joins as eth1, eth2, ... (a management network apart
from the one the server is on); a test module sets `NETNS_HOSTS` and
`NETNS_EXTRA_NETWORKS` to shape the shared fixture.

`Host.spawn(argv)` starts a process (a real `llmgw agent`) inside a namespace
with `ip netns exec`; its children (the engines) run there too. Teardown runs on
every exit path of the fixture (and of `build_network` used as a context
manager): every process in each namespace is killed first (`ip netns pids`,
which also finds engines that outlived their agent), then the namespaces (their
veth ends go with them), then the bridge. Partial set-ups are undone the same
way. Leftovers of a test run that was itself SIGKILLed are removed by the next
run: each bridge carries the alias `llmgw-test-<pid>` of the pytest process that
made it, and namespaces are named after it.

The fixtures need root and the `ip` tool (iproute2). Where either is missing,
or a namespace cannot be made, the test FAILS with the reason; it never skips.

Not guaranteed: any traffic control (latency, loss); IPv6 (addresses are IPv4).
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pytest
from procs import Proc

ALIAS_PREFIX = "llmgw-test-"
NS_PREFIX = "llmgwt"


class NetnsError(RuntimeError):
    """The virtual network could not be built; the message says why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], check=False, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {done.stderr.strip() or done.returncode}")
    return done


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def require_netns() -> None:
    """Raise NetnsError naming what is missing for namespaces on this machine."""
    if os.geteuid() != 0:
        raise NetnsError(
            "network-namespace tests must run as root (they create namespaces, veths and a "
            f"bridge); this is uid {os.geteuid()}"
        )
    if shutil.which("ip") is None:
        raise NetnsError(
            "the `ip` tool is missing (install iproute2: apt-get install -y iproute2); "
            "network-namespace tests need it"
        )


def _kill_namespace_processes(namespace: str) -> None:
    """SIGKILL every process in `namespace` and wait (a few seconds) until none is left."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        listed = _ip("netns", "pids", namespace, check=False)
        pids = [int(p) for p in listed.stdout.split() if p.isdigit()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def remove_stale() -> None:
    """Remove namespaces and bridges left by test runs whose pytest process is gone."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    for line in listed:
        name = line.split(" ", 1)[0]
        if not name.startswith(NS_PREFIX):
            continue
        owner = name[len(NS_PREFIX) :].split("-", 1)[0]
        if owner.isdigit() and not _pid_alive(int(owner)):
            _kill_namespace_processes(name)
            _ip("netns", "del", name, check=False)
    links = _ip("-o", "link", "show", "type", "bridge", check=False).stdout
    for line in links.splitlines():
        parts = line.split()
        if "alias" not in parts or len(parts) < 2:
            continue
        alias = parts[parts.index("alias") + 1]
        owner = alias[len(ALIAS_PREFIX) :] if alias.startswith(ALIAS_PREFIX) else ""
        if owner.isdigit() and not _pid_alive(int(owner)):
            _ip("link", "del", parts[1].rstrip(":").split("@")[0], check=False)


def _free_subnet() -> tuple[int, int]:
    used = _ip("-o", "-4", "addr", "show", check=False).stdout
    for _ in range(500):
        a, b = random.randint(77, 99), random.randint(0, 255)
        if f" 10.{a}.{b}." not in used:
            return a, b
    raise NetnsError("no free /24 in 10.77.0.0-10.99.255.0 for a test network")


@dataclass
class Host:
    """One network namespace: its name, its address on the bridge, its veth."""

    namespace: str
    address: str
    veth: str  # the end in the root namespace (on the bridge)
    procs: list[Proc] = field(default_factory=list)
    # On each extra network (`build_network(extra_networks=N)`): the address of its
    # interface (`eth1`, `eth2`, ...) and the veth end on that network's bridge.
    extra_addresses: list[str] = field(default_factory=list)
    extra_veths: list[str] = field(default_factory=list)

    def argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` wrapped to run inside this namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def spawn(self, argv: Sequence[str], *, env: dict[str, str] | None = None) -> Proc:
        """Start `argv` in this namespace; stopped at teardown if still running."""
        proc = Proc(self.argv(argv), env=env)
        self.procs.append(proc)
        return proc

    def run(
        self, argv: Sequence[str], *, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` in this namespace to completion."""
        return subprocess.run(
            self.argv(argv), capture_output=True, text=True, timeout=timeout, check=False
        )

    def link_down(self, network: int = 0) -> None:
        """Cut this host off a network (0: the main one; its veth end on the bridge goes down)."""
        _ip("link", "set", self._veth(network), "down")

    def link_up(self, network: int = 0) -> None:
        _ip("link", "set", self._veth(network), "up")

    def _veth(self, network: int) -> str:
        return self.veth if network == 0 else self.extra_veths[network - 1]

    def kill_all(self) -> None:
        """SIGKILL every process in this namespace (agents and the engines they started)."""
        for proc in self.procs:
            proc.stop(timeout=0.5)
        _kill_namespace_processes(self.namespace)
        self.procs.clear()


@dataclass
class Network:
    """A bridge at `gateway` in the root namespace and hosts on it."""

    bridge: str
    gateway: str  # the bridge's address: where a root-namespace server listens
    prefix: str  # "10.A.B."
    hosts: list[Host]
    # Extra networks (bridge, its address, prefix): links between the hosts only
    # (e.g. a management network), separate from the one the server is on.
    extra: list[tuple[str, str, str]] = field(default_factory=list)

    def reset(self) -> None:
        """After a test: kill the hosts' processes and bring every link back up."""
        for host in self.hosts:
            host.kill_all()
            for network in range(1 + len(host.extra_veths)):
                with contextlib.suppress(NetnsError):
                    host.link_up(network)

    def teardown(self) -> None:
        for host in self.hosts:
            with contextlib.suppress(Exception):
                host.kill_all()
        for host in self.hosts:
            _ip("netns", "del", host.namespace, check=False)
            # Already gone with their peers, usually.
            for veth in (host.veth, *host.extra_veths):
                _ip("link", "del", veth, check=False)
        for bridge in (self.bridge, *(extra[0] for extra in self.extra)):
            _ip("link", "del", bridge, check=False)


def _make_host(network: Network, index: int, tag: str) -> None:
    namespace = f"{NS_PREFIX}{os.getpid()}-{tag}-{index}"
    veth = f"vl{tag}{index}"
    host = Host(namespace=namespace, address=f"{network.prefix}{index + 2}", veth=veth)
    # Recorded before it exists: teardown tolerates what was never made.
    network.hosts.append(host)
    _ip("netns", "add", namespace)
    _ip("-n", namespace, "link", "set", "lo", "up")
    _ip("link", "add", veth, "type", "veth", "peer", "name", f"vp{tag}{index}")
    _ip("link", "set", f"vp{tag}{index}", "netns", namespace)
    _ip("-n", namespace, "link", "set", f"vp{tag}{index}", "name", "eth0")
    _ip("-n", namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
    _ip("-n", namespace, "link", "set", "eth0", "up")
    _ip("link", "set", veth, "master", network.bridge)
    _ip("link", "set", veth, "up")
    for number, (bridge, _, prefix) in enumerate(network.extra, start=1):
        outside, inside = f"vl{tag}{index}x{number}", f"vp{tag}{index}x{number}"
        host.extra_veths.append(outside)
        host.extra_addresses.append(f"{prefix}{index + 2}")
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", namespace)
        _ip("-n", namespace, "link", "set", inside, "name", f"eth{number}")
        _ip("-n", namespace, "addr", "add", f"{prefix}{index + 2}/24", "dev", f"eth{number}")
        _ip("-n", namespace, "link", "set", f"eth{number}", "up")
        _ip("link", "set", outside, "master", bridge)
        _ip("link", "set", outside, "up")


def _make_bridge(name: str, gateway: str) -> None:
    _ip("link", "add", name, "type", "bridge")
    _ip("link", "set", name, "alias", f"{ALIAS_PREFIX}{os.getpid()}")
    _ip("addr", "add", f"{gateway}/24", "dev", name)
    _ip("link", "set", name, "up")


@contextlib.contextmanager
def build_network(hosts: int = 2, *, extra_networks: int = 0) -> Iterator[Network]:
    """A bridge and `hosts` namespaces on it, removed on every exit path.

    `extra_networks`: more bridges, each with a /24 of its own, that every host
    joins as eth1, eth2, ... (its address there: `host.extra_addresses`).
    """
    require_netns()
    remove_stale()
    a, b = _free_subnet()
    tag = secrets.token_hex(3)  # link names are at most 15 characters
    network = Network(bridge=f"brl{tag}", gateway=f"10.{a}.{b}.1", prefix=f"10.{a}.{b}.", hosts=[])
    try:
        _make_bridge(network.bridge, network.gateway)
        for number in range(1, extra_networks + 1):
            a, b = _free_subnet()
            extra = (f"brl{tag}x{number}", f"10.{a}.{b}.1", f"10.{a}.{b}.")
            network.extra.append(extra)
            _make_bridge(extra[0], extra[1])
        for index in range(hosts):
            _make_host(network, index, tag)
        yield network
    finally:
        network.teardown()


@pytest.fixture(scope="module")
def netns_network(request: pytest.FixtureRequest) -> Iterator[Network]:
    """Hosts on one bridge, shared by a module's tests (see `netns`): three, or the
    test module's `NETNS_HOSTS`, with its `NETNS_EXTRA_NETWORKS` more networks (0)."""
    hosts = int(getattr(request.module, "NETNS_HOSTS", 3))
    extra = int(getattr(request.module, "NETNS_EXTRA_NETWORKS", 0))
    try:
        with build_network(hosts, extra_networks=extra) as network:
            yield network
    except NetnsError as exc:
        pytest.fail(f"cannot create network namespaces: {exc}", pytrace=False)


@pytest.fixture
def netns(netns_network: Network) -> Iterator[Network]:
    """The module's network, with every host's processes killed and links up after the test."""
    yield netns_network
    netns_network.reset()
