"""API keys, limits and usage through the real `llmgw server` in front of real sims."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from procs import Server, Sim, llmgw

from llmgw.auth import generate_secret, hash_secret, secret_prefix
from llmgw.store import NewApiKey, UsageRow, open_store, store_url, utc_now

CHAT = {"messages": [{"role": "user", "content": "Write about the sea"}], "max_tokens": 5}


def create_key(data_dir: Path, *flags: str) -> str:
    result = subprocess.run(
        llmgw("keys", "create", "--data-dir", str(data_dir), "--json", *flags),
        capture_output=True,
        text=True,
        check=True,
    )
    secret: str = json.loads(result.stdout)["secret"]
    return secret


def usage_rows(data_dir: Path, **query: object) -> list[UsageRow]:
    async def read() -> list[UsageRow]:
        store = await open_store(store_url(data_dir, None))
        try:
            return await store.usage.query(**query)  # type: ignore[arg-type]
        finally:
            await store.close()

    return asyncio.run(read())


def add_expired_key(data_dir: Path) -> str:
    secret = generate_secret()

    async def add() -> None:
        store = await open_store(store_url(data_dir, None))
        try:
            await store.keys.create(
                NewApiKey(
                    name="expired",
                    prefix=secret_prefix(secret),
                    secret_hash=hash_secret(secret),
                    expires_at=utc_now() - timedelta(hours=1),
                )
            )
        finally:
            await store.close()

    asyncio.run(add())
    return secret


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def error_of(resp: httpx.Response, status: int) -> dict[str, str]:
    assert resp.status_code == status, resp.text
    error: dict[str, str] = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sim, Server, Path]]:
    data_dir = tmp_path_factory.mktemp("data")
    config = data_dir / "llmgw.yaml"
    config.write_text("auth: {refresh_interval: 0.2}\nusage: {flush_interval: 0.05}\n")
    # Migrate first so the CLI and the server agree on the schema from the start.
    subprocess.run(
        llmgw("db", "upgrade", "--data-dir", str(data_dir)), check=True, capture_output=True
    )
    sim = Sim("--zero-delay", model="m1", extra_models=("m2",))
    server = Server(
        "--endpoint",
        f"s={sim.url}=m1,m2",
        "--config",
        str(config),
        auth=True,
        data_dir=data_dir,
    )
    yield sim, server, data_dir
    server.proc.stop()
    sim.proc.stop()


def test_auth_matrix(gateway: tuple[Sim, Server, Path]) -> None:
    _, server, data_dir = gateway
    url = server.url + "/v1/chat/completions"
    everything = create_key(data_dir, "--name", "everything")
    only_m1 = create_key(data_dir, "--name", "only-m1", "--models", "m1")
    expired = add_expired_key(data_dir)

    assert error_of(httpx.post(url, json={"model": "m1", **CHAT}), 401)["code"] == "missing_api_key"
    bad = httpx.post(url, json={"model": "m1", **CHAT}, headers=bearer("sk-llmgw-not-a-real-key"))
    assert error_of(bad, 401)["code"] == "invalid_api_key"
    assert (
        error_of(httpx.post(url, json={"model": "m1", **CHAT}, headers=bearer(expired)), 401)[
            "code"
        ]
        == "expired_api_key"
    )
    basic = httpx.post(url, json={"model": "m1", **CHAT}, headers={"Authorization": "Basic abc"})
    assert error_of(basic, 401)["code"] == "missing_api_key"

    assert (
        httpx.post(url, json={"model": "m2", **CHAT}, headers=bearer(everything)).status_code == 200
    )
    assert (
        httpx.post(url, json={"model": "m1", **CHAT}, headers={"x-api-key": only_m1}).status_code
        == 200
    )
    denied = error_of(httpx.post(url, json={"model": "m2", **CHAT}, headers=bearer(only_m1)), 403)
    assert denied["code"] == "model_not_allowed"
    assert "m2" in denied["message"]

    models = httpx.get(server.url + "/v1/models", headers=bearer(only_m1)).json()
    assert [m["id"] for m in models["data"]] == ["m1"]
    assert httpx.get(server.url + "/v1/models/m2", headers=bearer(only_m1)).status_code == 404
    all_models = httpx.get(server.url + "/v1/models", headers=bearer(everything)).json()
    assert sorted(m["id"] for m in all_models["data"]) == ["m1", "m2"]
    assert error_of(httpx.get(server.url + "/v1/models"), 401)["code"] == "missing_api_key"
    # The secret never shows up in the server's output.
    assert everything not in server.proc.output()


def test_revocation_takes_effect_within_seconds(gateway: tuple[Sim, Server, Path]) -> None:
    _, server, data_dir = gateway
    secret = create_key(data_dir, "--name", "soon-revoked")
    url = server.url + "/v1/chat/completions"
    assert httpx.post(url, json={"model": "m1", **CHAT}, headers=bearer(secret)).status_code == 200
    subprocess.run(
        llmgw("keys", "revoke", "soon-revoked", "--data-dir", str(data_dir)),
        check=True,
        capture_output=True,
    )
    deadline = time.monotonic() + 5
    status = 200
    while time.monotonic() < deadline:
        status = httpx.post(url, json={"model": "m1", **CHAT}, headers=bearer(secret)).status_code
        if status == 401:
            break
        time.sleep(0.05)
    assert status == 401


def until(
    deadline_s: float, probe: Callable[[], httpx.Response], done: Callable[[httpx.Response], bool]
) -> httpx.Response:
    """`probe()` until `done` says so or `deadline_s` passes; the last response."""
    deadline = time.monotonic() + deadline_s
    resp = probe()
    while not done(resp) and time.monotonic() < deadline:
        time.sleep(0.05)
        resp = probe()
    return resp


def test_updated_models_and_rpm_take_effect_within_seconds(
    gateway: tuple[Sim, Server, Path],
) -> None:
    _, server, data_dir = gateway
    secret = create_key(data_dir, "--name", "narrowed", "--rpm", "100")
    url = server.url + "/v1/chat/completions"

    def ask(model: str) -> httpx.Response:
        return httpx.post(url, json={"model": model, **CHAT}, headers=bearer(secret))

    assert ask("m2").status_code == 200
    updated = subprocess.run(
        llmgw("keys", "update", "narrowed", "--models", "m1", "--data-dir", str(data_dir)),
        capture_output=True,
        text=True,
        check=True,
    )
    assert "updated key" in updated.stdout
    denied = until(10, lambda: ask("m2"), lambda r: r.status_code == 403)
    assert error_of(denied, 403)["code"] == "model_not_allowed"
    # Same secret, still good for the model it keeps.
    assert ask("m1").status_code == 200

    lowered = httpx.patch(server.admin + "/admin/api/keys/narrowed", json={"rpm": 1})
    assert lowered.status_code == 200, lowered.text
    assert (lowered.json()["rpm"], lowered.json()["models"]) == (1, ["m1"])
    # Once a request is admitted under the new limit, the next one in the minute is refused.
    admitted = until(
        10, lambda: ask("m1"), lambda r: r.headers.get("x-ratelimit-limit-requests") == "1"
    )
    assert admitted.status_code == 200, admitted.text
    assert admitted.headers["x-ratelimit-limit-requests"] == "1"
    refused = ask("m1")
    assert error_of(refused, 429)["code"] == "rate_limit_exceeded"
    assert refused.headers["x-ratelimit-limit-requests"] == "1"


def test_rpm_limit_answers_429_with_openai_headers(gateway: tuple[Sim, Server, Path]) -> None:
    _, server, data_dir = gateway
    secret = create_key(data_dir, "--name", "two-per-minute", "--rpm", "2")
    url = server.url + "/v1/chat/completions"
    first = httpx.post(url, json={"model": "m1", **CHAT}, headers=bearer(secret))
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert httpx.post(url, json={"model": "m1", **CHAT}, headers=bearer(secret)).status_code == 200
    refused = httpx.post(url, json={"model": "m1", **CHAT}, headers=bearer(secret))
    error = error_of(refused, 429)
    assert error["code"] == "rate_limit_exceeded"
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.headers["x-ratelimit-reset-requests"].endswith("s")


def test_budget_exhaustion_is_insufficient_quota(gateway: tuple[Sim, Server, Path]) -> None:
    _, server, data_dir = gateway
    secret = create_key(
        data_dir, "--name", "tiny-budget", "--budget-tokens", "30", "--period", "day"
    )
    url = server.url + "/v1/chat/completions"
    statuses = []
    for _ in range(6):
        resp = httpx.post(url, json={"model": "m1", **CHAT}, headers=bearer(secret))
        statuses.append(resp.status_code)
        if resp.status_code == 429:
            assert resp.json()["error"]["code"] == "insufficient_quota"
            break
    assert statuses[0] == 200
    assert statuses[-1] == 429


def test_usage_rows_equal_what_the_engine_reported(gateway: tuple[Sim, Server, Path]) -> None:
    _, server, data_dir = gateway
    secret = create_key(data_dir, "--name", "counted")
    key_id = json.loads(
        subprocess.run(
            llmgw("keys", "list", "--data-dir", str(data_dir), "--json"),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    key_id = next(k["id"] for k in key_id if k["name"] == "counted")
    url = server.url + "/v1/chat/completions"
    prompt = completion = 0
    for max_tokens in (3, 7):
        body = {"model": "m1", **CHAT, "max_tokens": max_tokens}
        usage = httpx.post(url, json=body, headers=bearer(secret)).json()["usage"]
        prompt += usage["prompt_tokens"]
        completion += usage["completion_tokens"]
    stream_body = {
        "model": "m1",
        **CHAT,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", url, json=stream_body, headers=bearer(secret)) as resp:
        events = [line for line in resp.iter_lines() if line.startswith("data: {")]
    usage = json.loads(events[-1][len("data: ") :])["usage"]
    prompt += usage["prompt_tokens"]
    completion += usage["completion_tokens"]

    deadline = time.monotonic() + 5
    rows: list[UsageRow] = []
    while time.monotonic() < deadline:
        rows = usage_rows(data_dir, key_id=key_id)
        if rows and rows[0].requests == 3:
            break
        time.sleep(0.1)
    assert len(rows) == 1
    assert (rows[0].requests, rows[0].errors) == (3, 0)
    assert (rows[0].prompt_tokens, rows[0].completion_tokens) == (prompt, completion)
    table = subprocess.run(
        llmgw("usage", "--data-dir", str(data_dir), "--key", "counted"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(prompt + completion) in table


def test_sigterm_under_load_flushes_every_completed_request(tmp_path: Path) -> None:
    sim = Sim("--itl", "0.002", "--itl-per-running", "0", model="m1")
    server = Server("--endpoint", f"s={sim.url}=m1", data_dir=tmp_path)
    completed: list[str] = []
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            while not stop.is_set():
                try:
                    resp = http.post(
                        "/v1/chat/completions", json={"model": "m1", **CHAT, "max_tokens": 20}
                    )
                except httpx.HTTPError:
                    return
                if resp.status_code == 200:
                    completed.append(resp.headers["x-request-id"])

    workers = [threading.Thread(target=client) for _ in range(8)]
    try:
        for worker in workers:
            worker.start()
        time.sleep(1.5)
        server.proc.signal(signal.SIGTERM)
        assert server.proc.popen.wait(30) == 0
        stop.set()
        for worker in workers:
            worker.join(10)
        assert len(completed) > 20
        rows = usage_rows(tmp_path)
        assert sum(r.requests for r in rows) >= len(completed)
        assert sum(r.requests - r.errors for r in rows) == len(completed)
    finally:
        stop.set()
        server.proc.stop()
        sim.proc.stop()


def test_admin_api_manages_keys_and_reports_usage(gateway: tuple[Sim, Server, Path]) -> None:
    _, server, _ = gateway
    api = server.admin + "/admin/api"
    created = httpx.post(api + "/keys", json={"name": "from-api", "models": ["m1"], "rpm": 100})
    assert created.status_code == 201, created.text
    secret = created.json()["secret"]
    assert created.json()["models"] == ["m1"] and "secret_hash" not in created.json()
    url = server.url + "/v1/chat/completions"
    assert httpx.post(url, json={"model": "m1", **CHAT}, headers=bearer(secret)).status_code == 200

    listed = httpx.get(api + "/keys").json()["keys"]
    assert "from-api" in [k["name"] for k in listed]
    assert all("secret" not in k for k in listed)

    rotated = httpx.post(
        api + "/keys/from-api/rotate", headers={"Content-Type": "application/json"}
    ).json()
    assert rotated["secret"] != secret
    new_secret = rotated["secret"]
    assert (
        httpx.post(url, json={"model": "m1", **CHAT}, headers=bearer(new_secret)).status_code == 200
    )

    deadline = time.monotonic() + 5
    report: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        report = httpx.get(api + "/usage", params={"key": "from-api", "by": "key,model"}).json()[
            "usage"
        ]
        if report and report[0]["requests"] == 2:
            break
        time.sleep(0.1)
    assert report[0]["key_name"] == "from-api" and report[0]["requests"] == 2
    (daily,) = httpx.get(api + "/usage", params={"key": "from-api", "by": "day"}).json()["usage"]
    # The UTC date of the requests (a minute ago at most, should midnight have just passed).
    dates = {time.strftime("%Y-%m-%d", time.gmtime(time.time() - s)) for s in (0, 60)}
    assert daily["day"] in dates and daily["requests"] == 2

    assert (
        httpx.post(
            api + "/keys/from-api/revoke", headers={"Content-Type": "application/json"}
        ).json()["state"]
        == "revoked"
    )

    # Bad input is named, nothing is created.
    dup = httpx.post(api + "/keys", json={"name": "everything"})
    assert dup.status_code in (201, 409)
    bad = httpx.post(api + "/keys", json={"name": "x", "budget_tokens": 10})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "budget_tokens"
    assert (
        httpx.post(api + "/keys", json={"name": "x", "rpm": "fast"}).json()["error"]["param"]
        == "rpm"
    )
    assert httpx.post(api + "/keys", json={"nme": "x"}).json()["error"]["param"] == "nme"
    assert (
        httpx.post(api + "/keys", json={"name": "x", "admin": "yes"}).json()["error"]["param"]
        == "admin"
    )
    assert (
        httpx.post(
            api + "/keys", content=b"{", headers={"Content-Type": "application/json"}
        ).json()["error"]["code"]
        == "invalid_json"
    )
    assert (
        httpx.post(
            api + "/keys/nobody/revoke", headers={"Content-Type": "application/json"}
        ).status_code
        == 404
    )
    assert httpx.get(api + "/usage", params={"by": "color"}).json()["error"]["param"] == "by"
    for route in ("/usage", "/usage/requests"):
        blank = httpx.get(api + route, params={"key": " "})
        assert blank.status_code == 400, blank.text
        assert "is empty; give a key id, name or prefix" in blank.json()["error"]["message"]
    both = httpx.get(api + "/usage", params={"by": "hour,day"})
    assert both.status_code == 400 and "hour or day, not both" in both.json()["error"]["message"]
    assert (
        httpx.get(api + "/usage", params={"since": "yesterday"}).json()["error"]["param"] == "since"
    )
    assert "x" not in [k["name"] for k in httpx.get(api + "/keys").json()["keys"]]
