"""The live catalog: the models declared in the config file plus those added through the API.

Built by the composition root with the config file's models (already validated
by `validate.model_from_config`) and the store's catalog repository; `load()`
then adds what the store kept, so a model added before the last restart is in
force again. Config models are read-only here (edit the file; `reload_config`
puts the file's models as read again in force, all or nothing); stored models are
added, replaced and removed through `add`, `replace` and `remove`, which write
the store first and change memory only once the store has the change, so a
failed write changes nothing. Listeners hear about every change, synchronously.

Names are one namespace: a name or alias means one model, across config and
store. When the two disagree at start-up, the config file wins and the stored
model is skipped with a warning; so is a stored model that no longer validates.
Start-up never fails because of what the store holds. A skipped stored model can
be replaced (to fix it) or discarded through the API.

LoRA adapters (`adapter_of` set) share the names' namespace and the store, but
`models()` and `get()` are the models of their own (what replicas run); adapters
are read through `adapters()` and `entry()`. An adapter needs its base in the
catalog with a profile that takes adapters (`catalog.adapters`): a config adapter
without one is a config mistake, a stored one is skipped, and a base cannot be
removed, or stop taking adapters, while adapters name it.

Not guaranteed:
- Changes made by another server sharing the store are seen only when `load()`
  runs again (at start-up, or when the caller polls it).
- Thread safety: every call must come from the event loop's thread.
- That listeners may raise: a listener's exception propagates into the write
  that triggered it, after the change was made. Listeners should only note the
  change (set an `asyncio.Event`) and return.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from llmgw.control.catalog.adapters import adapters_of, base_problem, takes_adapters
from llmgw.control.catalog.errors import (
    HasAdapters,
    InvalidModel,
    ModelExists,
    NameTaken,
    NoCanary,
    NoStore,
    NothingToUndo,
    ReadOnlyModel,
    UnknownModel,
)
from llmgw.control.catalog.hub import RevisionResolver, pin
from llmgw.control.catalog.model import CatalogModel, canary_model, launch_key
from llmgw.control.catalog.validate import check_names_free, model_to_dict, parse_model
from llmgw.store import AlreadyExists, NotFound, StoredModel

log = logging.getLogger("llmgw.control.catalog")

Listener = Callable[[], None]


class CatalogStore(Protocol):
    """What the catalog needs of the store; `llmgw.store.CatalogRepository` satisfies it."""

    async def list(self) -> builtins.list[StoredModel]: ...

    async def put(
        self,
        name: str,
        spec: dict[str, object],
        *,
        create: bool,
        previous: dict[str, object] | None = None,
    ) -> StoredModel: ...

    async def delete(self, name: str) -> bool: ...


@dataclasses.dataclass(frozen=True, slots=True)
class ConfigChange:
    """What a reload of the config file changed in its models, by name."""

    added: tuple[str, ...]
    changed: tuple[str, ...]
    removed: tuple[str, ...]
    unchanged: tuple[str, ...]


class Catalog:
    """Every model clients may ask for, by name or alias; writes go to the store first."""

    def __init__(
        self,
        *,
        repo: CatalogStore | None,
        config_models: Sequence[CatalogModel],
        config_file: str | None,
        revisions: RevisionResolver | None = None,
    ) -> None:
        """`NameTaken` if two config models share a name or alias (a config mistake).

        `revisions` pins hub weights to a commit on add and replace (None: not pinned)."""
        self._repo = repo
        self._revisions = revisions
        self._config_file = config_file
        self._config = self._declared(config_models)
        self._stored: dict[str, CatalogModel] = {}
        self._skipped: dict[str, str] = {}
        # Per stored model, its spec before the last change to what its replicas run.
        self._previous: dict[str, dict[str, object]] = {}
        # Every entry in force by name; `_models` the models of their own, `_adapters` the rest.
        self._entries: dict[str, CatalogModel] = {}
        self._models: dict[str, CatalogModel] = {}
        self._adapters: dict[str, CatalogModel] = {}
        self._index: dict[str, str] = {}
        self._listeners: list[Listener] = []
        self._lock = asyncio.Lock()
        self._rebuild()

    # ---- reading ----

    def models(self) -> list[CatalogModel]:
        """Every model in force, by name."""
        return [self._models[name] for name in sorted(self._models)]

    def get(self, name: str) -> CatalogModel | None:
        """The model a client means by `name` (its name or an alias), or None (also for an
        adapter's name: see `entry`)."""
        canonical = self._index.get(name)
        return self._models.get(canonical) if canonical is not None else None

    def adapters(self, base: str | None = None) -> list[CatalogModel]:
        """Every adapter in force by name, or those of one base model (by its own name)."""
        return [
            self._adapters[name]
            for name in sorted(self._adapters)
            if base is None or self._adapters[name].adapter_of == base
        ]

    def entry(self, name: str) -> CatalogModel | None:
        """The model or adapter a client means by `name` (its name or an alias), or None."""
        canonical = self._index.get(name)
        return self._entries.get(canonical) if canonical is not None else None

    def resolve(self, name: str) -> str | None:
        """The own name of the model or adapter of a name or alias; None when none has it."""
        return self._index.get(name)

    def skipped(self) -> dict[str, str]:
        """Stored models not in force, by name, with the reason (invalid, or shadowed)."""
        return dict(sorted(self._skipped.items()))

    @property
    def revisions(self) -> RevisionResolver | None:
        """What pins hub weights to a commit (None: nothing is pinned)."""
        return self._revisions

    @property
    def has_store(self) -> bool:
        """Whether models can be added: without a store they would vanish on restart."""
        return self._repo is not None

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` after every change; returns the function that unsubscribes."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def _declared(self, config_models: Sequence[CatalogModel]) -> dict[str, CatalogModel]:
        """The config file's models by name; `NameTaken` when two share a name or alias."""
        config: dict[str, CatalogModel] = {}
        for declared in config_models:
            model = dataclasses.replace(declared, source="config")
            if model.name in config:
                raise NameTaken(f"model {model.name!r} is declared twice in {self._where()}")
            check_names_free(model, list(config.values()))
            config[model.name] = model
        for model in config.values():
            problem = base_problem(model, config) if model.adapter_of is not None else None
            if problem is not None:
                raise InvalidModel(
                    f"{problem} (an adapter in {self._where()} needs its base declared there)",
                    "adapter_of",
                )
        return config

    # ---- loading ----

    async def reload_config(self, config_models: Sequence[CatalogModel]) -> ConfigChange:
        """Put the config file's models as read again in force, in place of the old ones.

        All or nothing: `NameTaken` (two of them share a name or alias) or a store
        that cannot be read (`StoreError`) changes nothing. Stored models are
        weighed against the new config models as at start-up (a config model of the
        same name wins; one the file no longer declares lets its stored one back).
        What a changed model's replicas run is the reconciler's business: it rolls
        them, or changes nothing, as for `replace`. Listeners hear of every reload
        that changed anything.
        """
        fresh = self._declared(config_models)
        async with self._lock:
            rows = await self._repo.list() if self._repo is not None else []
            old = self._config
            change = ConfigChange(
                added=tuple(sorted(set(fresh) - set(old))),
                removed=tuple(sorted(set(old) - set(fresh))),
                changed=tuple(sorted(n for n in fresh if n in old and fresh[n] != old[n])),
                unchanged=tuple(sorted(n for n in fresh if n in old and fresh[n] == old[n])),
            )
            self._config = fresh
            before = dict(self._entries)
            if self._repo is not None:
                self._apply_rows(rows)
            self._rebuild()
            moved = self._entries != before
        if moved:
            self._notify()
        return change

    async def load(self) -> list[str]:
        """Read the stored models and put them in force; the warnings, one per skipped model.

        A stored model that does not validate, or whose name or an alias is
        already taken (by a config model, or by a stored model earlier by name),
        is skipped, never fatal. Listeners hear about it when anything changed.
        """
        if self._repo is None:
            return []
        async with self._lock:
            rows = await self._repo.list()
            changed = self._apply_rows(rows)
            self._rebuild()
        if changed:
            self._notify()
        return [f"stored model {name!r} is skipped: {why}" for name, why in self._skipped.items()]

    def _apply_rows(self, rows: Sequence[StoredModel]) -> bool:
        """The stored models in force (and those skipped) from the store's rows; whether
        the models in force changed."""
        stored: dict[str, CatalogModel] = {}
        skipped: dict[str, str] = {}
        for row in sorted(rows, key=lambda r: r.name):
            reason = self._reject(row, stored)
            if isinstance(reason, str):
                skipped[row.name] = reason
            else:
                stored[row.name] = reason
        # Adapters last: their bases may be any model in force, config or stored.
        bases = {**stored, **self._config}
        for name, model in list(stored.items()):
            problem = base_problem(model, bases) if model.adapter_of is not None else None
            if problem is not None:
                skipped[name] = (
                    f"{problem}; then it comes back, or discard it (`llmgw models remove {name}`)"
                )
                del stored[name]
        changed = stored != self._stored
        self._stored, self._skipped = stored, skipped
        self._previous = {
            row.name: row.previous
            for row in rows
            if row.name in stored and isinstance(row.previous, dict)
        }
        return changed

    def _reject(self, row: StoredModel, stored: dict[str, CatalogModel]) -> CatalogModel | str:
        """The stored model to put in force, or why it is skipped."""
        if row.name in self._config:
            return (
                f"{self._where()} declares a model of that name, which wins; the stored one "
                "comes back if the config file stops declaring it"
            )
        try:
            model = parse_model(row.spec, source="store")
        except InvalidModel as exc:
            return (
                f"it no longer validates ({exc.message}); replace it with a valid model "
                f"(`llmgw models add --replace`) or discard it (`llmgw models remove {row.name}`)"
            )
        if model.name != row.name:
            return f"its spec names another model, {model.name!r}; discard it and add it again"
        try:
            check_names_free(model, [*self._config.values(), *stored.values()])
        except NameTaken as exc:
            return str(exc)
        return model

    # ---- writing ----

    async def add(self, model: CatalogModel) -> CatalogModel:
        """Add a model to the store and put it in force.

        `NoStore` without a store; `ModelExists` when the name is a model's
        already (or a skipped stored model's); `NameTaken` when a name or alias
        clashes with another model's.
        """
        model = await self.pinned(model)
        async with self._lock:
            repo = self._require_store(model.name)
            model = dataclasses.replace(model, source="store")
            existing = self._entries.get(model.name)
            if existing is not None:
                raise ModelExists(self._exists_message(existing))
            if model.name in self._skipped:
                raise ModelExists(
                    f"model {model.name!r} is in the store but not in force "
                    f"({self._skipped[model.name]}); replace or discard it"
                )
            check_names_free(model, list(self._entries.values()))
            self._check_base(model)
            try:
                await repo.put(model.name, model_to_dict(model), create=True)
            except AlreadyExists as exc:
                raise ModelExists(
                    f"model {model.name!r} was added meanwhile by another server sharing the "
                    "store; it is in force there, and here after the next reload or restart"
                ) from exc
            self._stored[model.name] = model
            self._rebuild()
        self._notify()
        return model

    async def replace(self, name: str, model: CatalogModel) -> CatalogModel:
        """Replace a stored model (named by its name or an alias) with `model`.

        `UnknownModel` when no model has that name; `ReadOnlyModel` for a config
        model; `InvalidModel` (field "name") when `model` has another name: a
        model cannot be renamed. A skipped stored model may be replaced, to fix it.
        """
        model = await self.pinned(model)
        async with self._lock:
            canonical = self._index.get(name) or (name if name in self._skipped else None)
            if canonical is None:
                raise UnknownModel(name)
            self._require_writable(canonical)
            repo = self._require_store(canonical)
            if model.name != canonical:
                raise InvalidModel(
                    f"model {canonical!r}, field 'name': the new definition is named "
                    f"{model.name!r}; a model cannot be renamed (add the new name, then "
                    "remove the old one)",
                    "name",
                )
            model = dataclasses.replace(model, source="store")
            check_names_free(model, [m for m in self._entries.values() if m.name != canonical])
            self._check_base(model)
            self._check_still_base(canonical, model)
            old = self._stored.get(canonical)
            # Kept for undo only when what runs changes: an alias or a limit changed
            # since leaves the spec to go back to as it was.
            previous = (
                model_to_dict(old)
                if old is not None and launch_key(old) != launch_key(model)
                else None
            )
            try:
                await repo.put(canonical, model_to_dict(model), create=False, previous=previous)
            except NotFound as exc:
                raise UnknownModel(canonical) from exc
            if previous is not None:
                self._previous[canonical] = previous
            self._stored[canonical] = model
            self._skipped.pop(canonical, None)
            self._rebuild()
        self._notify()
        return model

    def previous(self, name: str) -> CatalogModel | None:
        """The spec `undo` would go back to for a stored model (by name or alias), or None
        (never changed in what it runs, or the kept spec no longer validates)."""
        canonical = self._index.get(name)
        data = self._previous.get(canonical) if canonical is not None else None
        if data is None:
            return None
        try:
            return parse_model(data, source="store")
        except InvalidModel:
            return None

    async def undo(self, name: str) -> CatalogModel:
        """Put a stored model's previous spec back in force; the current one becomes the
        previous (so a second undo goes forward again). Its replicas roll back.

        `UnknownModel`, `ReadOnlyModel` as `replace`; `NothingToUndo` when there is no
        previous spec, or it no longer validates (the message says why).
        """
        canonical = self._index.get(name)
        if canonical is None:
            raise UnknownModel(name)
        self._require_writable(canonical)
        data = self._previous.get(canonical)
        if data is None:
            raise NothingToUndo(
                f"model {canonical!r} has no earlier spec to go back to: it was not replaced "
                "with a change to what its replicas run since it was added"
            )
        try:
            earlier = parse_model(data, source="store")
        except InvalidModel as exc:
            raise NothingToUndo(
                f"model {canonical!r}: its earlier spec no longer validates ({exc.message}); "
                "replace the model with a corrected spec instead"
            ) from exc
        # Aliases and limits stay as they are now; only what runs goes back.
        current = self._entries[canonical]
        restored = dataclasses.replace(
            current,
            weights=earlier.weights,
            weights_commit=earlier.weights_commit,
            profiles=earlier.profiles,
        )
        return await self.replace(canonical, restored)

    async def promote(self, name: str) -> CatalogModel:
        """End a stored model's canary by making the canary's spec the model's own: its
        stable replicas then roll to it (surge first), its canary replicas stay.

        `UnknownModel`, `ReadOnlyModel` as `replace`; `NoCanary` when it has none.
        """
        current = self._canary_of(name)
        canary = canary_model(current)
        assert canary is not None
        return await self.replace(current.name, canary)

    async def abort(self, name: str) -> CatalogModel:
        """End a stored model's canary by dropping it: its canary replicas drain once the
        stable ones suffice, and new conversations all go to the model's own spec.

        `UnknownModel`, `ReadOnlyModel` as `replace`; `NoCanary` when it has none.
        """
        current = self._canary_of(name)
        return await self.replace(current.name, dataclasses.replace(current, canary=None))

    def _canary_of(self, name: str) -> CatalogModel:
        canonical = self._index.get(name)
        if canonical is None:
            raise UnknownModel(name)
        self._require_writable(canonical)
        current = self._entries[canonical]
        if current.canary is None:
            raise NoCanary(
                f"model {canonical!r} has no canary to promote or abort; give it one with "
                "`versions:` (`llmgw models add --replace`)"
            )
        return current

    async def remove(self, name: str) -> CatalogModel:
        """Remove a stored model (by name or alias) from the store and from force.

        `UnknownModel` when no model in force has that name (see `discard` for a
        skipped one); `ReadOnlyModel` for a config model.
        """
        async with self._lock:
            canonical = self._index.get(name)
            if canonical is None:
                raise UnknownModel(name)
            self._require_writable(canonical)
            repo = self._require_store(canonical)
            dependants = adapters_of(canonical, self._adapters)
            if dependants:
                raise HasAdapters(
                    f"model {canonical!r} is the base of the adapters "
                    f"{', '.join(repr(n) for n in dependants)}; remove them first "
                    f"(`llmgw models remove NAME`), then the base"
                )
            await repo.delete(canonical)
            model = self._stored.pop(canonical)
            self._previous.pop(canonical, None)
            self._rebuild()
        self._notify()
        return model

    async def discard(self, name: str) -> str:
        """Delete a skipped stored model (see `skipped`); the reason it was skipped.

        `UnknownModel` when no stored model of that name was skipped.
        """
        async with self._lock:
            reason = self._skipped.get(name)
            if reason is None or name in self._config:
                raise UnknownModel(name)
            repo = self._require_store(name)
            await repo.delete(name)
            del self._skipped[name]
        return reason

    # ---- helpers ----

    async def pinned(self, model: CatalogModel) -> CatalogModel:
        """`model` pinned to its hub commit, with its size (see `hub.pin`); changes
        nothing in the catalog. Asked before the lock is taken: the hub may be slow,
        and other writes need not wait for it."""
        return await pin(model, self._revisions)

    def _rebuild(self) -> None:
        self._entries = {**self._stored, **self._config}
        self._models = {n: m for n, m in self._entries.items() if m.adapter_of is None}
        self._adapters = {n: m for n, m in self._entries.items() if m.adapter_of is not None}
        self._index = {
            alias: model.name for model in self._entries.values() for alias in model.aliases
        }
        self._index.update({name: name for name in self._entries})

    def _check_base(self, model: CatalogModel) -> None:
        """`InvalidModel` (field adapter_of) when `model` is an adapter without a base
        that takes adapters."""
        if model.adapter_of is None:
            return
        problem = base_problem(model, self._entries)
        if problem is not None:
            raise InvalidModel(problem, "adapter_of")

    def _check_still_base(self, name: str, model: CatalogModel) -> None:
        """`InvalidModel` when `model`, replacing the base of adapters, could not carry them."""
        dependants = adapters_of(name, self._adapters)
        if not dependants or (model.adapter_of is None and takes_adapters(model)):
            return
        field = "adapter_of" if model.adapter_of is not None else "profiles"
        raise InvalidModel(
            f"model {name!r}, field {field!r}: it is the base of the adapters "
            f"{', '.join(repr(n) for n in dependants)}, so it must stay a model of its own "
            "with a profile that takes adapters (adapters: {max_loaded, max_rank}); remove "
            "the adapters first",
            field,
        )

    def _notify(self) -> None:
        for listener in tuple(self._listeners):
            listener()

    def _where(self) -> str:
        return f"the config file {self._config_file}" if self._config_file else "the configuration"

    def _require_store(self, name: str) -> CatalogStore:
        if self._repo is None:
            raise NoStore(
                f"model {name!r} cannot be written: this server runs without a store, so a "
                "model added or changed through the admin API would vanish at the next "
                f"restart; declare it in {self._where()} instead, or run the server with a store"
            )
        return self._repo

    def _require_writable(self, name: str) -> None:
        model = self._entries.get(name)
        if model is not None and model.source == "config":
            raise ReadOnlyModel(
                f"model {name!r} is declared in {self._where()}; change or remove it there "
                "and reload it (`llmgw models reload`, or SIGHUP to the server; the admin API "
                "changes only models it added)"
            )

    def _exists_message(self, existing: CatalogModel) -> str:
        if existing.source == "config":
            return (
                f"model {existing.name!r} is already in the catalog, declared in "
                f"{self._where()}; change it there"
            )
        return (
            f"model {existing.name!r} is already in the catalog; replace it "
            f"(`llmgw models add --replace`, or PUT /admin/api/models/{existing.name})"
        )
