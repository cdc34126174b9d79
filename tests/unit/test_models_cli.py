"""`llmgw models` against a real admin server on loopback (real catalog, real SQLite store).

Files that cannot be a model are refused before any request, naming the file.
Only the reconciler's side of the server (`ModelControl`) is a test double.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from test_adminapi_models import RecordingControl
from typer.testing import CliRunner

from llmgw.cli.models import models_app
from llmgw.control.adminapi import model_routes
from llmgw.control.catalog import Catalog, CatalogModel, parse_model
from llmgw.store import open_store, store_url

UNREACHABLE = "http://127.0.0.1:9"


class ExplainingControl(RecordingControl):
    def explain(self, name: str) -> dict[str, object]:
        super().explain(name)
        return {
            "model": name,
            "placeable": True,
            "placement": {"node": "node-a", "profile": "tp1", "gpus": [0], "port": 20001},
            "profiles": [
                {
                    "profile": "tp1",
                    "fits": ["node-a"],
                    "rejected": [
                        {"node": "node-b", "reason": "draining"},
                        {"node": "node-long-name", "reason": "1 free GPU, 2 needed"},
                    ],
                }
            ],
            "summary": "model fits on node-a",
        }

    def dry_run(self, model: CatalogModel) -> dict[str, object]:
        super().dry_run(model)
        return {
            "model": model.name,
            "placeable": False,
            "placement": None,
            "profiles": [{"profile": p.name, "fits": [], "rejected": []} for p in model.profiles],
            "summary": f"model '{model.name}' cannot be placed: no nodes",
        }


@pytest.fixture
def admin_url(tmp_path: Path) -> Iterator[str]:
    control = ExplainingControl()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The store lives on the server thread's event loop.
        store = await open_store(store_url(tmp_path / "data", None))
        await store.upgrade()
        gemma = parse_model(
            {"name": "gemma", "weights": "/m/gemma.gguf", "profiles": [{"engine": "llamacpp"}]},
            source="config",
        )
        catalog = Catalog(repo=store.catalog, config_models=[gemma], config_file="llmgw.yaml")
        await catalog.load()
        app.router.routes.extend(model_routes(catalog=catalog, control=control))
        try:
            yield
        finally:
            await store.close()

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(Starlette(lifespan=lifespan), log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "admin server did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(
        models_app, list(args), env={"LLMGW_ADMIN_URL": None, "LLMGW_ADMIN_KEY": None}
    )
    return result.exit_code, result.stdout, result.stderr


# ---- refused before any request ----


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("name: [unclosed\n", "not valid YAML or JSON (line 2, column 1)"),
        ("- name: llama\n", "the file must hold one model as a mapping"),
        (
            "",
            "the file must hold one model as a mapping (name, weights, profiles, ...), not NoneType",
        ),
        ("models:\n  - name: llama\n", "this is a `models:` list; give one model"),
    ],
)
def test_a_file_that_is_not_one_model_is_refused_naming_the_file(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "model.yaml"
    path.write_text(content)
    code, out, err = run("add", "--file", str(path), "--admin", UNREACHABLE)
    assert code == 2 and out == ""
    assert err.startswith(f"error: {path}: {message}")


def test_missing_files_and_mixed_or_missing_flags(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    code, _, err = run("add", "-f", str(missing), "--admin", UNREACHABLE)
    assert code == 2 and err == f"error: {missing}: file not found\n"
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"name": "x"}))
    code, _, err = run("add", "-f", str(path), "--gpus", "1", "--admin", UNREACHABLE)
    assert code == 2 and "either --file or the model flags" in err
    code, _, err = run("add", "--name", "x", "--admin", UNREACHABLE)
    assert code == 2 and err.startswith("error: give --weights, --engine (or --file")


def test_an_unreachable_server_is_exit_code_1() -> None:
    code, _, err = run("list", "--admin", UNREACHABLE)
    assert code == 1 and err.startswith(f"error: cannot reach the admin API at {UNREACHABLE}")


# ---- against the server ----


def test_add_from_a_file_list_show_and_remove(admin_url: str, tmp_path: Path) -> None:
    path = tmp_path / "llama.yaml"
    path.write_text(
        "name: llama\n"
        "aliases: [l3]\n"
        "weights: meta-llama/Meta-Llama-3-8B-Instruct\n"
        "keep_alive: 10m\n"
        "profiles:\n"
        "  - name: tp1\n"
        "    engine: vllm\n"
        "    gpus: 1\n"
        "    gpu_memory: 24GiB\n"
        "    engine_args: [--max-model-len, '8192']\n"
    )
    code, out, err = run("add", "-f", str(path), "--admin", admin_url)
    assert (code, err) == (0, "")
    assert out == "model llama added: it is kept in the server's store\n"

    code, out, _ = run("list", "--admin", admin_url)
    assert code == 0
    header, gemma, llama = out.splitlines()
    assert header.split() == [
        "MODEL",
        "SOURCE",
        "STATE",
        "READY",
        "REPLICAS",
        "KEEP",
        "ALIVE",
        "PROFILES",
        "ALIASES",
    ]
    assert gemma.split()[:2] == ["gemma", "config"]
    assert llama.split()[:6] == ["llama", "store", "idle", "0/0", "0-1", "10m"]
    assert llama.split()[-1] == "l3"

    code, out, _ = run("list", "--json", "--admin", admin_url)
    assert [m["name"] for m in json.loads(out)["models"]] == ["gemma", "llama"]

    code, out, _ = run("show", "l3", "--admin", admin_url)
    assert code == 0
    assert "model:       llama (store)" in out
    assert "GPUs:    1 x 24 GiB" in out and "args:    --max-model-len 8192" in out

    code, out, _ = run("show", "llama", "--json", "--admin", admin_url)
    assert json.loads(out)["profiles"][0]["gpu_memory"] == 24 << 30

    code, out, _ = run("remove", "l3", "--admin", admin_url)
    assert code == 0 and out.startswith("model llama removed from the catalog")
    code, _, err = run("show", "llama", "--admin", admin_url)
    assert code == 2 and err.startswith("error: model 'llama' is not in the catalog")


def test_server_side_errors_name_the_file_model_profile_and_field(
    admin_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: llama\nweights: /m/l\nprofiles:\n  - name: tp1\n    engine: sglang\n")
    code, out, err = run("add", "-f", str(path), "--admin", admin_url)
    assert code == 2 and out == ""
    assert err.startswith(
        f"error: {path}: model 'llama', profile 'tp1', field 'gpus': sglang needs at least 1 GPU"
    )


def test_add_from_flags_replace_and_conflicts(admin_url: str) -> None:
    flags = ["--name", "qwen", "--weights", "Qwen/Qwen2.5-7B", "--engine", "vllm", "--gpus", "1"]
    extra = ["--engine-arg", "--max-model-len", "--engine-arg", "4096", "--keep-alive", "-1"]
    code, out, err = run("add", *flags, *extra, "--alias", "q", "--admin", admin_url)
    assert (code, err) == (0, ""), err
    code, out, _ = run("show", "q", "--json", "--admin", admin_url)
    shown = json.loads(out)
    assert (shown["keep_alive"], shown["aliases"]) == (-1, ["q"])
    assert shown["profiles"][0]["engine_args"] == ["--max-model-len", "4096"]

    code, _, err = run("add", *flags, "--admin", admin_url)
    assert code == 2 and "'qwen' is already in the catalog; replace it" in err
    scaling = ["--max-replicas", "3", "--target-in-flight", "8", "--scale-down-delay", "2m"]
    code, out, _ = run("add", *flags, *scaling, "--replace", "--admin", admin_url)
    assert code == 0 and out.startswith("model qwen replaced")
    code, out, _ = run("show", "qwen", "--admin", admin_url)
    assert "scaling:     one replica per 8 requests in flight, down after 2m of lower load" in out
    code, _, err = run("add", *flags, "--target-in-flight", "0", "--admin", admin_url)
    assert code == 2 and "--target-in-flight" in err
    code, _, err = run("remove", "gemma", "--admin", admin_url)
    assert code == 2 and "declared in the config file llmgw.yaml" in err


def test_the_queue_wait_target_from_flags_is_shown_and_bad_values_name_the_flag(
    admin_url: str,
) -> None:
    flags = ["--name", "qwen", "--weights", "Qwen/Qwen2.5-7B", "--engine", "sim"]
    code, _, err = run("add", *flags, "--target-queue-wait", "1.5", "--admin", admin_url)
    assert (code, err) == (0, ""), err
    code, out, _ = run("show", "qwen", "--admin", admin_url)
    assert (
        "scaling:     one more than are Ready while requests wait over 1.5 s in the routers' "
        "queues, down after 1m of lower load"
    ) in out
    both = ["--target-in-flight", "8", "--target-queue-wait", "3", "--max-replicas", "4"]
    code, out, _ = run("add", *flags, *both, "--replace", "--admin", admin_url)
    assert code == 0 and out.startswith("model qwen replaced")
    code, out, _ = run("show", "qwen", "--json", "--admin", admin_url)
    assert json.loads(out)["target_queue_wait"] == 3
    code, out, _ = run("show", "qwen", "--admin", admin_url)
    assert (
        "scaling:     one replica per 8 requests in flight, or one more than are Ready while "
        "requests wait over 3 s in the routers' queues, down after 1m of lower load"
    ) in out
    for bad in ("0", "-1", "nan", "inf"):
        code, out, err = run("add", *flags, "--target-queue-wait", bad, "--admin", admin_url)
        assert (code, out) == (2, ""), (bad, out, err)
        assert err.startswith("error: --target-queue-wait "), (bad, err)
        assert "a number above 0, e.g. --target-queue-wait 2" in err
    code, _, err = run("add", *flags, "--target-queue-wait", "soon", "--admin", admin_url)
    assert code == 2 and "Invalid value for '--target-queue-wait'" in err, err
    # Refused before any request: the stored model is unchanged.
    code, out, _ = run("show", "qwen", "--json", "--admin", admin_url)
    assert json.loads(out)["target_queue_wait"] == 3


def test_explain_and_dry_run(admin_url: str) -> None:
    code, out, _ = run("explain", "gemma", "--admin", admin_url)
    assert code == 0
    assert out.splitlines() == [
        "model gemma: the next replica goes to node node-a (profile tp1, GPUs 0)",
        "",
        "profile tp1:",
        "  fits:     node-a",
        "  rejected:",
        "    node-b          draining",
        "    node-long-name  1 free GPU, 2 needed",
        "",
        "model fits on node-a",
    ]
    code, out, _ = run(
        "add",
        "--name",
        "big",
        "--weights",
        "/m",
        "--engine",
        "vllm",
        "--gpus",
        "8",
        "--dry-run",
        "--admin",
        admin_url,
    )
    assert code == 0
    assert out.splitlines()[:4] == [
        "model big: no node can take a replica now",
        "",
        "profile vllm:",
        "  fits:     no node",
    ]
    code, out, _ = run("list", "--json", "--admin", admin_url)
    assert "big" not in [m["name"] for m in json.loads(out)["models"]]


def test_a_models_own_routing_is_kept_and_shown(admin_url: str, tmp_path: Path) -> None:
    path = tmp_path / "chat.yaml"
    path.write_text(
        "name: chat\n"
        "weights: /m/chat\n"
        "routing: {scorers: {prefix: 5, session: 0}}\n"
        "profiles:\n"
        "  - name: tp1\n"
        "    engine: vllm\n"
        "    gpus: 1\n"
    )
    code, _, err = run("add", "-f", str(path), "--admin", admin_url)
    assert (code, err) == (0, "")
    code, out, _ = run("show", "chat", "--admin", admin_url)
    assert "routing:     prefix=5 load=2 kv=1 session=0 rendezvous=1" in out
    code, out, _ = run("show", "chat", "--json", "--admin", admin_url)
    assert json.loads(out)["routing"]["scorers"]["prefix"] == 5
    code, out, _ = run("show", "gemma", "--admin", admin_url)
    assert "routing:     the server's (router.routing)" in out
    path.write_text(path.read_text().replace("prefix: 5", "prefix: -1"))
    code, _, err = run("add", "-f", str(path), "--replace", "--admin", admin_url)
    assert code == 2 and "routing" in err and "prefix" in err
    run("remove", "chat", "--admin", admin_url)


def test_a_profile_with_adapter_slots_is_added_and_shown_as_written(
    admin_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "base.yaml"
    path.write_text(
        "name: tuned-base\n"
        "weights: /models/base\n"
        "profiles:\n"
        "  - {name: sim, engine: sim, adapters: {max_loaded: 4, max_rank: 8}}\n"
    )
    code, _, err = run("add", "-f", str(path), "--admin", admin_url)
    assert (code, err) == (0, "")
    code, out, _ = run("show", "tuned-base", "--admin", admin_url)
    assert code == 0
    assert "args:    -\n" in out
    assert "adapters: up to 4 LoRA adapters loaded at once, rank up to 8" in out
    code, out, _ = run("show", "tuned-base", "--json", "--admin", admin_url)
    assert json.loads(out)["profiles"][0]["adapters"] == {"max_loaded": 4, "max_rank": 8}
    path.write_text(
        "name: tuned-cpp\n"
        "weights: /models/base.gguf\n"
        "profiles:\n"
        "  - {name: cpp, engine: llamacpp, adapters: {max_loaded: 2}}\n"
    )
    code, out, err = run("add", "-f", str(path), "--admin", admin_url)
    assert code != 0
    assert "field 'adapters': llamacpp cannot load LoRA adapters at run time" in out + err
