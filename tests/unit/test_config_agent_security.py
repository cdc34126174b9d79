"""How the agent listener is secured, as the config file and flags say: cluster CA, own PKI, none."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.cli.cluster_wiring import agent_security, cluster_key_path, tokens_unavailable
from llmgw.config import ConfigError, load_server_config


def test_the_default_is_the_cluster_ca_with_its_key_in_the_data_dir(tmp_path: Path) -> None:
    cfg = load_server_config(None, {})
    assert agent_security(cfg) == "cluster"
    assert cluster_key_path(cfg, str(tmp_path)) == tmp_path / "cluster.key"
    assert cfg.control.node_cert_lifetime == 30 * 86400
    assert cfg.control.server_cert_lifetime == 90 * 86400

    moved = load_server_config(None, {"cluster_key_file": str(tmp_path / "k" / "ck")})
    assert cluster_key_path(moved, "/nowhere") == tmp_path / "k" / "ck"


def test_flags_and_the_file_choose_plaintext_or_own_certificates(tmp_path: Path) -> None:
    assert agent_security(load_server_config(None, {"insecure_agents": True})) == "insecure"
    assert agent_security(load_server_config(None, {"agent_listen": None})) == "off"
    own = tmp_path / "own.yaml"
    own.write_text("agent_tls: {cert: a.crt, key: a.key, ca: ca.crt}\n")
    cfg = load_server_config(own, {})
    assert agent_security(cfg) == "own"
    assert "llmgw certs issue --node" in tokens_unavailable("own")


def test_plaintext_and_own_certificates_together_are_refused_naming_both(tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    both.write_text("agent_tls: {cert: a.crt, key: a.key, ca: ca.crt}\n")
    with pytest.raises(ConfigError, match="insecure_agents and agent_tls are both set") as exc:
        load_server_config(both, {"insecure_agents": True})
    assert str(both) in str(exc.value)


def test_certificate_lifetimes_must_be_positive(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("control: {node_cert_lifetime: 0}\n")
    with pytest.raises(ConfigError, match="node_cert_lifetime"):
        load_server_config(bad, {})
