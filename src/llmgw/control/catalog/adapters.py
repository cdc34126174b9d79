"""The rules that tie a LoRA adapter to its base model in the catalog.

An adapter (`CatalogModel.adapter_of` set) is loaded at run time into replicas of
its base, so the base must be a model of its own (not another adapter) whose
profiles can take adapters (a profile with `adapters: {max_loaded, max_rank}`):
without that the engine starts without LoRA support and no load could succeed.
These checks need the whole catalog, so they run where the catalog is put
together (start-up, reload, add, replace, remove), not in `validate`.

Not guaranteed: that the adapter's files exist or that its rank fits the base's
`max_rank`; the engine finds those out when the adapter is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmgw.control.catalog.model import CatalogModel


def base_problem(adapter: CatalogModel, models: Mapping[str, CatalogModel]) -> str | None:
    """Why `adapter` cannot run on its base among `models` (by name), or None when it can."""
    base_name = adapter.adapter_of
    assert base_name is not None
    base = models.get(base_name)
    if base is None:
        return (
            f"adapter {adapter.name!r}, field 'adapter_of': its base model {base_name!r} is "
            "not in the catalog; add the base model first (by its own name, not an alias)"
        )
    if base.adapter_of is not None:
        return (
            f"adapter {adapter.name!r}, field 'adapter_of': {base_name!r} is itself an "
            f"adapter (of {base.adapter_of!r}); name the model both were trained on"
        )
    if not takes_adapters(base):
        return (
            f"adapter {adapter.name!r}, field 'adapter_of': no profile of its base model "
            f"{base_name!r} takes adapters, so its engines start without LoRA support; give "
            "one of the base's profiles adapters: {max_loaded: N, max_rank: R}"
        )
    return None


def takes_adapters(model: CatalogModel) -> bool:
    """Whether some profile of `model` starts its engine ready to load adapters."""
    return any(profile.adapters is not None for profile in model.profiles)


def adapters_of(base: str, entries: Mapping[str, CatalogModel]) -> list[str]:
    """The names of the adapters among `entries` whose base is `base`, sorted."""
    return sorted(name for name, entry in entries.items() if entry.adapter_of == base)
