"""The live catalog over a real store (SQLite and PostgreSQL): writes, restarts, conflicts."""

from __future__ import annotations

import asyncio
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
    InvalidModel,
    ModelExists,
    NameTaken,
    NoStore,
    NothingToUndo,
    ReadOnlyModel,
    UnknownModel,
    model_to_dict,
    parse_model,
)
from llmgw.store import Store

CONFIG_FILE = "/etc/llmgw/llmgw.yaml"


def body(name: str, **fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": name,
        "weights": f"/models/{name}",
        "profiles": [{"name": "tp1", "engine": "vllm", "gpus": 1}],
    }
    data.update(fields)
    return data


def make(name: str, **fields: Any) -> CatalogModel:
    return parse_model(body(name, **fields), source="store")


def configured(name: str, **fields: Any) -> CatalogModel:
    return parse_model(body(name, **fields), source="config")


class Changes:
    """A listener that counts the catalog's change notifications."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


@pytest.fixture
async def catalog(store: Store) -> Catalog:
    catalog = Catalog(
        repo=store.catalog,
        config_models=[configured("gemma", aliases=["gemma-3"])],
        config_file=CONFIG_FILE,
    )
    assert await catalog.load() == []
    return catalog


@pytest.fixture
async def second_store(store_target: StoreTarget, store: Store) -> AsyncIterator[Store]:
    """Another connection to the same database: another server, or this one restarted."""
    opened = await store_target.open()
    try:
        yield opened
    finally:
        await opened.close()


# ---- reading ----


async def test_config_models_are_in_force_before_load_and_read_only() -> None:
    catalog = Catalog(
        repo=None,
        config_models=[configured("qwen"), make("gemma", aliases=["g3"])],
        config_file=None,
    )
    assert [(m.name, m.source) for m in catalog.models()] == [
        ("gemma", "config"),
        ("qwen", "config"),
    ]
    gemma = catalog.get("g3")
    assert gemma is not None and gemma.name == "gemma"
    assert catalog.resolve("g3") == "gemma" and catalog.resolve("gemma") == "gemma"
    assert catalog.get("nobody") is None and catalog.resolve("nobody") is None
    assert await catalog.load() == []
    assert not catalog.has_store


async def test_config_models_that_share_a_name_are_a_config_error() -> None:
    with pytest.raises(NameTaken, match=r"model 'a' is declared twice in the config file x.yaml"):
        Catalog(repo=None, config_models=[configured("a"), configured("a")], config_file="x.yaml")
    with pytest.raises(
        NameTaken, match=r"model 'b': its alias 'a' is already the name of model 'a'"
    ):
        Catalog(
            repo=None,
            config_models=[configured("a"), configured("b", aliases=["a"])],
            config_file="x.yaml",
        )


# ---- adding, and what the store keeps ----


async def test_add_writes_the_store_and_puts_the_model_in_force(
    catalog: Catalog, store: Store
) -> None:
    changes = Changes()
    catalog.subscribe(changes)
    added = await catalog.add(make("llama", aliases=["l3"], keep_alive=-1))
    assert added.source == "store"
    assert changes.count == 1
    assert [m.name for m in catalog.models()] == ["gemma", "llama"]
    assert catalog.get("l3") == added
    stored = await store.catalog.get("llama")
    assert stored is not None and stored.spec == model_to_dict(added)


async def test_a_restarted_catalog_has_the_stored_models(
    catalog: Catalog, second_store: Store
) -> None:
    added = await catalog.add(make("llama", aliases=["l3"], min_replicas=1, max_replicas=2))
    restarted = Catalog(
        repo=second_store.catalog,
        config_models=[configured("gemma", aliases=["gemma-3"])],
        config_file=CONFIG_FILE,
    )
    assert restarted.get("llama") is None
    changes = Changes()
    restarted.subscribe(changes)
    assert await restarted.load() == []
    assert restarted.get("l3") == added
    assert [(m.name, m.source) for m in restarted.models()] == [
        ("gemma", "config"),
        ("llama", "store"),
    ]
    assert changes.count == 1
    assert await restarted.load() == [] and changes.count == 1  # nothing new: no notification


async def test_load_again_sees_another_servers_changes(
    catalog: Catalog, second_store: Store
) -> None:
    other = Catalog(repo=second_store.catalog, config_models=[], config_file=None)
    await other.load()
    await other.add(make("qwen"))
    assert catalog.get("qwen") is None
    changes = Changes()
    catalog.subscribe(changes)
    await catalog.load()
    assert catalog.get("qwen") is not None and changes.count == 1
    await other.remove("qwen")
    await catalog.load()
    assert catalog.get("qwen") is None and changes.count == 2


async def test_a_name_cannot_be_added_twice(catalog: Catalog) -> None:
    await catalog.add(make("llama"))
    with pytest.raises(ModelExists, match=r"'llama' is already in the catalog; replace it"):
        await catalog.add(make("llama", max_replicas=3))
    with pytest.raises(
        ModelExists, match=r"'gemma' is already in the catalog, declared in the config file "
    ):
        await catalog.add(make("gemma"))


async def test_concurrent_adds_of_one_name_add_one(catalog: Catalog) -> None:
    results = await asyncio.gather(
        *(catalog.add(make("race", max_replicas=i + 1)) for i in range(3)), return_exceptions=True
    )
    assert sum(isinstance(r, CatalogModel) for r in results) == 1
    assert sum(isinstance(r, ModelExists) for r in results) == 2


async def test_a_failed_store_write_changes_nothing(catalog: Catalog, second_store: Store) -> None:
    # Another server sharing the store adds the name first: the store refuses ours.
    await second_store.catalog.put("llama", body("llama"), create=True)
    changes = Changes()
    catalog.subscribe(changes)
    with pytest.raises(ModelExists, match="added meanwhile by another server"):
        await catalog.add(make("llama", aliases=["l3"]))
    assert catalog.get("llama") is None and catalog.get("l3") is None
    assert changes.count == 0
    # ... and removes it before our replace reaches the store.
    await catalog.load()
    await second_store.catalog.delete("llama")
    with pytest.raises(UnknownModel):
        await catalog.replace("llama", make("llama", max_replicas=4))
    model = catalog.get("llama")
    assert model is not None and model.max_replicas == 1


# ---- names are one namespace ----


@pytest.mark.parametrize(
    ("new", "message"),
    [
        (
            {"name": "gemma-3"},
            "model 'gemma-3': its name 'gemma-3' is already an alias of model 'gemma' "
            "(declared in the config file)",
        ),
        (
            {"name": "x", "aliases": ["gemma"]},
            "model 'x': its alias 'gemma' is already the name of model 'gemma'",
        ),
        (
            {"name": "x", "aliases": ["gemma-3"]},
            "model 'x': its alias 'gemma-3' is already an alias of model 'gemma'",
        ),
        (
            {"name": "x", "aliases": ["l3"]},
            "model 'x': its alias 'l3' is already an alias of model 'llama';",
        ),
    ],
)
async def test_names_and_aliases_collide_in_both_directions(
    catalog: Catalog, new: dict[str, Any], message: str
) -> None:
    await catalog.add(make("llama", aliases=["l3"]))
    fields = dict(new)
    name = fields.pop("name")
    with pytest.raises(NameTaken) as info:
        await catalog.add(make(name, **fields))
    assert info.value.message.startswith(message)
    assert [m.name for m in catalog.models()] == ["gemma", "llama"]


async def test_replace_checks_names_against_the_other_models_only(catalog: Catalog) -> None:
    await catalog.add(make("llama", aliases=["l3"]))
    kept = await catalog.replace("llama", make("llama", aliases=["l3", "llama-3"]))
    assert catalog.get("llama-3") == kept
    with pytest.raises(NameTaken, match="'gemma-3' is already an alias of model 'gemma'"):
        await catalog.replace("llama", make("llama", aliases=["gemma-3"]))
    assert catalog.get("llama") == kept


# ---- replacing and removing ----


async def test_replace_by_name_or_alias(catalog: Catalog, store: Store) -> None:
    await catalog.add(make("llama", aliases=["l3"]))
    changes = Changes()
    catalog.subscribe(changes)
    replaced = await catalog.replace("l3", make("llama", aliases=["llama-3"], max_replicas=4))
    assert changes.count == 1
    assert catalog.get("l3") is None and catalog.get("llama-3") == replaced
    stored = await store.catalog.get("llama")
    assert stored is not None and stored.spec["max_replicas"] == 4


async def test_replace_refuses_renames_unknown_and_config_models(catalog: Catalog) -> None:
    await catalog.add(make("llama"))
    with pytest.raises(InvalidModel, match="a model cannot be renamed") as info:
        await catalog.replace("llama", make("llama-2"))
    assert info.value.field == "name"
    with pytest.raises(UnknownModel, match="'ghost' is not in the catalog"):
        await catalog.replace("ghost", make("ghost"))
    with pytest.raises(
        ReadOnlyModel, match=f"'gemma' is declared in the config file {CONFIG_FILE}"
    ):
        await catalog.replace("gemma-3", make("gemma"))


async def test_remove(catalog: Catalog, store: Store) -> None:
    added = await catalog.add(make("llama", aliases=["l3"]))
    unsubscribe_changes = Changes()
    unsubscribe = catalog.subscribe(unsubscribe_changes)
    assert await catalog.remove("l3") == added
    assert catalog.get("llama") is None and catalog.get("l3") is None
    assert await store.catalog.get("llama") is None
    assert unsubscribe_changes.count == 1
    unsubscribe()
    await catalog.add(make("llama"))
    assert unsubscribe_changes.count == 1
    with pytest.raises(UnknownModel):
        await catalog.remove("ghost")
    with pytest.raises(ReadOnlyModel, match="change or remove it there"):
        await catalog.remove("gemma")
    assert catalog.get("gemma") is not None


# ---- what load() skips ----


async def test_a_stored_model_named_like_a_config_model_is_skipped(store: Store) -> None:
    await store.catalog.put("gemma", body("gemma", max_replicas=5), create=True)
    catalog = Catalog(repo=store.catalog, config_models=[configured("gemma")], config_file=None)
    (warning,) = await catalog.load()
    assert warning.startswith(
        "stored model 'gemma' is skipped: the configuration declares a model of that name, "
        "which wins"
    )
    gemma = catalog.get("gemma")
    assert gemma is not None and (gemma.source, gemma.max_replicas) == ("config", 1)
    assert "which wins" in catalog.skipped()["gemma"]


async def test_an_invalid_stored_model_is_skipped_with_the_reason(store: Store) -> None:
    await store.catalog.put("bad", body("bad", max_replicas=0), create=True)
    await store.catalog.put("odd", body("other"), create=True)
    await store.catalog.put("good", body("good"), create=True)
    catalog = Catalog(repo=store.catalog, config_models=[], config_file=None)
    warnings = await catalog.load()
    assert warnings == [
        "stored model 'bad' is skipped: it no longer validates (model 'bad', field "
        "'max_replicas': Input should be greater than or equal to 1); replace it with a valid "
        "model (`llmgw models add --replace`) or discard it (`llmgw models remove bad`)",
        "stored model 'odd' is skipped: its spec names another model, 'other'; discard it "
        "and add it again",
    ]
    assert [m.name for m in catalog.models()] == ["good"]
    assert set(catalog.skipped()) == {"bad", "odd"}


async def test_stored_models_whose_aliases_clash_are_skipped(store: Store) -> None:
    await store.catalog.put("a", body("a", aliases=["shared"]), create=True)
    await store.catalog.put("b", body("b", aliases=["shared"]), create=True)
    await store.catalog.put("c", body("c", aliases=["cfg"]), create=True)
    catalog = Catalog(repo=store.catalog, config_models=[configured("cfg")], config_file=None)
    warnings = await catalog.load()
    assert [w.split(":")[0] for w in warnings] == [
        "stored model 'b' is skipped",
        "stored model 'c' is skipped",
    ]
    assert "its alias 'shared' is already an alias of model 'a'" in warnings[0]
    assert [m.name for m in catalog.models()] == ["a", "cfg"]


async def test_a_skipped_model_can_be_fixed_or_discarded(store: Store) -> None:
    await store.catalog.put("bad", body("bad", max_replicas=0), create=True)
    await store.catalog.put("worse", body("worse", keep_alive="soon"), create=True)
    catalog = Catalog(repo=store.catalog, config_models=[], config_file=None)
    assert len(await catalog.load()) == 2
    with pytest.raises(ModelExists, match="in the store but not in force"):
        await catalog.add(make("bad"))
    fixed = await catalog.replace("bad", make("bad", max_replicas=2))
    assert catalog.get("bad") == fixed and "bad" not in catalog.skipped()
    assert "no longer validates" in await catalog.discard("worse")
    assert await store.catalog.get("worse") is None and catalog.skipped() == {}
    with pytest.raises(UnknownModel):
        await catalog.discard("worse")


# ---- without a store ----


async def test_without_a_store_writes_are_refused() -> None:
    catalog = Catalog(repo=None, config_models=[configured("gemma")], config_file=CONFIG_FILE)
    with pytest.raises(NoStore) as info:
        await catalog.add(make("llama"))
    assert info.value.message == (
        "model 'llama' cannot be written: this server runs without a store, so a model added "
        "or changed through the admin API would vanish at the next restart; declare it in "
        f"the config file {CONFIG_FILE} instead, or run the server with a store"
    )
    assert catalog.get("llama") is None
    with pytest.raises(ReadOnlyModel):
        await catalog.remove("gemma")
    with pytest.raises(UnknownModel):
        await catalog.replace("llama", make("llama"))


def with_args(name: str, *args: str, **fields: Any) -> CatalogModel:
    profile = {"name": "tp1", "engine": "vllm", "gpus": 1, "engine_args": list(args)}
    return make(name, profiles=[profile], **fields)


async def test_undo_puts_the_previous_spec_back_and_survives_a_restart(
    catalog: Catalog, second_store: Store
) -> None:
    await catalog.add(with_args("llama", "--max-model-len", "8192"))
    assert catalog.previous("llama") is None
    await catalog.replace("llama", with_args("llama", "--max-model-len", "4096"))
    # A change that leaves what runs alone keeps the spec to go back to.
    await catalog.replace("llama", with_args("llama", "--max-model-len", "4096", aliases=["l3"]))
    earlier = catalog.previous("l3")
    assert earlier is not None and earlier.profiles[0].engine_args == ("--max-model-len", "8192")
    restarted = Catalog(repo=second_store.catalog, config_models=[], config_file=None)
    assert await restarted.load() == []
    assert restarted.previous("llama") == earlier

    undone = await restarted.undo("l3")

    assert undone.profiles[0].engine_args == ("--max-model-len", "8192")
    assert undone.aliases == ("l3",)  # only what runs goes back
    assert restarted.get("llama") == undone
    # A second undo goes forward again.
    again = await restarted.undo("llama")
    assert again.profiles[0].engine_args == ("--max-model-len", "4096")


async def test_undo_refuses_what_it_cannot_undo(catalog: Catalog) -> None:
    await catalog.add(make("llama"))
    with pytest.raises(NothingToUndo, match="no earlier spec to go back to"):
        await catalog.undo("llama")
    with pytest.raises(ReadOnlyModel, match="change or remove it there"):
        await catalog.undo("gemma-3")
    with pytest.raises(UnknownModel):
        await catalog.undo("missing")
