"""Parsing of the agent's command-line values into plain data.

Every function here is pure and raises `FlagError` naming the flag and what a
good value looks like. It does not check that a server answers, that a port is
free, or that declared GPUs exist: only that the text means something.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmgw.agent.errors import FlagError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)\s*$", re.IGNORECASE)
_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_LABEL_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?$")
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)$")


@dataclass(frozen=True, slots=True)
class PortRange:
    """Inclusive range of TCP ports this node's engines may listen on."""

    start: int
    end: int

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.start <= port <= self.end

    def __str__(self) -> str:
        return f"{self.start}-{self.end}"


def parse_address(flag: str, text: str) -> str:
    """HOST:PORT (IPv6 as [::1]:PORT) → the same text, checked."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not _HOST.match(host):
        raise FlagError(flag, f"{text!r} is not HOST:PORT (e.g. control.example:9443)")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise FlagError(flag, f"{text!r}: the port must be a number from 1 to 65535")
    return f"{host}:{int(port)}"


def parse_servers(server: str | None, servers: str | None) -> tuple[str, ...]:
    """The control-plane addresses in the order tried: `--server` first, then `--servers`.

    Duplicates are dropped (the first position wins); at least one is required.
    """
    found: list[str] = []
    if server is not None:
        found.append(parse_address("--server", server))
    if servers is not None:
        parts = [p for p in servers.split(",") if p.strip()]
        if not parts:
            raise FlagError("--servers", "give one or more HOST:PORT separated by commas")
        found.extend(parse_address("--servers", p) for p in parts)
    if not found:
        raise FlagError(
            "--server",
            "no control plane to dial: give --server HOST:PORT or --servers HOST:PORT,HOST:PORT",
        )
    return tuple(dict.fromkeys(found))


def parse_port_range(text: str, *, flag: str = "--port-range") -> PortRange:
    """START-END (inclusive), or a single PORT."""
    start_text, sep, end_text = text.strip().partition("-")
    if not sep:
        end_text = start_text
    if not (start_text.strip().isdigit() and end_text.strip().isdigit()):
        raise FlagError(flag, f"{text!r} is not START-END (e.g. 20000-20999)")
    start, end = int(start_text), int(end_text)
    if not (1 <= start <= 65535 and 1 <= end <= 65535):
        raise FlagError(flag, f"{text!r}: ports must be from 1 to 65535")
    if start > end:
        raise FlagError(flag, f"{text!r}: the start {start} is above the end {end}")
    return PortRange(start, end)


def parse_key_values(flag: str, text: str | None) -> dict[str, str]:
    """k=v,k=v → a dict; keys are label-like, values may be empty, no duplicates."""
    result: dict[str, str] = {}
    if text is None or not text.strip():
        return result
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        key = key.strip()
        if not sep:
            raise FlagError(flag, f"{item.strip()!r} is not KEY=VALUE (e.g. zone=eu-1)")
        if not _LABEL_KEY.match(key):
            raise FlagError(
                flag, f"{key!r} is not a valid key: letters, digits and . _ / - (not at the ends)"
            )
        if key in result:
            raise FlagError(flag, f"{key!r} is given twice")
        result[key] = value.strip()
    return result


def parse_size(flag: str, text: str) -> int:
    """24GiB, 80GB, 512MiB, 1024B → bytes; the unit is required (24 alone is ambiguous)."""
    match = _SIZE.match(text)
    if match is None:
        raise FlagError(
            flag, f"{text.strip()!r} is not a size with a unit (e.g. 24GiB, 80GB, 512MiB)"
        )
    number, unit = match.groups()
    size = int(float(number) * _UNITS[unit.upper()])
    if size <= 0:
        raise FlagError(flag, f"{text!r}: a GPU needs more than 0 bytes of memory")
    return size


def parse_gpus(text: str | None, *, flag: str = "--gpus") -> tuple[int, ...]:
    """2x24GiB, or 1x80GiB,1x40GiB, or 24GiB → the memory of each declared GPU, in order."""
    if text is None or not text.strip():
        return ()
    sizes: list[int] = []
    for item in text.split(","):
        count_text, sep, size_text = item.strip().lower().partition("x")
        if not sep:
            count_text, size_text = "1", item
        if not count_text.strip().isdigit() or int(count_text) < 1:
            raise FlagError(flag, f"{item.strip()!r} is not COUNTxSIZE (e.g. 2x24GiB)")
        sizes.extend([parse_size(flag, size_text)] * int(count_text))
    return tuple(sizes)


def is_loopback(host: str) -> bool:
    """Whether engines bound to this host are reachable from this machine only."""
    bare = host.strip("[]").lower()
    return bare in ("localhost", "::1") or bare.startswith("127.")


@dataclass(frozen=True, slots=True)
class WeightsLimit:
    """`--weights-max-use`: a share of the weights disk in use (`85%`), or a size the
    hub snapshots together may take (`200GB`)."""

    fraction: float | None = None
    size: int | None = None

    def __str__(self) -> str:
        if self.fraction is not None:
            return f"{self.fraction * 100:g}% of the weights disk"
        return f"{self.size} bytes of hub snapshots"


def parse_weights_limit(
    text: str | None, *, flag: str = "--weights-max-use"
) -> WeightsLimit | None:
    """`85%` or a size such as `200GB`; None (no eviction) when not given."""
    if text is None:
        return None
    value = text.strip()
    if value.endswith("%"):
        try:
            percent = float(value[:-1])
        except ValueError:
            percent = -1.0
        if not 0 < percent < 100:
            raise FlagError(flag, f"{value!r} is not a share between 0% and 100% (e.g. 85%)")
        return WeightsLimit(fraction=percent / 100)
    try:
        return WeightsLimit(size=parse_size(flag, value))
    except FlagError:
        raise FlagError(
            flag, f"{value!r} is neither a share of the disk (85%) nor a size (200GB)"
        ) from None
