"""`llmgw agent --tls-ca/--tls-cert/--tls-key`: all or none, files checked at start, node id default."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from llmgw import pki
from llmgw.agent.errors import FlagError
from llmgw.cli.agent import _node_id, _tls

NOW = datetime.now(UTC)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("pki")
    pki.init_ca(base, now=NOW)
    node = pki.issue_node(base, "gpu-7", now=NOW)
    other = pki.issue_node(base, "gpu-8", now=NOW)
    return {"ca": base / "ca.crt", "cert": node.cert, "key": node.key, "other_key": other.key}


def agent(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_AGENT_TLS_")}
    return subprocess.run(
        [sys.executable, "-m", "llmgw", "agent", "--server", "h:1", *args],
        capture_output=True, text=True, timeout=30, check=False, env={**clean, **(env or {})},
    )  # fmt: skip


def test_no_tls_flags_mean_plaintext() -> None:
    assert _tls(ca=None, cert=None, key=None) is None


def test_all_three_files_are_read_and_the_node_id_defaults_to_the_certificate(
    files: dict[str, Path],
) -> None:
    tls = _tls(ca=str(files["ca"]), cert=str(files["cert"]), key=str(files["key"]))
    assert tls is not None
    assert tls.cert == files["cert"].read_bytes() and tls.ca == files["ca"].read_bytes()
    assert _node_id(None, tls) == "gpu-7"
    # An explicit id wins (the server then decides whether the certificate allows it).
    assert _node_id("gpu-9", tls) == "gpu-9"


def test_some_but_not_all_flags_name_what_is_missing(files: dict[str, Path]) -> None:
    with pytest.raises(FlagError) as missing:
        _tls(ca=str(files["ca"]), cert=None, key=None)
    assert missing.value.flag == "--tls-cert"
    assert "--tls-cert, --tls-key missing" in str(missing.value)


def test_a_bad_file_names_its_flag(files: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(FlagError) as unreadable:
        _tls(ca=str(tmp_path / "nope.crt"), cert=str(files["cert"]), key=str(files["key"]))
    assert unreadable.value.flag == "--tls-ca" and "cannot read" in str(unreadable.value)
    with pytest.raises(FlagError) as mismatch:
        _tls(ca=str(files["ca"]), cert=str(files["cert"]), key=str(files["other_key"]))
    assert mismatch.value.flag == "--tls-key"
    assert "does not belong to the certificate" in str(mismatch.value)


def test_the_cli_reports_tls_flag_errors_on_one_line(files: dict[str, Path]) -> None:
    done = agent("--tls-ca", str(files["ca"]))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: --tls-cert: TLS needs all of"), done.stderr
    assert done.stderr.count("\n") == 1

    done = agent(
        env={
            "LLMGW_AGENT_TLS_CA": str(files["ca"]),
            "LLMGW_AGENT_TLS_CERT": str(files["cert"]),
            "LLMGW_AGENT_TLS_KEY": "/nonexistent/key.pem",
        }
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(
        "error: --tls-key: /nonexistent/key.pem: cannot read the private key"
    ), done.stderr
