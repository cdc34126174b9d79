"""The catalog admin routes over httpx's ASGI transport: a real catalog on a real SQLite store.

Only the reconciler's side (`ModelControl`) is a test double, recording what it was asked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from llmgw.control.adminapi import model_routes
from llmgw.control.catalog import Catalog, CatalogModel, model_to_dict, parse_model
from llmgw.store import Store, open_store, store_url

CONFIG_FILE = "llmgw.yaml"


def body(name: str, **fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": name,
        "weights": f"/models/{name}",
        "profiles": [{"name": "tp1", "engine": "vllm", "gpus": 1}],
    }
    data.update(fields)
    return data


class RecordingControl:
    """A `ModelControl` that answers canned views and records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def status(self, name: str) -> dict[str, object]:
        self.calls.append(("status", name))
        return {"state": "idle", "ready_replicas": 0, "desired_replicas": 0}

    def statuses(self) -> dict[str, dict[str, object]]:
        self.calls.append(("statuses", ""))
        listed = {"state": "idle", "ready_replicas": 0, "desired_replicas": 0}
        return {"gemma": listed, "llama": listed}

    def explain(self, name: str) -> dict[str, object]:
        self.calls.append(("explain", name))
        return {"model": name, "placeable": False, "profiles": [], "summary": "no nodes"}

    def dry_run(self, model: CatalogModel) -> dict[str, object]:
        self.calls.append(("dry_run", model.name))
        return {"model": model.name, "placeable": True, "gpus": model.profiles[0].gpus}

    async def activate(self, name: str) -> dict[str, object]:
        self.calls.append(("activate", name))
        return {"state": "ready", "error": None}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await open_store(store_url(tmp_path / "data", None))
    try:
        await opened.upgrade()
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def control() -> RecordingControl:
    return RecordingControl()


def config_model() -> CatalogModel:
    return parse_model(body("gemma", aliases=["gemma-3"]), source="config")


@pytest.fixture
async def catalog(store: Store) -> Catalog:
    await store.catalog.put("broken", body("broken", max_replicas=0), create=True)
    catalog = Catalog(repo=store.catalog, config_models=[config_model()], config_file=CONFIG_FILE)
    assert len(await catalog.load()) == 1
    return catalog


def client_for(catalog: Catalog, control: RecordingControl) -> httpx.AsyncClient:
    app = Starlette(routes=model_routes(catalog=catalog, control=control))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://admin")


@pytest.fixture
async def client(catalog: Catalog, control: RecordingControl) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(catalog, control) as client:
        yield client


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == ("api_error" if status >= 500 else "invalid_request_error")
    return error


# ---- reading ----


async def test_list_shows_every_model_with_source_status_and_the_skipped(
    client: httpx.AsyncClient, control: RecordingControl
) -> None:
    await client.post("/admin/api/models", json=body("llama"))
    control.calls.clear()
    response = await client.get("/admin/api/models")
    assert response.status_code == 200
    listed = response.json()
    assert [(m["name"], m["source"]) for m in listed["models"]] == [
        ("gemma", "config"),
        ("llama", "store"),
    ]
    gemma = listed["models"][0]
    assert gemma == {
        **model_to_dict(config_model()),
        "source": "config",
        "status": {"state": "idle", "ready_replicas": 0, "desired_replicas": 0},
        "adapters": [],
    }
    assert [s["name"] for s in listed["skipped"]] == ["broken"]
    assert "no longer validates" in listed["skipped"][0]["reason"]
    assert ("statuses", "") in control.calls  # one pass over the fleet, not one per model
    assert not [c for c in control.calls if c[0] == "status"]


async def test_show_by_name_or_alias_and_unknown(client: httpx.AsyncClient) -> None:
    by_alias = await client.get("/admin/api/models/gemma-3")
    assert by_alias.status_code == 200
    assert by_alias.json()["name"] == "gemma" and by_alias.json()["aliases"] == ["gemma-3"]
    error = error_of(await client.get("/admin/api/models/ghost"), 404)
    assert (error["code"], error["param"]) == ("model_not_found", "name")
    assert "'ghost' is not in the catalog" in error["message"]


# ---- adding ----


async def test_add_stores_the_model_and_answers_201(
    client: httpx.AsyncClient, store: Store, catalog: Catalog
) -> None:
    response = await client.post(
        "/admin/api/models", json=body("llama", aliases=["l3"], keep_alive="10m")
    )
    assert response.status_code == 201
    answer = response.json()
    assert (answer["name"], answer["source"], answer["keep_alive"]) == ("llama", "store", 600)
    assert answer["status"]["state"] == "idle"
    stored = await store.catalog.get("llama")
    assert stored is not None and stored.spec["aliases"] == ["l3"]
    assert catalog.resolve("l3") == "llama"


async def test_an_invalid_model_names_the_field_in_param(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/admin/api/models", json=body("llama", profiles=[{"name": "tp1", "engine": "sglang"}])
    )
    error = error_of(response, 400)
    assert (error["code"], error["param"]) == ("invalid_model", "profiles.0.gpus")
    assert error["message"].startswith(
        "model 'llama', profile 'tp1', field 'gpus': sglang needs at least 1 GPU"
    )
    unknown_field = error_of(await client.post("/admin/api/models", json=body("x", gpus=1)), 400)
    assert unknown_field["param"] == "gpus"
    not_object = error_of(await client.post("/admin/api/models", json=["llama"]), 400)
    assert (not_object["code"], not_object["param"]) == ("invalid_model", None)


@pytest.mark.parametrize("raw", [b"{not json", b"", b"  "])
async def test_bad_json_is_refused(client: httpx.AsyncClient, raw: bytes) -> None:
    error = error_of(await client.post("/admin/api/models", content=raw), 400)
    assert (error["code"], error["param"]) == ("invalid_json", None)


async def test_conflicts_answer_409(client: httpx.AsyncClient) -> None:
    assert (await client.post("/admin/api/models", json=body("llama"))).status_code == 201
    again = error_of(await client.post("/admin/api/models", json=body("llama")), 409)
    assert (again["code"], again["param"]) == ("model_exists", "name")
    config = error_of(await client.post("/admin/api/models", json=body("gemma")), 409)
    assert config["code"] == "model_exists"
    assert f"declared in the config file {CONFIG_FILE}" in config["message"]
    clash = error_of(
        await client.post("/admin/api/models", json=body("x", aliases=["gemma-3"])), 409
    )
    assert clash["code"] == "name_taken"
    assert "'gemma-3' is already an alias of model 'gemma'" in clash["message"]


async def test_without_a_store_writes_answer_no_store(control: RecordingControl) -> None:
    catalog = Catalog(repo=None, config_models=[config_model()], config_file=CONFIG_FILE)
    async with client_for(catalog, control) as client:
        error = error_of(await client.post("/admin/api/models", json=body("llama")), 409)
        assert error["code"] == "no_store"
        assert "would vanish at the next restart" in error["message"]
        listed = (await client.get("/admin/api/models")).json()
        assert [m["name"] for m in listed["models"]] == ["gemma"] and listed["skipped"] == []


async def test_names_with_slashes(client: httpx.AsyncClient, control: RecordingControl) -> None:
    name = "meta-llama/Llama-3.1-8B:fp8"
    assert (await client.post("/admin/api/models", json=body(name))).status_code == 201
    shown = await client.get(f"/admin/api/models/{name}")
    assert shown.status_code == 200 and shown.json()["name"] == name
    assert (await client.get(f"/admin/api/models/{name}/placement")).status_code == 200
    assert ("explain", name) in control.calls
    removed = await client.delete(f"/admin/api/models/{name}")
    assert removed.status_code == 200 and removed.json()["name"] == name


# ---- replacing ----


async def test_replace_by_name_or_alias(client: httpx.AsyncClient, store: Store) -> None:
    await client.post("/admin/api/models", json=body("llama", aliases=["l3"]))
    changed = body("llama", max_replicas=3)
    del changed["name"]  # the path names the model
    response = await client.put("/admin/api/models/l3", json=changed)
    assert response.status_code == 200
    assert (response.json()["max_replicas"], response.json()["aliases"]) == (3, [])
    stored = await store.catalog.get("llama")
    assert stored is not None and stored.spec["max_replicas"] == 3


async def test_replace_refusals(client: httpx.AsyncClient) -> None:
    await client.post("/admin/api/models", json=body("llama"))
    renamed = error_of(await client.put("/admin/api/models/llama", json=body("llama-2")), 400)
    assert (renamed["code"], renamed["param"]) == ("invalid_model", "name")
    assert "cannot be renamed" in renamed["message"]
    invalid = error_of(
        await client.put("/admin/api/models/llama", json=body("llama", min_replicas=-1)), 400
    )
    assert invalid["param"] == "min_replicas"
    config = error_of(await client.put("/admin/api/models/gemma", json=body("gemma")), 409)
    assert (config["code"], config["param"]) == ("model_read_only", "name")
    assert f"declared in the config file {CONFIG_FILE}" in config["message"]
    unknown = error_of(await client.put("/admin/api/models/ghost", json=body("ghost")), 404)
    assert unknown["code"] == "model_not_found"
    bad_json = error_of(await client.put("/admin/api/models/llama", content=b"[1,"), 400)
    assert bad_json["code"] == "invalid_json"


async def test_the_queue_wait_target_is_stored_shown_replaced_and_checked(
    client: httpx.AsyncClient, store: Store
) -> None:
    added = await client.post(
        "/admin/api/models", json=body("llama", max_replicas=3, target_queue_wait=2)
    )
    assert added.status_code == 201, added.text
    assert added.json()["target_queue_wait"] == 2
    stored = await store.catalog.get("llama")
    assert stored is not None and stored.spec["target_queue_wait"] == 2
    replaced = await client.put(
        "/admin/api/models/llama", json=body("llama", max_replicas=3, target_queue_wait=0.5)
    )
    assert replaced.status_code == 200, replaced.text
    assert (await client.get("/admin/api/models/llama")).json()["target_queue_wait"] == 0.5
    for bad, says in ((0, "greater than 0"), (-1, "greater than 0"), ("2s", "valid number")):
        for sent in (
            client.post("/admin/api/models", json=body("other", target_queue_wait=bad)),
            client.put("/admin/api/models/llama", json=body("llama", target_queue_wait=bad)),
        ):
            error = error_of(await sent, 400)
            assert (error["code"], error["param"]) == ("invalid_model", "target_queue_wait")
            assert error["message"].startswith("model ")
            assert "field 'target_queue_wait'" in error["message"] and says in error["message"]
    # Nothing refused was stored.
    assert (await client.get("/admin/api/models/llama")).json()["target_queue_wait"] == 0.5
    assert await store.catalog.get("other") is None


async def test_a_skipped_model_can_be_replaced(client: httpx.AsyncClient) -> None:
    response = await client.put("/admin/api/models/broken", json=body("broken"))
    assert response.status_code == 200
    listed = (await client.get("/admin/api/models")).json()
    assert "broken" in [m["name"] for m in listed["models"]] and listed["skipped"] == []


# ---- removing ----


async def test_remove_returns_the_removed_model(client: httpx.AsyncClient, store: Store) -> None:
    await client.post("/admin/api/models", json=body("llama", aliases=["l3"]))
    response = await client.delete("/admin/api/models/l3")
    assert response.status_code == 200
    assert response.json() == {
        **model_to_dict(parse_model(body("llama", aliases=["l3"]))),
        "source": "store",
    }
    assert await store.catalog.get("llama") is None
    assert (await client.get("/admin/api/models/llama")).status_code == 404


async def test_remove_refusals_and_discarding_a_skipped_model(
    client: httpx.AsyncClient, store: Store
) -> None:
    config = error_of(await client.delete("/admin/api/models/gemma-3"), 409)
    assert config["code"] == "model_read_only"
    assert error_of(await client.delete("/admin/api/models/ghost"), 404)["code"] == (
        "model_not_found"
    )
    discarded = await client.delete("/admin/api/models/broken")
    assert discarded.status_code == 200
    assert discarded.json()["discarded"] is True
    assert "no longer validates" in discarded.json()["reason"]
    assert await store.catalog.get("broken") is None


# ---- placement and activation ----


async def test_placement_explains_the_canonical_model(
    client: httpx.AsyncClient, control: RecordingControl
) -> None:
    response = await client.get("/admin/api/models/gemma-3/placement")
    assert response.status_code == 200 and response.json()["summary"] == "no nodes"
    assert ("explain", "gemma") in control.calls
    error = error_of(await client.get("/admin/api/models/ghost/placement"), 404)
    assert error["code"] == "model_not_found"


async def test_dry_run_validates_and_stores_nothing(
    client: httpx.AsyncClient, control: RecordingControl, catalog: Catalog
) -> None:
    response = await client.post(
        "/admin/api/placement/dry-run", json=body("big", profiles=[{"engine": "vllm", "gpus": 8}])
    )
    assert response.status_code == 200
    assert response.json() == {"model": "big", "placeable": True, "gpus": 8}
    assert ("dry_run", "big") in control.calls and catalog.get("big") is None
    # The name of a model in the catalog is fine: nothing is added.
    assert (
        await client.post("/admin/api/placement/dry-run", json=body("gemma"))
    ).status_code == 200
    invalid = error_of(
        await client.post("/admin/api/placement/dry-run", json=body("big", profiles=[])), 400
    )
    assert (invalid["code"], invalid["param"]) == ("invalid_model", "profiles")
    assert (
        error_of(await client.post("/admin/api/placement/dry-run", content=b"x"), 400)["code"]
        == "invalid_json"
    )


async def test_activate(client: httpx.AsyncClient, control: RecordingControl) -> None:
    response = await client.post("/admin/api/models/gemma-3/activate")
    assert response.status_code == 200 and response.json()["state"] == "ready"
    assert ("activate", "gemma") in control.calls
    error = error_of(await client.post("/admin/api/models/ghost/activate"), 404)
    assert error["code"] == "model_not_found"
    assert ("activate", "ghost") not in control.calls


async def test_the_model_list_pages_and_filters_on_the_server(client: httpx.AsyncClient) -> None:
    for name in ("alpha", "beta", "delta"):
        assert (await client.post("/admin/api/models", json=body(name))).status_code == 201
    first = (await client.get("/admin/api/models", params={"limit": 2})).json()
    assert [m["name"] for m in first["models"]] == ["alpha", "beta"]
    assert (first["total"], first["next_after"]) == (4, "beta")
    rest = (await client.get("/admin/api/models", params={"limit": 2, "after": "beta"})).json()
    assert [m["name"] for m in rest["models"]] == ["delta", "gemma"]
    assert rest["next_after"] is None
    # Aliases are searched too: gemma is also "gemma-3".
    found = (await client.get("/admin/api/models", params={"q": "GEMMA-3"})).json()
    assert [m["name"] for m in found["models"]] == ["gemma"] and found["total"] == 1
    bad = error_of(await client.get("/admin/api/models", params={"limit": "many"}), 400)
    assert (bad["param"], bad["code"]) == ("limit", "invalid_parameter")
