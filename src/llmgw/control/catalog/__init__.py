"""The catalog: which models clients may ask for and how each is served.

`model` holds the value types, `validate` builds them (from the config file, API
bodies and stored JSON) under one set of rules, `catalog` is the live catalog
of config and stored models, `errors` its exception tree.
"""

from llmgw.control.catalog.catalog import Catalog, CatalogStore
from llmgw.control.catalog.errors import (
    CatalogError,
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
from llmgw.control.catalog.model import (
    PINNED,
    Canary,
    CatalogModel,
    ModelSource,
    Profile,
    canary_model,
    launch_key,
)
from llmgw.control.catalog.validate import (
    check_names_free,
    model_from_config,
    model_to_dict,
    parse_model,
)

__all__ = [
    "PINNED",
    "Canary",
    "Catalog",
    "CatalogError",
    "CatalogModel",
    "CatalogStore",
    "HasAdapters",
    "InvalidModel",
    "ModelExists",
    "ModelSource",
    "NameTaken",
    "NoCanary",
    "NoStore",
    "NothingToUndo",
    "Profile",
    "ReadOnlyModel",
    "UnknownModel",
    "canary_model",
    "check_names_free",
    "launch_key",
    "model_from_config",
    "model_to_dict",
    "parse_model",
]
