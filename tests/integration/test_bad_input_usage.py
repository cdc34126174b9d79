"""Bad input loses nobody's usage: through the real `llmgw server` on SQLite and PostgreSQL.

A tenant sends model names the usage store cannot hold (300 characters, a NUL)
on every API, with the official SDKs and raw HTTP, while other tenants'
requests are recorded in the same batches; and the store itself refuses one
record (a trigger, as a database refuses a value for its own reasons). Every
refusal is a 400 naming the field, the refused requests are recorded with the
name cleaned, and no neighbour's record is lost.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import asyncpg
import httpx
import openai
import pytest
from procs import Server, Sim, wait_for
from sqlalchemy import text

from llmgw.store import store_url
from llmgw.store.engine import make_engine
from llmgw.store.urls import normalize_url

PG = os.environ.get("LLMGW_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
LONG = "m" * 300
NUL = "m1\x00evil"
CHAT = {"messages": [{"role": "user", "content": "Write about the sea"}], "max_tokens": 4}
# The records of requests with this id are refused by the database itself.
POISON = "poison-0c2f9d1e"
POISON_SQL = {
    "sqlite": [
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON usage_records "
        f"WHEN NEW.request_id = '{POISON}' BEGIN SELECT RAISE(ABORT, 'poison refused'); END"
    ],
    "postgresql": [
        "CREATE FUNCTION refuse_poison() RETURNS trigger AS $$ BEGIN "
        f"IF NEW.request_id = '{POISON}' THEN RAISE EXCEPTION 'poison refused'; END IF; "
        "RETURN NEW; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON usage_records "
        "FOR EACH ROW EXECUTE FUNCTION refuse_poison()",
    ],
}


@dataclass
class Gateway:
    kind: str
    server: Server
    store: str
    keys: dict[str, tuple[str, str]]  # name -> (id, secret)

    def key(self, name: str) -> str:
        return self.keys[name][1]

    def records(self, name: str) -> list[dict[str, Any]]:
        key_id = self.keys[name][0]
        resp = httpx.get(
            f"{self.server.admin}/admin/api/usage/requests",
            params={"key": key_id, "limit": 1000},
            timeout=10,
        )
        assert resp.status_code == 200, resp.text
        found: list[dict[str, Any]] = resp.json()["requests"]
        return found

    def dropped(self, reason: str) -> float:
        for line in self.server.metrics().splitlines():
            if line.startswith(f'llmgw_usage_dropped_total{{reason="{reason}"}}'):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


async def _execute(url: str, schema: str | None, statements: list[str]) -> None:
    engine = make_engine(normalize_url(url), schema=schema)
    try:
        async with engine.begin() as conn:
            for statement in statements:
                await conn.execute(text(statement))
    finally:
        await engine.dispose()


async def _pg(sql: str) -> None:
    conn = await asyncpg.connect(PG)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    kind: str = request.param
    data_dir = tmp_path_factory.mktemp(f"data-{kind}")
    database = ""
    if kind == "postgresql":
        database = f"llmgw_t_{secrets.token_hex(4)}"
        try:
            asyncio.run(_pg(f"CREATE DATABASE {database}"))
        except OSError as exc:
            pytest.fail(f"PostgreSQL is not running on 127.0.0.1:5432 ({exc})")
        store = f"{PG.rsplit('/', 1)[0]}/{database}"
    else:
        store = store_url(data_dir, None)
    config = data_dir / "llmgw.yaml"
    # Records of several requests (and tenants) share a batch.
    config.write_text("auth: {refresh_interval: 0.2}\nusage: {flush_interval: 0.5}\n")
    sim = Sim("--zero-delay", model="m1")
    store_args = ["--store", store] if kind == "postgresql" else []
    server = Server(
        "--endpoint",
        f"s={sim.url}=m1",
        "--config",
        str(config),
        *store_args,
        auth=True,
        data_dir=data_dir,
    )
    try:
        keys = {}
        for name in ("attacker", "neighbour"):
            body: dict[str, object] = {"name": name}
            made = httpx.post(f"{server.admin}/admin/api/keys", json=body, timeout=10).json()
            keys[name] = (made["id"], made["secret"])
        asyncio.run(_execute(store, None, POISON_SQL[kind]))
        yield Gateway(kind, server, store, keys)
    finally:
        server.proc.stop()
        sim.proc.stop()
        if database:
            asyncio.run(_pg(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"))


def openai_error(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 400, resp.text
    error: dict[str, Any] = resp.json()["error"]
    assert error["param"] == "model" and error["type"] == "invalid_request_error", error
    return error


def anthropic_error(resp: httpx.Response) -> str:
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    message: str = body["error"]["message"]
    return message


BODIES: dict[str, dict[str, object]] = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": {"prompt": "The sea", "max_tokens": 4},
    "/v1/embeddings": {"input": "The sea"},
    "/v1/responses": {"input": "Write about the sea", "max_output_tokens": 4},
    "/v1/rerank": {"query": "sea", "documents": ["the sea", "a tree"]},
    "/tokenize": {"prompt": "The sea"},
}
ANTHROPIC = {
    "/v1/messages": {**CHAT, "max_tokens": 4},
    "/v1/messages/count_tokens": {"messages": CHAT["messages"]},
}


def test_every_api_refuses_a_model_the_store_cannot_hold(gateway: Gateway) -> None:
    headers = {"Authorization": f"Bearer {gateway.key('attacker')}"}
    with httpx.Client(base_url=gateway.server.url, headers=headers, timeout=30) as client:
        for path, body in BODIES.items():
            for model in (LONG, NUL, ""):
                error = openai_error(client.post(path, json={**body, "model": model}))
                # Each API names the field in its own style.
                label = "model: " if path == "/v1/responses" else "'model' "
                assert error["message"].startswith(label), (path, error)
                if model == LONG:
                    assert "300 characters long; a model name has at most 256" in error["message"]
                elif model == NUL:
                    assert "non-printable character U+0000 at position 2" in error["message"]
        for path, body in ANTHROPIC.items():
            for model in (LONG, NUL):
                message = anthropic_error(client.post(path, json={**body, "model": model}))
                assert message.startswith("model: "), (path, message)
        # The model part of an audio upload (multipart/form-data).
        for model in (LONG, NUL):
            resp = client.post(
                "/v1/audio/transcriptions",
                files={"file": ("a.wav", b"\x00" * 64)},
                data={"model": model},
            )
            assert "a model name" in openai_error(resp)["message"]
        # A Responses body the translation refuses for another field still gets
        # the model's error, not a pass to native engines.
        resp = client.post(
            "/v1/responses", json={"model": NUL, "input": "x", "previous_response_id": "r"}
        )
        assert "non-printable" in openai_error(resp)["message"]


def test_the_official_sdks_get_the_400_naming_the_field(gateway: Gateway) -> None:
    url = gateway.server.url
    with openai.OpenAI(base_url=url + "/v1", api_key=gateway.key("attacker"), max_retries=0) as c:
        with pytest.raises(openai.BadRequestError) as refused:
            c.chat.completions.create(model=LONG, messages=[{"role": "user", "content": "hi"}])
        assert refused.value.param == "model"
        assert "at most 256" in refused.value.message
    with (
        anthropic.Anthropic(base_url=url, api_key=gateway.key("attacker"), max_retries=0) as a,
        pytest.raises(anthropic.BadRequestError, match="model: contains the non-printable"),
    ):
        a.messages.create(model=NUL, max_tokens=4, messages=[{"role": "user", "content": "x"}])


def test_refusals_are_recorded_cleaned_and_neighbours_keep_their_usage(
    gateway: Gateway,
) -> None:
    attacker = {"Authorization": f"Bearer {gateway.key('attacker')}"}
    neighbour = {"Authorization": f"Bearer {gateway.key('neighbour')}"}
    with httpx.Client(base_url=gateway.server.url, timeout=30) as client:
        # Interleaved, so bad and good records share batches.
        for i in range(5):
            bad = {**CHAT, "model": NUL if i % 2 else LONG + "\x07"}
            assert (
                client.post("/v1/chat/completions", json=bad, headers=attacker).status_code == 400
            )
            good = {**CHAT, "model": "m1"}
            served = client.post(
                "/v1/chat/completions",
                json=good,
                headers={**neighbour, "x-request-id": f"neighbour-{gateway.kind}-{i}"},
            )
            assert served.status_code == 200, served.text

    def neighbours() -> list[dict[str, Any]] | None:
        prefix = f"neighbour-{gateway.kind}-"
        rows = [r for r in gateway.records("neighbour") if r["request_id"].startswith(prefix)]
        return rows if len(rows) == 5 else None

    def refusals() -> list[dict[str, Any]] | None:
        rows = [
            r
            for r in gateway.records("attacker")
            if r["route"] == "/v1/chat/completions" and r["status"] == 400
        ]
        return rows if len(rows) >= 5 else None

    mine = wait_for(neighbours, "the neighbour's five records")
    assert all(r["status"] == 200 and r["completion_tokens"] == 4 for r in mine)
    models = {r["model"] for r in wait_for(refusals, "the attacker's refusals")}
    assert "m1\\x00evil" in models
    cut = [m for m in models if m.startswith("mmm")]
    assert cut and all(len(m) == 256 and m.endswith("...") for m in cut)
    assert gateway.dropped("refused") == 0 and gateway.dropped("write_failed") == 0


def test_a_record_the_database_refuses_costs_only_itself(gateway: Gateway) -> None:
    neighbour = {"Authorization": f"Bearer {gateway.key('neighbour')}"}
    with httpx.Client(base_url=gateway.server.url, timeout=30) as client:
        ids = [f"beside-{gateway.kind}-{i}" for i in range(4)]
        for request_id in (ids[0], ids[1], POISON, ids[2], ids[3]):
            resp = client.post(
                "/v1/chat/completions",
                json={**CHAT, "model": "m1"},
                headers={**neighbour, "x-request-id": request_id},
            )
            assert resp.status_code == 200, resp.text
    wait_for(lambda: gateway.dropped("refused") == 1, "the poisoned record to be dropped")
    landed = {r["request_id"] for r in gateway.records("neighbour")}
    assert set(ids) <= landed and POISON not in landed
    assert gateway.dropped("write_failed") == 0
    log = gateway.server.proc.output()
    assert f"usage record dropped, the store cannot write it: request {POISON}" in log
    assert "poison refused" in log


def test_request_ids_that_are_not_visible_ascii_are_replaced(gateway: Gateway) -> None:
    """Raw HTTP: a request id is echoed and stored; anything but visible ASCII is
    replaced by a fresh one instead of reaching the store."""
    host, port = "127.0.0.1", gateway.server.port
    body = b'{"model": "m1", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}'
    secret = gateway.key("neighbour").encode()
    for bad in (b"a b", "caf\u00e9".encode("latin-1"), b"x" * 129):
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
                b"Authorization: Bearer " + secret + b"\r\n"
                b"Content-Type: application/json\r\nx-request-id: " + bad + b"\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        head = answer.split(b"\r\n\r\n", 1)[0].lower()
        assert head.startswith(b"http/1.1 200"), answer[:200]
        echoed = next(v for k, v in (line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
                      if k == b"x-request-id")  # fmt: skip
        assert echoed != bad.lower() and len(echoed) == 36  # a fresh UUID
