"""Nothing about other tenants or the fleet's addresses reaches API clients.

Through the real `llmgw server` with `llmgw sim` engines, a dead address, and a
raw-socket engine that names its own address in its errors, tried the way a
tenant would: with the official SDKs and plain HTTP, streamed and not, in the
OpenAI, Anthropic and Responses shapes.

- `x-llmgw-route` explanations (which tell whether any key sent a prompt prefix
  lately) go to admin keys and keys with the `debug` scope only.
- Every error names the replica by id, never by URL, host or port; the URL is in
  the server log and the admin API.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from procs import Server, Sim, llmgw, wait_for

SYSTEM = {"role": "system", "content": "You are the assistant of the harbour master. " * 40}
ASK = [SYSTEM, {"role": "user", "content": "When is high tide?"}]


class AddressNamingEngine:
    """An engine (or a proxy in front of one) whose error answers name its address."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    request += chunk
                path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b"/"
                if path.startswith(b"/v1/models"):
                    body = b'{"object": "list", "data": []}'
                    status = b"200 OK"
                else:
                    message = (
                        f"upstream at 127.0.0.1:{self.port} failed; see {self.url}/health "
                        "(host 127.0.0.1)"
                    )
                    body = json.dumps({"error": {"message": message, "type": "server"}}).encode()
                    status = b"500 Internal Server Error"
                conn.sendall(
                    b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
                    b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
                    + body
                )  # fmt: skip

    def close(self) -> None:
        self.sock.close()


@dataclass
class Gateway:
    server: Server
    data_dir: Path
    keys: dict[str, tuple[str, str]]  # name -> (id, secret)
    addresses: dict[str, str]  # endpoint id -> URL
    doomed: Sim  # serves `dead` until a test stops it

    def secret(self, name: str) -> str:
        return self.keys[name][1]


def _key(server: Server, body: dict[str, Any]) -> tuple[str, str]:
    resp = httpx.post(f"{server.admin}/admin/api/keys", json=body, timeout=10)
    assert resp.status_code == 201, resp.text
    made = resp.json()
    return made["id"], made["secret"]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data_dir = tmp_path_factory.mktemp("data")
    config = data_dir / "llmgw.yaml"
    config.write_text(
        "auth: {refresh_interval: 0.2}\n"
        "router:\n"
        "  timeouts: {first_byte: 0.5, idle: 0.3, total: 1.5}\n"
        # Probed once at start: the engine stopped later is found by requests.
        "  health: {interval: 600}\n"
    )
    sims = [
        Sim("--zero-delay", model="m1"),
        Sim("--zero-delay", model="m1"),
        Sim("--zero-delay", "--slow-start", "5", model="slow"),
        Sim("--zero-delay", "--stall-after-tokens", "2", model="stall"),
        Sim("--zero-delay", model="dead"),
        Sim("--zero-delay", "--stall-after-tokens", "2", model="stall2"),
    ]
    talker = AddressNamingEngine()
    addresses = {
        "a": sims[0].url,
        "b": sims[1].url,
        "slow-1": sims[2].url,
        "stall-1": sims[3].url,
        "dead-1": sims[4].url,
        "talker-1": talker.url,
        # Models of their own for the SDK test, whose replicas no other test ejected.
        "talker-2": talker.url,
        "stall-2": sims[5].url,
    }
    models = {"a": "m1", "b": "m1", "slow-1": "slow", "stall-1": "stall"}
    models |= {"dead-1": "dead", "talker-1": "talker", "talker-2": "talker2", "stall-2": "stall2"}
    endpoints = [
        a for e, url in addresses.items() for a in ("--endpoint", f"{e}={url}={models[e]}")
    ]
    server = Server(*endpoints, "--config", str(config), auth=True, data_dir=data_dir)
    try:
        keys = {
            "tenant-a": _key(server, {"name": "tenant-a"}),
            "tenant-b": _key(server, {"name": "tenant-b"}),
            "debugger": _key(server, {"name": "debugger", "scopes": ["debug"]}),
            "ops": _key(server, {"name": "ops", "admin": True}),
        }
        yield Gateway(server, data_dir, keys, addresses, sims[4])
    finally:
        server.proc.stop()
        for sim in sims:
            sim.proc.stop()
        talker.close()


def chat(
    gateway: Gateway, key: str, *, stream: bool = False, explain: bool = True
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {gateway.secret(key)}"}
    if explain:
        headers["x-llmgw-route"] = "1"
    body = {"model": "m1", "messages": ASK, "max_tokens": 2, "stream": stream}
    return httpx.post(
        gateway.server.url + "/v1/chat/completions", json=body, headers=headers, timeout=30
    )


def test_route_explanations_go_to_admin_and_debug_keys_only(gateway: Gateway) -> None:
    # Tenant A sends a prompt; the prefix index now holds it.
    assert chat(gateway, "tenant-a", explain=False).status_code == 200
    for stream in (False, True):
        probe = chat(gateway, "tenant-b", stream=stream)
        assert probe.status_code == 200, probe.text
        # Tenant B learns nothing of whether anyone sent this prompt: the header is ignored.
        assert "x-llmgw-route" not in probe.headers
        assert "cached=" not in probe.text
        for key in ("debugger", "ops"):
            explained = chat(gateway, key, stream=stream)
            route = explained.headers["x-llmgw-route"]
            held, total = route.split("cached=")[1].split()[0].split("/")
            assert int(held) > int(total) / 2, route
            assert route.endswith(f"-> {explained.headers['x-llmgw-replica']}")
    # The Anthropic SDK's requests get no explanation either.
    with anthropic.Anthropic(
        base_url=gateway.server.url, api_key=gateway.secret("tenant-b"), max_retries=0
    ) as client:
        raw = client.messages.with_raw_response.create(
            model="m1",
            max_tokens=2,
            system=str(SYSTEM["content"]),
            messages=[{"role": "user", "content": "When is high tide?"}],
            extra_headers={"x-llmgw-route": "1"},
        )
    assert "x-llmgw-route" not in raw.headers


def test_the_debug_scope_is_given_and_taken_by_the_admin_api(gateway: Gateway) -> None:
    key_id, _ = gateway.keys["tenant-b"]
    admin = gateway.server.admin
    given = httpx.patch(f"{admin}/admin/api/keys/{key_id}", json={"scopes": ["debug"]}, timeout=10)
    assert given.status_code == 200 and given.json()["scopes"] == ["debug"], given.text
    wait_for(lambda: "x-llmgw-route" in chat(gateway, "tenant-b").headers, "the scope to apply")
    taken = httpx.patch(f"{admin}/admin/api/keys/{key_id}", json={"scopes": []}, timeout=10)
    assert taken.json()["scopes"] == []
    wait_for(lambda: "x-llmgw-route" not in chat(gateway, "tenant-b").headers, "the scope to go")
    unknown = httpx.post(
        f"{admin}/admin/api/keys", json={"name": "x", "scopes": ["root"]}, timeout=10
    )
    assert unknown.status_code == 400
    assert unknown.json()["error"]["param"] == "scopes"
    assert "takes debug" in unknown.json()["error"]["message"]


def test_the_cli_gives_the_debug_scope(gateway: Gateway) -> None:
    def keys(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            llmgw("keys", *args, "--data-dir", str(gateway.data_dir)),
            capture_output=True,
            text=True,
            check=False,
        )

    made = keys("create", "--name", "cli-debugger", "--scope", "debug", "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["scopes"] == ["debug"]
    listed = keys("list")
    assert "active, debug" in next(ln for ln in listed.stdout.splitlines() if "cli-debugger" in ln)
    cleared = keys("update", "cli-debugger", "--no-scopes", "--json")
    assert cleared.returncode == 0 and json.loads(cleared.stdout)["scopes"] == []
    wrong = keys("create", "--name", "cli-root", "--scope", "root")
    assert wrong.returncode != 0 and "--scope" in wrong.stderr and "debug" in wrong.stderr
    assert "Traceback" not in wrong.stderr


def _requests(model: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, path, body) of every client API, streamed and not, for `model`."""
    user = [{"role": "user", "content": "hello there"}]
    out = []
    for stream in (False, True):
        out += [
            (f"chat stream={stream}", "/v1/chat/completions",
             {"model": model, "messages": user, "max_tokens": 8, "stream": stream}),
            (f"messages stream={stream}", "/v1/messages",
             {"model": model, "messages": user, "max_tokens": 8, "stream": stream}),
            (f"responses stream={stream}", "/v1/responses",
             {"model": model, "input": "hello there", "max_output_tokens": 8, "stream": stream}),
        ]  # fmt: skip
    return out


@pytest.mark.parametrize(
    ("model", "endpoint"),
    [("dead", "dead-1"), ("slow", "slow-1"), ("stall", "stall-1"), ("talker", "talker-1")],
)
def test_errors_name_the_replica_never_its_address(
    gateway: Gateway, model: str, endpoint: str
) -> None:
    """Connect errors, first-byte and idle deadlines (a stream's error event) and an
    engine's 5xx that names its address: no host, port or URL reaches the client."""
    url = gateway.addresses[endpoint]
    port = url.rsplit(":", 1)[1]
    if model == "dead":
        # Its engine goes away: the router finds the port closed.
        gateway.doomed.proc.stop()
    headers = {"Authorization": f"Bearer {gateway.secret('tenant-a')}"}
    named = 0
    with httpx.Client(base_url=gateway.server.url, headers=headers, timeout=30) as client:
        for label, path, body in _requests(model):
            resp = client.post(path, json=body)
            seen = resp.text + " ".join(f"{k}: {v}" for k, v in resp.headers.items())
            # The port as a number of its own (a request id's hex may hold its digits).
            assert "127.0.0.1" not in seen, (label, seen)
            assert not re.search(rf"(?<![0-9A-Za-z]){port}(?![0-9A-Za-z])", seen), (label, seen)
            assert resp.status_code >= 400 or "error" in resp.text, (label, resp.text)
            # Each failure names the replica, until it is ejected and none is tried.
            if "no healthy replica" not in resp.text:
                assert endpoint in seen, (label, seen)
                named += 1
    assert named > 0
    # Operators keep the address: in the admin API and the server log.
    (shown,) = [e for e in gateway.server.endpoints() if e["id"] == endpoint]
    assert shown["url"] == url
    assert f"{endpoint} at {url}" in gateway.server.proc.output()


def test_the_sdks_see_replica_ids_only(gateway: Gateway) -> None:
    url = gateway.server.url
    secret = gateway.secret("tenant-a")
    with (
        openai.OpenAI(base_url=url + "/v1", api_key=secret, max_retries=0) as client,
        pytest.raises(openai.APIStatusError) as failed,
    ):
        client.chat.completions.create(
            model="talker2", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert failed.value.status_code == 500
    assert "<replica talker-2>" in failed.value.message
    assert "127.0.0.1" not in failed.value.message
    with (
        anthropic.Anthropic(base_url=url, api_key=secret, max_retries=0) as claude,
        pytest.raises(anthropic.APIStatusError) as broken,
        claude.messages.stream(
            model="stall2", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        ) as stream,
    ):
        for _ in stream:
            pass
    body = broken.value.body
    assert isinstance(body, dict) and "stall-2" in body["error"]["message"]
    assert "127.0.0.1" not in json.dumps(body)
