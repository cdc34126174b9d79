"""Storing catalog models added through the admin API: one JSON spec per model name.

The store keeps each model as the catalog hands it over (a JSON object) and
never looks inside: the catalog validates a spec before writing it and again
after reading it, so a spec written by an older or newer llmgw is judged by the
rules of the version reading it. Names are the primary key, so two servers
creating one name at once get one row and one `AlreadyExists`.

Not guaranteed: that a spec read back still validates (rules change between
versions; the catalog skips such a model with a warning), or that `list` sees a
write committed on another server after the call began.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import RowMapping, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from llmgw.store.engine import transaction
from llmgw.store.errors import AlreadyExists, InvalidValue, NotFound
from llmgw.store.tables import catalog_models

MAX_NAME = 128


@dataclass(frozen=True, slots=True)
class StoredModel:
    """A catalog model as stored: its name, its spec as JSON data, and when it changed.

    `spec` is decoded afresh for each read; changing it changes nothing stored. A
    row written by something other than llmgw may hold JSON that is not an object;
    it is returned as it is, and the catalog refuses it like any invalid spec.
    """

    name: str
    spec: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    # The spec before the last replacement that kept one (for undo); None when none did.
    previous: dict[str, Any] | None = None


class CatalogRepository:
    """Catalog models in the store; every method is one short transaction."""

    def __init__(self, *, engine: AsyncEngine, clock: Callable[[], datetime]) -> None:
        self._engine = engine
        self._clock = clock

    async def list(self) -> builtins.list[StoredModel]:
        """Every stored model, by name."""
        stmt = select(catalog_models).order_by(catalog_models.c.name)
        async with transaction(self._engine, "listing catalog models") as conn:
            return [_from_row(row._mapping) for row in await conn.execute(stmt)]

    async def get(self, name: str) -> StoredModel | None:
        """The stored model of this name, or None."""
        async with transaction(self._engine, f"reading catalog model {name!r}") as conn:
            return await _select(conn, name)

    async def put(
        self,
        name: str,
        spec: dict[str, Any],
        *,
        create: bool,
        previous: dict[str, Any] | None = None,
    ) -> StoredModel:
        """Store `spec` under `name`: a new row (`create`) or a replacement of one.

        `previous`, on a replacement, is kept as the spec to go back to (undo); None
        leaves the one kept before in place.

        `AlreadyExists` when creating a name that is stored, `NotFound` when
        replacing one that is not; either way nothing is written.
        """
        _validate(name, spec)
        now = self._clock()
        what = f"{'adding' if create else 'replacing'} catalog model {name!r}"
        try:
            async with transaction(self._engine, what) as conn:
                if create:
                    await conn.execute(
                        catalog_models.insert().values(
                            name=name, spec=spec, created_at=now, updated_at=now
                        )
                    )
                else:
                    result = await conn.execute(
                        update(catalog_models)
                        .where(catalog_models.c.name == name)
                        .values(
                            spec=spec,
                            updated_at=now,
                            **({"previous_spec": previous} if previous is not None else {}),
                        )
                    )
                    if result.rowcount == 0:
                        raise NotFound(
                            f"catalog model {name!r} is not in the store (removed meanwhile?); "
                            "add it instead"
                        )
                stored = await _select(conn, name)
        except IntegrityError as exc:
            raise AlreadyExists(
                f"catalog model {name!r} is already in the store; replace it instead"
            ) from exc
        if stored is None:  # pragma: no cover - the row was written in this transaction
            raise NotFound(f"catalog model {name!r} vanished while it was being written")
        return stored

    async def delete(self, name: str) -> bool:
        """Remove the stored model of this name; False when there was none."""
        async with transaction(self._engine, f"removing catalog model {name!r}") as conn:
            result = await conn.execute(delete(catalog_models).where(catalog_models.c.name == name))
        return result.rowcount > 0


def _validate(name: str, spec: dict[str, Any]) -> None:
    if not name or len(name) > MAX_NAME:
        raise InvalidValue(f"catalog model name must be 1 to {MAX_NAME} characters, got {name!r}")
    if not isinstance(spec, dict):
        raise InvalidValue(f"a catalog model's spec must be a JSON object, got {type(spec)}")


async def _select(conn: AsyncConnection, name: str) -> StoredModel | None:
    row = (await conn.execute(select(catalog_models).where(catalog_models.c.name == name))).first()
    return _from_row(row._mapping) if row is not None else None


def _from_row(row: RowMapping) -> StoredModel:
    return StoredModel(
        name=row["name"],
        # Decoded afresh from the row on every read, so callers may keep or change it.
        spec=cast("dict[str, Any]", row["spec"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        previous=cast("dict[str, Any] | None", row["previous_spec"]),
    )
