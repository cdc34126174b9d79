"""`llmgw agent` flag values: parsing, the order servers are tried in, and the errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmgw.agent.errors import FlagError
from llmgw.agent.flags import (
    PortRange,
    is_loopback,
    parse_gpus,
    parse_key_values,
    parse_port_range,
    parse_servers,
)

GIB = 2**30


def test_server_first_then_servers_in_order_without_duplicates() -> None:
    assert parse_servers("a:1", "b:2,c:3") == ("a:1", "b:2", "c:3")
    assert parse_servers("c:3", "a:1, b:2 ,c:3") == ("c:3", "a:1", "b:2")
    assert parse_servers(None, "b:2,a:1") == ("b:2", "a:1")
    assert parse_servers("[::1]:9443", None) == ("[::1]:9443",)


@pytest.mark.parametrize(
    ("server", "servers", "flag", "fragment"),
    [
        (None, None, "--server", "no control plane"),
        ("nohost", None, "--server", "not HOST:PORT"),
        ("h:0", None, "--server", "from 1 to 65535"),
        ("h:99999", None, "--server", "from 1 to 65535"),
        ("h:x", None, "--server", "from 1 to 65535"),
        (None, "a:1,b", "--servers", "'b' is not HOST:PORT"),
        (None, " , ", "--servers", "one or more"),
        ("bad host:1", None, "--server", "not HOST:PORT"),
    ],
)
def test_bad_servers_name_the_flag(
    server: str | None, servers: str | None, flag: str, fragment: str
) -> None:
    with pytest.raises(FlagError) as caught:
        parse_servers(server, servers)
    assert caught.value.flag == flag
    assert str(caught.value).startswith(f"{flag}: ") and fragment in str(caught.value)


def test_port_range() -> None:
    assert parse_port_range("20000-20999") == PortRange(20000, 20999)
    assert parse_port_range(" 8000 ") == PortRange(8000, 8000)
    ports = parse_port_range("10-12")
    assert 10 in ports and 12 in ports and 13 not in ports and 9 not in ports
    assert str(ports) == "10-12"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("20999-20000", "start 20999 is above the end 20000"),
        ("0-10", "from 1 to 65535"),
        ("1-70000", "from 1 to 65535"),
        ("a-b", "is not START-END"),
        ("", "is not START-END"),
        ("1-2-3", "is not START-END"),
    ],
)
def test_bad_port_ranges(text: str, fragment: str) -> None:
    with pytest.raises(FlagError, match=fragment) as caught:
        parse_port_range(text)
    assert caught.value.flag == "--port-range"


def test_labels_and_fabric() -> None:
    assert parse_key_values("--labels", "zone=eu-1, tier=gpu") == {"zone": "eu-1", "tier": "gpu"}
    assert parse_key_values("--fabric", "ib-domain=pod3") == {"ib-domain": "pod3"}
    assert parse_key_values("--labels", "example.com/team=") == {"example.com/team": ""}
    assert parse_key_values("--labels", None) == {}
    assert parse_key_values("--labels", "") == {}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("zone", "is not KEY=VALUE"),
        ("=x", "is not a valid key"),
        ("-a=x", "is not a valid key"),
        ("a b=x", "is not a valid key"),
        ("a=1,a=2", "'a' is given twice"),
    ],
)
def test_bad_labels_name_the_flag(text: str, fragment: str) -> None:
    with pytest.raises(FlagError, match=fragment) as caught:
        parse_key_values("--fabric", text)
    assert caught.value.flag == "--fabric"


def test_gpus() -> None:
    assert parse_gpus("2x24GiB") == (24 * GIB, 24 * GIB)
    assert parse_gpus("1x80GiB,1x40GiB") == (80 * GIB, 40 * GIB)
    assert parse_gpus("1X80gib, 2x16GB") == (80 * GIB, 16 * 10**9, 16 * 10**9)
    assert parse_gpus("48GiB") == (48 * GIB,)
    assert parse_gpus("1x0.5GiB") == (GIB // 2,)
    assert parse_gpus(None) == ()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("2x24", "not a size with a unit"),
        ("0x24GiB", "is not COUNTxSIZE"),
        ("ax24GiB", "is not COUNTxSIZE"),
        ("2x", "not a size with a unit"),
        ("2x0GiB", "more than 0 bytes"),
        ("2x24Gibibytes", "not a size with a unit"),
    ],
)
def test_bad_gpus(text: str, fragment: str) -> None:
    with pytest.raises(FlagError, match=fragment) as caught:
        parse_gpus(text)
    assert caught.value.flag == "--gpus"


def test_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("[::1]")
    assert not is_loopback("10.0.0.7") and not is_loopback("node-a.example")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "error: --server: no control plane to dial"),
        (["--server", "h:1", "--port-range", "9-1"], "error: --port-range: '9-1'"),
        (["--server", "h:1", "--gpus", "2x24"], "error: --gpus: '24' is not a size"),
        (["--server", "h:1", "--labels", "x"], "error: --labels: 'x' is not KEY=VALUE"),
        (["--server", "h:1", "--fabric", "a=1,a=2"], "error: --fabric: 'a' is given twice"),
        (["--server", "h:1", "--log-level", "loud"], "error: --log-level: 'loud'"),
        (["--server", "h:1", "--engine-python", "/no/python"], "error: --engine-python:"),
        (
            ["--server", "h:1", "--weights-dir", "/proc/llmgw"],
            "error: --weights-dir: cannot create",
        ),
        (["--server", "h:1", "--advertise-host", "http://x/"], "error: --advertise-host:"),
        (["--server", "h:1", "--engine-host", "a b"], "error: --engine-host: 'a b' is not a host"),
        (["--server", "h:1", "--node-id", " "], "error: --node-id:"),
        (
            ["--server", "h:1", "--weights-max-use", "120%"],
            "error: --weights-max-use: '120%' is not a share between 0% and 100%",
        ),
        (
            ["--server", "h:1", "--weights-max-use", "lots"],
            "error: --weights-max-use: 'lots' is neither a share of the disk (85%) nor a size",
        ),
        (
            ["--server", "h:1", "--hub-token-file", "/no/such/token"],
            "error: --hub-token-file: /no/such/token is not a readable file",
        ),
    ],
)
def test_cli_flag_errors_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "llmgw", "agent", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(message), done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
