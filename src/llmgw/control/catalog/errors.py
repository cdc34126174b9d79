"""The catalog's exception tree: why a model could not be read, added, changed or removed.

    CatalogError            base: the catalog refused the operation; the message says why
    ├── InvalidModel        a model that breaks a rule; `field` is the dotted path at fault
    ├── UnknownModel        no model (or alias) of that name
    ├── ModelExists         adding a model whose name is already a model's name
    ├── NameTaken           a name or alias is already another model's name or alias
    ├── ReadOnlyModel       the model is declared in the config file: edit it there
    ├── NoStore             the server runs without a store: a written model would vanish
    ├── HasAdapters         removing a base model that adapters still name as their base
    └── HubUnavailable      the hub that pins hub weights to a commit did not answer
                            (the only one that may pass: a retry can succeed)

Every one is permanent for the request that caused it (the same request fails
the same way) and carries a stable `code` for the admin API's error bodies.
Store failures (`llmgw.store.StoreError`) pass through unchanged: they are the
database's, not the catalog's.
"""

from __future__ import annotations


class CatalogError(Exception):
    """The catalog refused an operation; `message` says why and what to do."""

    code = "catalog_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidModel(CatalogError, ValueError):
    """A model breaks a rule; the message names the model, the profile and the field.

    `field` is the dotted path of the first field at fault, as an API body or a
    `models:` entry spells it ("profiles.1.gpus"); "" when the whole body is wrong.
    `problems` lists every (field, message) found, the first one included.
    """

    code = "invalid_model"

    def __init__(
        self, message: str, field: str, problems: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(message)
        self.field = field
        self.problems = problems or ((field, message),)

    def __reduce__(self) -> tuple[type[InvalidModel], tuple[object, ...]]:
        return (type(self), (self.message, self.field, self.problems))


class UnknownModel(CatalogError):
    """No model in the catalog has this name or alias."""

    code = "model_not_found"

    def __init__(self, name: str) -> None:
        super().__init__(
            f"model {name!r} is not in the catalog (`llmgw models list` shows the models "
            "and their aliases)"
        )
        self.name = name

    def __reduce__(self) -> tuple[type[UnknownModel], tuple[object, ...]]:
        return (type(self), (self.name,))


class ModelExists(CatalogError):
    """A model of this name is already in the catalog; replace it instead of adding."""

    code = "model_exists"


class NameTaken(CatalogError):
    """A name or alias of the model is already a name or alias of another model."""

    code = "name_taken"


class ReadOnlyModel(CatalogError):
    """The model comes from the config file; the admin API cannot change or remove it."""

    code = "model_read_only"


class NoStore(CatalogError):
    """The server has no store, so a model written now would be gone after a restart."""

    code = "no_store"


class NothingToUndo(CatalogError):
    """The model has no earlier spec to go back to (never replaced in what it runs)."""

    code = "nothing_to_undo"


class NoCanary(CatalogError):
    """The model has no canary (`versions:`) to promote or abort."""

    code = "no_canary"


class HasAdapters(CatalogError):
    """The model is the base of adapters in the catalog; remove them first."""

    code = "model_has_adapters"


class HubUnavailable(CatalogError):
    """The hub that would pin a model's weights to a commit could not be reached."""

    code = "hub_unavailable"
