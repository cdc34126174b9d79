"""HTTPS on the API listener of a real `llmgw server` (`api_tls` in the config file).

Certificates come from `llmgw certs` (as a process); clients trust the CA that
issued them. The admin listener stays plain HTTP on loopback.
"""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import httpx
import pytest
from procs import Proc, Server, Sim, free_port, llmgw

PASSWORD = "correct horse battery staple"


def certs(tmp: Path) -> Path:
    ca = tmp / "ca"
    for args in (("init",), ("issue", "--server", "127.0.0.1")):
        done = subprocess.run(
            llmgw("certs", *args, "--dir", str(ca)),
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    return ca


def add_admin(data_dir: Path, name: str) -> None:
    done = subprocess.run(
        llmgw("users", "create", name, "--password-stdin", "--admin", "--data-dir", str(data_dir)),
        input=PASSWORD + "\n", capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def tls_config(tmp: Path, cert: Path, key: Path) -> Path:
    path = tmp / "llmgw.yaml"
    path.write_text(f"api_tls:\n  cert: {cert}\n  key: {key}\n")
    return path


def test_the_api_answers_over_https_and_login_cookies_are_secure(tmp_path: Path) -> None:
    ca = certs(tmp_path)
    config = tls_config(tmp_path, ca / "server-127.0.0.1.crt", ca / "server-127.0.0.1.key")
    data = tmp_path / "data"
    add_admin(data, "alice")
    sim = Sim()
    server = Server(
        "--endpoint", f"s={sim.url}=sim-model", "--config", str(config), data_dir=data
    )  # fmt: skip
    https = f"https://127.0.0.1:{server.port}"
    trust = ssl.create_default_context(cafile=str(ca / "ca.crt"))
    try:
        with httpx.Client(base_url=https, verify=trust, timeout=10) as client:
            models = client.get("/v1/models")
            assert models.status_code == 200
            assert [m["id"] for m in models.json()["data"]] == ["sim-model"]
            answer = client.post(
                "/v1/chat/completions",
                json={"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert answer.status_code == 200, answer.text

            login = client.post("/admin/login", data={"username": "alice", "password": PASSWORD})
            assert login.status_code == 303, login.text
            cookie = login.headers["set-cookie"]
            assert "llmgw_session=" in cookie and "Secure" in cookie and "HttpOnly" in cookie

        # Plain HTTP on the HTTPS port gets no answer; an untrusting client refuses it.
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{server.port}/v1/models", timeout=5)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{https}/v1/models", timeout=5)
        assert f"API listener on {https}" in server.proc.output()
    finally:
        server.proc.stop()
        sim.proc.stop()


@pytest.mark.parametrize("broken", ["missing", "mismatched"])
def test_bad_tls_files_are_refused_naming_the_field_and_file(tmp_path: Path, broken: str) -> None:
    ca = certs(tmp_path)
    cert = ca / "server-127.0.0.1.crt"
    key = ca / "ca.key" if broken == "mismatched" else tmp_path / "nope.key"
    config = tls_config(tmp_path, cert, key)
    proc = Proc(
        llmgw(
            "server", "--config", str(config), "--endpoint", "e=http://127.0.0.1:1=m",
            "--listen", f"127.0.0.1:{free_port()}", "--admin-listen", f"127.0.0.1:{free_port()}",
            "--agent-listen", "off", "--data-dir", str(tmp_path / "data"),
        )
    )  # fmt: skip
    try:
        code = proc.popen.wait(60)
    finally:
        proc.stop()
    output = proc.output()
    assert code == 2, output
    assert "Traceback" not in output
    assert f"error: {config}: api_tls" in output
    if broken == "missing":
        assert f"api_tls.key: {key} does not exist" in output
    else:
        assert "the key must belong to the certificate" in output
