"""Reloading the config file's models into the live catalog, without a restart.

`ConfigReloader.reload()` reads the file the server started with again (or what
`llmgw up` builds its catalog from: a `ConfigSource`), checks all
of it (the whole file as at start-up, then every `models:` entry through the
catalog's rules), and only then puts its models in force (`Catalog.reload_config`):
a model whose change touches what its replicas run (weights, engine, arguments,
environment, GPUs, parallel sizes) is rolled by the reconciler as `llmgw models add
--replace` rolls one; a change that leaves what runs alone applies in place; a model
the file no longer declares is removed (its replicas drain); a new one is added.
A file that does not read or validate is refused whole, naming the file and the
field, and changes nothing.

Only `models:` is reloaded. The other sections (listeners, router, control,
endpoints, ...) are read by objects built once at start-up, so a change there is
reported as needing a restart (`Reloaded.restart_needed`), not applied.

Not guaranteed: that servers sharing a store reload together; each reloads its own
file (the leader's catalog is the one whose replicas run).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw.config import ConfigError, ServerConfig, load_server_config
from llmgw.control.catalog.catalog import Catalog, ConfigChange
from llmgw.control.catalog.errors import CatalogError, HubUnavailable, InvalidModel, NameTaken
from llmgw.control.catalog.hub import RevisionResolver, pin
from llmgw.control.catalog.model import CatalogModel, canary_model, launch_key
from llmgw.control.catalog.validate import model_from_config

log = logging.getLogger("llmgw.control.catalog.reload")


class InvalidConfig(CatalogError):
    """The config file cannot be reloaded: it does not read or validate. The message
    names the file and the field; nothing was changed."""

    code = "invalid_config"


class NoConfigFile(CatalogError):
    """The server was started without a config file: there is nothing to reload."""

    code = "no_config_file"


@dataclass(frozen=True, slots=True)
class ConfigSource:
    """Where a reload reads the config from: `label` names it in answers and errors (the
    file's path), `read` reads and validates it (`ConfigError` naming the field)."""

    label: str
    read: Callable[[], ServerConfig]

    @classmethod
    def file(cls, path: Path) -> ConfigSource:
        return cls(str(path), lambda: load_server_config(path, {}))


@dataclass(frozen=True, slots=True)
class Reloaded:
    """What a reload did: the models added, changed (`rolled`: those whose replicas roll
    to a new spec; the others changed in place), removed and left alone, and the
    other sections of the file that changed since start-up and need a restart."""

    file: str
    change: ConfigChange
    rolled: tuple[str, ...]
    restart_needed: tuple[str, ...]

    def view(self) -> dict[str, object]:
        return {
            "file": self.file,
            "added": list(self.change.added),
            "changed": list(self.change.changed),
            "rolled": list(self.rolled),
            "removed": list(self.change.removed),
            "unchanged": list(self.change.unchanged),
            "restart_needed": list(self.restart_needed),
        }


def _runs(model: CatalogModel) -> tuple[str, str]:
    """What the model's replicas run, its canary's included."""
    canary = canary_model(model)
    return launch_key(model), launch_key(canary) if canary is not None else ""


def _where(index: int, field: str) -> str:
    """`models[1].profiles[0].engine` for entry 1's field "profiles.0.engine", as the
    config file's other errors spell a field."""
    where = f"models[{index}]"
    for part in field.split(".") if field else ():
        where += f"[{part}]" if part.isdigit() else f".{part}"
    return where


async def config_models(
    cfg: ServerConfig,
    *,
    label: str,
    revisions: RevisionResolver | None,
    earlier: Mapping[str, CatalogModel] | None = None,
) -> list[CatalogModel]:
    """The file's models as catalog models, hub weights pinned to the hub's commit.

    `InvalidConfig` naming `label` and the field when an entry breaks the catalog's
    rules or the hub refuses its repo or revision. A hub that cannot be reached
    leaves a model unpinned with a warning (the server must start without the hub),
    or, on a reload, keeps the commit `earlier` (the models in force) pinned for the
    same weights, so a hub outage never rolls replicas.
    """
    built: list[CatalogModel] = []
    for index, declared in enumerate(cfg.models):
        try:
            built.append(model_from_config(declared, source="config"))
        except InvalidModel as exc:
            raise InvalidConfig(f"{label}: {_where(index, exc.field)}: {exc.message}") from exc
    # Asked together: a start waits for the slowest answer, not for their sum.
    answers = await asyncio.gather(
        *(pin(model, revisions) for model in built), return_exceptions=True
    )
    models: list[CatalogModel] = []
    for index, (model, answer) in enumerate(zip(built, answers, strict=True)):
        if isinstance(answer, CatalogModel):
            models.append(answer)
        elif isinstance(answer, InvalidModel):
            raise InvalidConfig(f"{label}: {_where(index, answer.field)}: {answer.message}")
        elif isinstance(answer, HubUnavailable):
            models.append(_unpinned(model, answer, label, index, earlier or {}))
        else:
            raise answer
    return models


def _unpinned(
    model: CatalogModel,
    error: HubUnavailable,
    label: str,
    index: int,
    earlier: Mapping[str, CatalogModel],
) -> CatalogModel:
    """A model the hub could not pin: as pinned before for the same weights, else as
    written (with a warning)."""
    before = earlier.get(model.name)
    if before is not None and before.weights == model.weights and before.weights_commit:
        return dataclasses.replace(
            model, weights_commit=before.weights_commit, weights_bytes=before.weights_bytes
        )
    log.warning(
        "%s: %s: %s; its nodes download the revision as written",
        label,
        _where(index, "weights"),
        error.message,
    )
    return model


def _sections(cfg: ServerConfig) -> dict[str, Any]:
    return cfg.model_dump(mode="json", exclude={"models"})


class ConfigReloader:
    """Reloads `source`'s models into `catalog`; one reload at a time."""

    def __init__(self, *, catalog: Catalog, source: ConfigSource | None) -> None:
        self._catalog = catalog
        self._source = source
        self._lock = asyncio.Lock()
        # The file's other sections as the server started with them (None: not read).
        self._started: Mapping[str, Any] | None = None

    async def start(self) -> None:
        """Note the file's other sections as the server starts, to tell later which of
        them changed; a file that no longer reads is noted as nothing."""
        if self._source is None:
            return
        try:
            cfg = await asyncio.to_thread(self._source.read)
        except ConfigError:
            return
        self._started = _sections(cfg)

    async def reload(self) -> Reloaded:
        """Read the file again and put its models in force; see the module docstring.

        `NoConfigFile`, `InvalidConfig` (nothing changed); `StoreError` when the
        store's models cannot be read to weigh against the new ones (nothing changed).
        """
        source = self._source
        if source is None:
            raise NoConfigFile(
                "this server was started without --config, so it has no config file to "
                "reload; add models with `llmgw models add` instead"
            )
        async with self._lock:
            try:
                cfg = await asyncio.to_thread(source.read)
            except ConfigError as exc:
                raise InvalidConfig(f"{exc}; nothing was reloaded") from exc
            try:
                models = await config_models(
                    cfg,
                    label=source.label,
                    revisions=self._catalog.revisions,
                    earlier={m.name: m for m in self._catalog.models() if m.source == "config"},
                )
            except InvalidConfig as exc:
                raise InvalidConfig(f"{exc.message}; nothing was reloaded") from exc
            before = {m.name: _runs(m) for m in self._catalog.models()}
            try:
                change = await self._catalog.reload_config(models)
            except (NameTaken, InvalidModel) as exc:
                raise InvalidConfig(
                    f"{source.label}: models: {exc.message}; nothing was reloaded"
                ) from exc
            now = {m.name: m for m in models}
            # An adapter runs no replicas of its own: changing it rolls nothing.
            rolled = tuple(
                n
                for n in change.changed
                if now[n].adapter_of is None and _runs(now[n]) != before.get(n)
            )
            sections = _sections(cfg)
            started = self._started
            restart = (
                ()
                if started is None
                else tuple(sorted(k for k in sections if sections[k] != started.get(k)))
            )
            return Reloaded(source.label, change, rolled, restart)
