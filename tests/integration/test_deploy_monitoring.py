"""The shipped Grafana dashboard and Prometheus alert rules (deploy/) against a real
server: every metric name their queries use is one `llmgw server` exports (read from
its /metrics), and `promtool check rules` accepts the rules.

promtool comes from Debian's `prometheus` package, which `make test` installs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from procs import Server

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "llmgw.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
METRIC = re.compile(r"\bllmgw_[a-z_]+\b")


def _exported(text: str) -> set[str]:
    """Every series name a scrape of `text` can have (histograms' _bucket, _sum, _count)."""
    names: set[str] = set()
    for line in text.splitlines():
        if not line.startswith("# TYPE "):
            continue
        _, _, name, kind = line.split()
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        if kind == "counter" and not name.endswith("_total"):
            names.add(f"{name}_total")
    return names


def _dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            queries.append(variable["definition"])
    return queries


def test_every_metric_the_dashboard_and_alerts_use_is_exported(tmp_path: Path) -> None:
    config = tmp_path / "llmgw.yaml"
    config.write_text(
        "models:\n  - name: m1\n    weights: none\n"
        "    profiles: [{name: sim, engine: sim, gpus: 1, engine_args: []}]\n"
    )
    # The default agent listener: the cluster PKI, so its certificates are exported too.
    server = Server("--config", str(config), insecure_agents=False, data_dir=tmp_path / "data")
    try:
        text = httpx.get(server.admin + "/metrics", timeout=30).text
    finally:
        server.proc.stop()
    exported = _exported(text)
    assert re.search(
        r'llmgw_certificate_expiry_timestamp_seconds\{certificate="cluster-ca"\}', text
    )

    queries = _dashboard_queries()
    assert len(queries) > 20
    used = {name for query in queries for name in METRIC.findall(query)}
    # Every name in the rules file, runbook text included.
    used_by_alerts = set(METRIC.findall(ALERTS.read_text()))
    missing = sorted((used | used_by_alerts) - exported)
    assert not missing, f"not exported by llmgw server: {missing}"


def test_the_dashboard_is_a_grafana_dashboard_over_a_chosen_prometheus() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] == "llmgw"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]


def test_promtool_accepts_the_alert_rules() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail(
            "promtool is missing: install Debian's prometheus package "
            "(apt-get install prometheus; `make test` does it)"
        )
    result = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    for rule in ("LlmgwNoReadyReplica", "LlmgwQueueWaitAboveTarget", "LlmgwNodeLost",
                 "LlmgwLeaderFlapping", "LlmgwUsageWritesFailing", "LlmgwCertificateExpiringSoon"):  # fmt: skip
        assert f"alert: {rule}\n" in ALERTS.read_text()
    assert ALERTS.read_text().count("runbook:") == ALERTS.read_text().count("- alert:")
