"""LoRA adapters as catalog entries over a real store: the rules tying an adapter to its
base, where each is listed, and what a base with adapters may no longer do."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from store_fixtures import (  # noqa: F401
    FakeClock,
    StoreTarget,
    clock_fixture,
    store_fixture,
    target_fixture,
)

from llmgw.control.catalog import (
    Catalog,
    CatalogModel,
    HasAdapters,
    InvalidModel,
    model_to_dict,
    parse_model,
)
from llmgw.store import Store

CONFIG_FILE = "/etc/llmgw/llmgw.yaml"
SLOTS = {"max_loaded": 2, "max_rank": 16}


def base(name: str, *, slots: bool = True, **fields: Any) -> dict[str, Any]:
    profile: dict[str, Any] = {"name": "cpu", "engine": "sim"}
    if slots:
        profile["adapters"] = SLOTS
    return {"name": name, "weights": f"/models/{name}", "profiles": [profile], **fields}


def adapter(name: str, of: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "adapter_of": of, "weights": f"/adapters/{name}", **fields}


def make(data: dict[str, Any]) -> CatalogModel:
    return parse_model(data, source="store")


def refused(data: object) -> InvalidModel:
    with pytest.raises(InvalidModel) as info:
        parse_model(data)
    return info.value


@pytest.fixture
async def catalog(store: Store) -> Catalog:
    catalog = Catalog(
        repo=store.catalog,
        config_models=[
            parse_model(base("llama"), source="config"),
            parse_model(base("plain", slots=False), source="config"),
        ],
        config_file=CONFIG_FILE,
    )
    assert await catalog.load() == []
    return catalog


@pytest.fixture
async def second_store(store_target: StoreTarget, store: Store) -> AsyncIterator[Store]:
    opened = await store_target.open()
    try:
        yield opened
    finally:
        await opened.close()


# ---- the entry itself ----


def test_an_adapter_reads_back_to_itself_with_only_its_own_fields() -> None:
    sql = parse_model(adapter("sql", "llama", aliases=["sql-v1"]))
    assert sql.adapter_of == "llama" and sql.profiles == ()
    assert model_to_dict(sql) == {
        "name": "sql",
        "adapter_of": "llama",
        "aliases": ["sql-v1"],
        "weights": "/adapters/sql",
    }
    assert parse_model(model_to_dict(sql)) == sql


def test_an_adapter_with_profiles_or_replica_fields_is_refused_naming_the_field() -> None:
    profiles = refused({**adapter("sql", "llama"), "profiles": [{"engine": "sim"}]})
    assert profiles.field == "profiles"
    assert "runs in its base model's replicas" in str(profiles)
    scaling = refused({**adapter("sql", "llama"), "min_replicas": 1})
    assert "field 'min_replicas' is not for an adapter" in str(scaling)
    assert "'llama'" in str(scaling)
    itself = refused(adapter("sql", "sql"))
    assert itself.field == "adapter_of"


def test_a_model_without_profiles_or_adapter_of_is_told_what_it_needs() -> None:
    error = refused({"name": "m", "weights": "/m"})
    assert error.field == "profiles"
    assert "at least one profile" in str(error) and "adapter_of" in str(error)


# ---- adding, listing, restarting ----


async def test_an_added_adapter_is_listed_under_its_base_and_kept(
    catalog: Catalog, second_store: Store
) -> None:
    added = await catalog.add(make(adapter("sql", "llama", aliases=["sql-v1"])))
    assert added.source == "store"
    assert [a.name for a in catalog.adapters("llama")] == ["sql"]
    assert catalog.adapters("plain") == []
    # Not a model of its own: the reconciler never sees it.
    assert [m.name for m in catalog.models()] == ["llama", "plain"]
    assert catalog.get("sql") is None
    entry = catalog.entry("sql-v1")
    assert entry is not None and entry.name == "sql" and entry.adapter_of == "llama"
    assert catalog.resolve("sql-v1") == "sql"
    restarted = Catalog(
        repo=second_store.catalog,
        config_models=[parse_model(base("llama"), source="config")],
        config_file=CONFIG_FILE,
    )
    assert await restarted.load() == []
    assert [a.name for a in restarted.adapters()] == ["sql"]


async def test_an_adapter_needs_a_base_that_takes_adapters(catalog: Catalog) -> None:
    for data, words in (
        (adapter("a", "nope"), "its base model 'nope' is not in the catalog"),
        (adapter("a", "plain"), "no profile of its base model 'plain' takes adapters"),
    ):
        with pytest.raises(InvalidModel) as info:
            await catalog.add(make(data))
        assert info.value.field == "adapter_of"
        assert words in info.value.message
    await catalog.add(make(adapter("sql", "llama")))
    with pytest.raises(InvalidModel) as stacked:
        await catalog.add(make(adapter("a", "sql")))
    assert "'sql' is itself an adapter (of 'llama')" in stacked.value.message
    assert [a.name for a in catalog.adapters()] == ["sql"]


async def test_a_base_with_adapters_is_not_removed_nor_stripped_of_its_slots(
    catalog: Catalog,
) -> None:
    await catalog.add(make(base("qwen")))
    await catalog.add(make(adapter("b-lora", "qwen")))
    await catalog.add(make(adapter("a-lora", "qwen")))
    with pytest.raises(HasAdapters) as info:
        await catalog.remove("qwen")
    assert "'a-lora', 'b-lora'" in info.value.message
    assert "remove them first" in info.value.message
    with pytest.raises(InvalidModel) as stripped:
        await catalog.replace("qwen", make(base("qwen", slots=False)))
    assert stripped.value.field == "profiles"
    assert "'a-lora', 'b-lora'" in stripped.value.message
    assert catalog.get("qwen") is not None
    # Replacing an adapter with a new path is fine; once they are gone the base goes.
    moved = await catalog.replace("a-lora", make({**adapter("a-lora", "qwen"), "weights": "/x"}))
    assert moved.weights == "/x"
    await catalog.remove("a-lora")
    await catalog.remove("b-lora")
    await catalog.remove("qwen")
    assert catalog.get("qwen") is None and catalog.adapters() == []


# ---- the config file ----


def test_a_config_adapter_without_its_base_names_the_file() -> None:
    with pytest.raises(InvalidModel) as info:
        Catalog(
            repo=None,
            config_models=[
                parse_model(base("plain", slots=False), source="config"),
                parse_model(adapter("sql", "plain"), source="config"),
            ],
            config_file=CONFIG_FILE,
        )
    assert info.value.field == "adapter_of"
    assert "no profile of its base model 'plain' takes adapters" in info.value.message
    assert CONFIG_FILE in info.value.message


async def test_a_stored_adapter_whose_base_left_the_config_file_is_skipped(
    catalog: Catalog,
) -> None:
    await catalog.add(make(adapter("sql", "llama")))
    await catalog.reload_config([parse_model(base("plain", slots=False), source="config")])
    assert catalog.adapters() == []
    reason = catalog.skipped()["sql"]
    assert "its base model 'llama' is not in the catalog" in reason
    # The base back in the file brings the adapter back.
    await catalog.reload_config([parse_model(base("llama"), source="config")])
    assert [a.name for a in catalog.adapters("llama")] == ["sql"]
    assert catalog.skipped() == {}
