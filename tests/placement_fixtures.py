"""Placement records for tests that run the agent service or the reconciler in the test process.

The `placements` fixture is a real `PlacementBook` over a real SQLite store in
the test's tmp_path, whose lease the test holds, with its term started (so
Registers are judged at once). `place(book, node_id, spec)` records a shard as
the leader would before its start; a report of anything not placed is refused,
as on a real server. Import the fixture under its short name:

    from placement_fixtures import place, placements_fixture  # noqa: F401
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.control.inventory import ShardSpec
from llmgw.control.leadership import LEASE_NAME
from llmgw.control.placements import Placement, PlacementBook
from llmgw.store import Store, open_store, store_url


async def open_book(directory: Path) -> tuple[Store, PlacementBook]:
    """A migrated SQLite store in `directory`, its lease held, and a book whose term started."""
    store = await open_store(store_url(directory, None))
    await store.upgrade()
    lease = await store.leadership.acquire(LEASE_NAME, "test-server", 3600.0, "")
    assert lease is not None
    book = PlacementBook(store=store.placements, lease_name=LEASE_NAME, on_fenced=_fenced)
    await book.start_term(lease.epoch)
    return store, book


def _fenced(reason: str) -> None:
    raise AssertionError(f"the test's lease was lost: {reason}")


async def place(book: PlacementBook, node_id: str, spec: ShardSpec, profile: str = "p") -> None:
    """Record `spec` on `node_id`, as the leader does before it sends the start."""
    await book.record([Placement(node_id=node_id, profile=profile, spec=spec)])
    book.settled(spec.shard_id, refused=False)


@pytest.fixture(name="placements")
async def placements_fixture(tmp_path: Path) -> AsyncIterator[PlacementBook]:
    store, book = await open_book(tmp_path / "placements")
    try:
        yield book
    finally:
        await store.close()
